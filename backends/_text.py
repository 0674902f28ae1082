"""Incremental text assembly shared by engines: UTF-8-safe detokenisation and stop strings."""

from __future__ import annotations

import codecs
from collections.abc import Sequence

__all__ = ["StopMatcher", "Utf8Stream"]


class Utf8Stream:
    """Turns token byte pieces into text, holding back incomplete UTF-8 sequences."""

    __slots__ = ("_decoder",)

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, piece: bytes) -> str:
        return self._decoder.decode(piece, False)

    def flush(self) -> str:
        return self._decoder.decode(b"", True)


class StopMatcher:
    """Finds stop strings across token boundaries; text that might begin one is held back.

    `feed` returns (text safe to emit, stopped).  Once stopped, the stop string and anything after
    it are dropped, as the OpenAI API specifies.
    """

    __slots__ = ("_pending", "_stops")

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        if not self._stops:
            return text, False
        buf = self._pending + text
        cut = -1
        for stop in self._stops:
            i = buf.find(stop)
            if i >= 0 and (cut < 0 or i < cut):
                cut = i
        if cut >= 0:
            self._pending = ""
            return buf[:cut], True
        hold = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(buf)), hold, -1):
                if buf.endswith(stop[:n]):
                    hold = n
                    break
        self._pending = buf[len(buf) - hold :] if hold else ""
        return (buf[: len(buf) - hold] if hold else buf), False

    def flush(self) -> str:
        """Held-back text, released when generation ends without a stop."""
        text, self._pending = self._pending, ""
        return text
