"""The echo engine: streams a fixed token pattern at no cost.

It exists to measure and test the HTTP path in isolation (gateway overhead per request and per
streamed token).  It is never a default and is served only when configured explicitly.

A request with an output constraint (structured output, tool calls) gets the text of its last
user message back, in pieces of a few characters: tests of the HTTP path write the answer a
constrained model would give and watch how the gateway carries it.  Nothing is checked against
the constraint here: the real engines enforce it.

With `n > 1` the choices step together; choice j > 0 writes its pieces with a `c<j>` mark, so
that tests see which text went to which choice.  As an embedding engine (`task="embed"`) it
returns a stand-in vector per input, derived from a digest of the input: equal inputs get equal
vectors, nothing more (no meaning).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator

import numpy as np

from ._text import StopMatcher
from .budget import completion_budget
from .errors import ContextLengthExceeded, EngineNotReady, InvalidGenerationRequest
from .types import (
    EmbeddingRequest,
    EmbeddingResult,
    EngineLoad,
    GenerationDelta,
    GenerationRequest,
    Task,
    Usage,
)

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
            if self._request.n == 1:
                async for delta in self._choice(0):
                    yield delta
                return
            choices = [self._choice(j).__aiter__() for j in range(self._request.n)]
            while choices:  # the choices step together, one delta each per round
                for choice in list(choices):
                    try:
                        yield await anext(choice)
                    except StopAsyncIteration:
                        choices.remove(choice)
        finally:
            engine.running -= 1

    async def _choice(self, index: int) -> AsyncIterator[GenerationDelta]:
        stop = StopMatcher(self._request.stop)
        script = _script(self._request)
        pieces = script or (_PIECES if index == 0 else tuple(f" c{index}{p[1:]}" for p in _PIECES))
        n = min(self._max_tokens, len(script)) if script else self._max_tokens
        prompt_tokens = self._prompt_tokens if index == 0 else 0
        for i in range(n):
            if self._cancelled:
                yield GenerationDelta(
                    finish_reason="abort", usage=Usage(prompt_tokens, i), index=index
                )
                return
            text, stopped = stop.feed(pieces[i % len(pieces)])
            if stopped or i == n - 1:
                done = stopped or (script is not None and n == len(script))
                yield GenerationDelta(
                    text=text if stopped else text + stop.flush(),
                    n_tokens=1,
                    finish_reason="stop" if done else "length",
                    usage=Usage(prompt_tokens, i + 1),
                    index=index,
                )
                return
            yield GenerationDelta(text=text, n_tokens=1, index=index)
            await asyncio.sleep(0)  # a token boundary, as a real engine has


def _script(request: GenerationRequest) -> tuple[str, ...] | None:
    """A constrained request's answer: its last user message, in pieces of 4 characters."""
    if request.constraint is None or not request.messages:
        return None
    text = next((m.content for m in reversed(request.messages) if m.role == "user"), "")
    return tuple(text[i : i + 4] for i in range(0, len(text), 4)) or ("",)


_VOCAB = 32_000  # token ids an echo "model" knows
_EMBEDDING_SIZE = 32


class EchoEngine:
    name = "echo"

    def __init__(self, *, context_length: int = 4096, task: Task = "generate") -> None:
        self._context_length = context_length
        self.task: Task = task
        self._started = False
        self.running = 0

    @property
    def context_length(self) -> int:
        return self._context_length

    @property
    def embedding_size(self) -> int | None:
        return _EMBEDDING_SIZE if self.task == "embed" else None

    @property
    def truncatable(self) -> bool:
        return self.task == "embed"  # stand-in vectors: any prefix is as good as the whole

    async def start(self) -> None:
        self._started = True

    async def stop(self) -> None:
        self._started = False

    def load(self) -> EngineLoad:
        return EngineLoad(self.running, 0, 1 << 20, 0, 0.0)

    async def submit(self, request: GenerationRequest) -> _EchoHandle:
        if not self._started:
            raise EngineNotReady("the engine is not started")
        if self.task != "generate":
            raise InvalidGenerationRequest("this model embeds; it does not generate text")
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

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult:
        if not self._started:
            raise EngineNotReady("the engine is not started")
        if self.task != "embed":
            raise InvalidGenerationRequest("this model generates text; it does not embed")
        counts: list[int] = []
        for index, item in enumerate(request.inputs):
            if isinstance(item, str):
                count = 2 + len(item.encode()) // 4  # a stand-in count, with two special tokens
            else:
                if any(not 0 <= t < _VOCAB for t in item):
                    raise InvalidGenerationRequest(
                        f"input[{index}] holds a token id outside the vocabulary (0..{_VOCAB - 1})",
                        param="input",
                    )
                count = len(item)
            if count > self._context_length:
                raise ContextLengthExceeded(
                    prompt_tokens=count,
                    max_tokens=0,
                    context_length=self._context_length,
                    index=index,
                )
            counts.append(count)
        size = request.dimensions or _EMBEDDING_SIZE
        vectors = np.empty((len(request.inputs), size), dtype=np.float32)
        for row, item in enumerate(request.inputs):
            data = item.encode() if isinstance(item, str) else np.asarray(item, "<i8").tobytes()
            digest = hashlib.shake_128(data).digest(_EMBEDDING_SIZE)
            vector = np.frombuffer(digest, dtype=np.uint8)[:size].astype(np.float32) - 127.5
            vectors[row] = vector / np.linalg.norm(vector)
        return EmbeddingResult(vectors, tuple(counts))
