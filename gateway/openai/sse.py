"""Server-sent events as OpenAI streams them: `data: {chunk}\n\n` ... `data: [DONE]\n\n`."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from ..errors import GatewayError, error_body

__all__ = ["SSE_DONE", "SSE_HEADERS", "TextFrame", "sse", "sse_error"]

SSE_DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_encode = msgspec.json.Encoder().encode


def sse(payload: msgspec.Struct) -> bytes:
    return b"data: " + _encode(payload) + b"\n\n"


_SLOT = "\x00"  # a text no token carries as such: msgspec writes it as "\u0000"


class TextFrame:
    """The SSE frame of a chunk that only carries text, pre-encoded around the text.

    Built once per stream from the chunk struct itself (`make(_SLOT)`), so a token's frame is
    byte for byte what `sse(make(text))` gives, at the cost of encoding the text alone: no
    struct, list or envelope is built or encoded per token."""

    __slots__ = ("_head", "_tail")

    def __init__(self, make: Callable[[str], msgspec.Struct]) -> None:
        frame = sse(make(_SLOT))
        head, found, tail = frame.partition(_encode(_SLOT))
        if not found or _encode(_SLOT) in tail:
            raise ValueError("the chunk must carry the text exactly once")
        self._head, self._tail = head, tail

    def __call__(self, text: str) -> bytes:
        return self._head + _encode(text) + self._tail


def sse_error(error: GatewayError) -> bytes:
    """The one event that ends a stream that failed after it began."""
    return b"data: " + error_body(error) + b"\n\n"
