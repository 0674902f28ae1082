"""The echo engine: streams a fixed token pattern at no cost.

It exists to measure and test the HTTP path in isolation (gateway overhead per request and per
streamed token).  It is never a default and is served only when configured explicitly.

A request with an output constraint (structured output, tool calls) gets the text of its last
user message back, in pieces of a few characters: tests of the HTTP path write the answer a
constrained model would give and watch how the gateway carries it.  Nothing is checked against
the constraint here: the real engines enforce it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from ._text import StopMatcher
from .budget import completion_budget
from .errors import EngineNotReady
from .types import EngineLoad, GenerationDelta, GenerationRequest, Usage

__all__ = ["EchoEngine"]

_PIECES = tuple(f" tok{i}" for i in range(16))


class _EchoHandle:
    __slots__ = ("_cancelled", "_engine", "_max_tokens", "_prompt_tokens", "_request")

    def __init__(
        self, engine: EchoEngine, request: GenerationRequest, prompt_tokens: int, max_tokens: int
    ) -> None:
        self._engine = engine
        self._request = request
        self._prompt_tokens = prompt_tokens
        self._max_tokens = max_tokens
        self._cancelled = False

    @property
    def prompt_tokens(self) -> int:
        return self._prompt_tokens

    def cancel(self) -> None:
        self._cancelled = True

    async def __aiter__(self) -> AsyncIterator[GenerationDelta]:
        engine = self._engine
        engine.running += 1
        try:
            stop = StopMatcher(self._request.stop)
            script = _script(self._request)
            pieces = script or _PIECES
            n = min(self._max_tokens, len(script)) if script else self._max_tokens
            for i in range(n):
                if self._cancelled:
                    yield GenerationDelta(
                        finish_reason="abort", usage=Usage(self._prompt_tokens, i)
                    )
                    return
                text, stopped = stop.feed(pieces[i % len(pieces)])
                if stopped or i == n - 1:
                    done = stopped or (script is not None and n == len(script))
                    yield GenerationDelta(
                        text=text if stopped else text + stop.flush(),
                        n_tokens=1,
                        finish_reason="stop" if done else "length",
                        usage=Usage(self._prompt_tokens, i + 1),
                    )
                    return
                yield GenerationDelta(text=text, n_tokens=1)
                await asyncio.sleep(0)  # a token boundary, as a real engine has
        finally:
            engine.running -= 1


def _script(request: GenerationRequest) -> tuple[str, ...] | None:
    """A constrained request's answer: its last user message, in pieces of 4 characters."""
    if request.constraint is None or not request.messages:
        return None
    text = next((m.content for m in reversed(request.messages) if m.role == "user"), "")
    return tuple(text[i : i + 4] for i in range(0, len(text), 4)) or ("",)


class EchoEngine:
    name = "echo"

    def __init__(self, *, context_length: int = 4096) -> None:
        self._context_length = context_length
        self._started = False
        self.running = 0

    @property
    def context_length(self) -> int:
        return self._context_length

    async def start(self) -> None:
        self._started = True

    async def stop(self) -> None:
        self._started = False

    def load(self) -> EngineLoad:
        return EngineLoad(self.running, 0, 1 << 20, 0, 0.0)

    async def submit(self, request: GenerationRequest) -> _EchoHandle:
        if not self._started:
            raise EngineNotReady("the engine is not started")
        if request.messages is not None:
            size = sum(len(m.content) for m in request.messages)
        elif request.prompt_tokens is not None:
            size = 4 * len(request.prompt_tokens)
        else:
            size = len(request.prompt or "")
        prompt_tokens = 1 + size // 4  # a stand-in count: no tokenizer here
        max_tokens = completion_budget(
            request, prompt_tokens=prompt_tokens, context_length=self._context_length, default=16
        )
        return _EchoHandle(self, request, prompt_tokens, max_tokens)
