"""The echo engine: streams a fixed token pattern at no cost.

It exists to measure and test the HTTP path in isolation (gateway overhead per request and per
streamed token).  It is never a default and is served only when configured explicitly.
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
            n = self._max_tokens
            for i in range(n):
                if self._cancelled:
                    yield GenerationDelta(
                        finish_reason="abort", usage=Usage(self._prompt_tokens, i)
                    )
                    return
                text, stopped = stop.feed(_PIECES[i % len(_PIECES)])
                if stopped or i == n - 1:
                    yield GenerationDelta(
                        text=text if stopped else text + stop.flush(),
                        n_tokens=1,
                        finish_reason="stop" if stopped else "length",
                        usage=Usage(self._prompt_tokens, i + 1),
                    )
                    return
                yield GenerationDelta(text=text, n_tokens=1)
                await asyncio.sleep(0)  # a token boundary, as a real engine has
        finally:
            engine.running -= 1


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
