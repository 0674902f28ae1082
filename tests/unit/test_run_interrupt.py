"""`airgate run`'s Ctrl-C while an answer streams is never lost.  Python drops an exception
raised in a finalizer ("Exception ignored in ..."), and a signal's handler runs in whatever code
is executing, so a SIGINT that lands while the garbage collector finalizes an object would
otherwise vanish: the answer would run on and the stopped turn would join the history.

Here the SIGINT is raised inside a finalizer on purpose, between two lines of a stream: the
session stops at the next line and keeps nothing of the turn.  The client is a stand-in that
hands over lines (the HTTP path is `tests/e2e/test_run_cli.py`'s, against a real server).
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.cli.chat_session import Session


def _tick() -> None:
    """A Python call: where the interpreter runs pending signal handlers."""


class _SignalsWhenFinalized:
    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        _tick()  # the handler runs here, in the finalizer: its KeyboardInterrupt is dropped


class _LinesClient:
    """A stand-in for the Ollama client: the lines of one streamed answer."""

    def __init__(self, pieces: list[str], finalize_after: int | None = None) -> None:
        self.pieces = pieces
        self.finalize_after = finalize_after
        self.sent = 0

    @contextlib.contextmanager
    def chat(
        self, model: str, messages: list[dict[str, str]], options: dict[str, Any]
    ) -> Iterator[Iterator[dict[str, Any]]]:
        yield self._lines()

    def _lines(self) -> Iterator[dict[str, Any]]:
        for i, piece in enumerate(self.pieces):
            if i == self.finalize_after:
                _SignalsWhenFinalized()  # finalized at once: the signal lands in __del__
                gc.collect()
            self.sent += 1
            yield {"message": {"content": piece}, "done": False}
        yield {"message": {"content": ""}, "done": True}


@pytest.fixture
def sigint() -> Iterator[None]:
    """SIGINT handled as in a terminal (a test run in the background may have it ignored)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def test_an_interrupt_dropped_in_a_finalizer_still_stops_the_answer(
    monkeypatch: pytest.MonkeyPatch, sigint: None
) -> None:
    dropped: list[type[BaseException] | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: dropped.append(u.exc_type))
    client = _LinesClient([f" tok{i}" for i in range(100)], finalize_after=3)
    out = io.StringIO()
    session = Session(client, "m", out)  # type: ignore[arg-type]
    with pytest.raises(KeyboardInterrupt):
        session.ask("a long answer, please")
    assert dropped == [KeyboardInterrupt]  # Python dropped it, as it does in a finalizer
    assert client.sent == 4  # the line after the signal, then no more
    assert out.getvalue() == " tok0 tok1 tok2"
    assert session.messages == []  # the stopped turn is not kept
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_an_answer_left_alone_joins_the_history() -> None:
    client = _LinesClient([" a", " b"])
    session = Session(client, "m", io.StringIO())  # type: ignore[arg-type]
    session.ask("hi")
    assert session.messages == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": " a b"},
    ]


def test_an_ignored_sigint_stays_ignored() -> None:
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in a job run in the background
    try:
        session = Session(_LinesClient([" a"]), "m", io.StringIO())  # type: ignore[arg-type]
        session.ask("hi")
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert len(session.messages) == 2
    finally:
        signal.signal(signal.SIGINT, before)
