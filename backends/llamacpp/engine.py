"""The llama.cpp engine: GGUF models on CPUs with continuous batching (see `_scheduler`)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from ..budget import completion_budget
from ..chat_template import ChatTemplate
from ..errors import EngineNotReady, InvalidGenerationRequest
from ..types import (
    EmbeddingRequest,
    EmbeddingResult,
    EngineLoad,
    GenerationDelta,
    GenerationRequest,
    ModelSource,
    Task,
)
from ._grammar import GrammarCache
from ._job import Job
from ._native import Context, Model, open_model
from ._sampler import free_sampler
from ._scheduler import Scheduler

__all__ = ["LlamaCppEngine", "LlamaCppOptions", "available_cores"]

_log = logging.getLogger("airgate.llamacpp")


def available_cores() -> int:
    """Cores this process may run on (affinity and cgroup-aware enough for containers)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


class LlamaCppOptions(msgspec.Struct, frozen=True, kw_only=True):
    # sequences decoding at once; a request with n choices holds min(n, slots) of them (more
    # choices run in waves, see `_scheduler`), so n > 1 needs at least 2 slots
    slots: int = 4
    context_length: int = 4096  # tokens per slot (prompt + completion)
    batch_size: int = 512  # tokens per decode step; bounds how long a prefill chunk stalls others
    max_waiting: int = 64
    n_threads: int | None = None  # None: every core available to the process
    chat_template: str = "gemma"
    # Results independent of the load at any slot count (always true up to 7 slots); above 7
    # it costs about a third of the aggregate throughput at 8 streams (BENCHMARKS.md).
    batch_invariant: bool = False
    grammar_budget_s: float = 5.0  # compile time allowed for one output schema's grammar


class _Handle:
    """Deltas of every choice, as they come; ends after each choice's final delta."""

    __slots__ = ("_job", "_scheduler")

    def __init__(self, scheduler: Scheduler, job: Job) -> None:
        self._scheduler = scheduler
        self._job = job

    @property
    def prompt_tokens(self) -> int:
        return len(self._job.prompt)

    async def __aiter__(self) -> AsyncIterator[GenerationDelta]:
        left = self._job.n
        while True:
            item = await self._job.out.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.finish_reason is not None:
                left -= 1
                if not left:
                    return

    def cancel(self) -> None:
        """Abort every choice; each still running ends with an `abort` delta."""
        if not self._job.finished:
            self._scheduler.cancel(self._job)


class LlamaCppEngine:
    """llama.cpp in this process.

    `model` is a GGUF file path, an open file descriptor (read through `/proc/self/fd/N`), or a
    `ModelSource` (a decrypted bundle in a sealed memfd) opened when the engine loads and
    released right after: plaintext weights never need a path on persistent disk.
    """

    name = "llama.cpp"
    task: Task = "generate"

    def __init__(
        self, model: str | int | ModelSource, options: LlamaCppOptions | None = None
    ) -> None:
        self._source = f"/proc/self/fd/{model}" if isinstance(model, int) else model
        self.options = options or LlamaCppOptions()
        self._template = ChatTemplate(self.options.chat_template)
        self._model: Model | None = None
        self._ctx: Context | None = None
        self._scheduler: Scheduler | None = None
        self.grammars: GrammarCache | None = None
        self.n_threads = self.options.n_threads or available_cores()

    @property
    def context_length(self) -> int:
        return self._ctx.n_ctx_seq if self._ctx else self.options.context_length

    @property
    def embedding_size(self) -> int | None:
        return None  # a generating engine (embeddings: `LlamaCppEmbedder`)

    @property
    def truncatable(self) -> bool:
        return False

    @property
    def decoded_tokens(self) -> int:
        """Tokens run through llama_decode since start, prompts included: a prompt shared by
        n choices counts once."""
        return self._scheduler.decoded_tokens if self._scheduler is not None else 0

    async def start(self) -> None:
        opts = self.options
        await asyncio.to_thread(self._load)
        assert self._ctx is not None and self._model is not None
        self.grammars = GrammarCache(self._model, budget_s=opts.grammar_budget_s)
        self._scheduler = Scheduler(
            self._ctx,
            n_slots=opts.slots,
            max_waiting=opts.max_waiting,
            loop=asyncio.get_running_loop(),
            batch_invariant=opts.batch_invariant,
        )
        self._scheduler.start()
        _log.info(
            "llama.cpp engine ready: %d slots x %d tokens, batch %d, %d threads",
            opts.slots,
            self._ctx.n_ctx_seq,
            self._ctx.n_batch,
            self.n_threads,
        )

    def _load(self) -> None:
        opts = self.options
        self._model = open_model(self._source)
        self._ctx = Context(
            self._model,
            n_seq=opts.slots,
            n_ctx_seq=opts.context_length,
            n_batch=opts.batch_size,
            n_threads=self.n_threads,
        )

    async def stop(self) -> None:
        if self._scheduler is not None:
            await asyncio.to_thread(self._scheduler.stop)
            self._scheduler = None
        if self.grammars is not None:
            await asyncio.to_thread(self.grammars.close)
            self.grammars = None
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None
        if self._model is not None:
            self._model.close()
            self._model = None

    def load(self) -> EngineLoad:
        opts = self.options
        if self._scheduler is None:
            return EngineLoad(0, 0, opts.slots, opts.max_waiting, 0.0)
        running, waiting = self._scheduler.counts()
        total = opts.slots * self.context_length
        return EngineLoad(
            running, waiting, opts.slots, opts.max_waiting, self._scheduler.kv_tokens / total
        )

    def tokenize_prompt(self, request: GenerationRequest) -> tuple[list[int], str | None]:
        """The request's prompt tokens (and its text, for echo).  Thread-safe."""
        model = self._model
        if model is None:
            raise EngineNotReady("the engine is not started")
        if any(not 0 <= tok < model.n_vocab for tok, _ in request.sampling.logit_bias):
            raise InvalidGenerationRequest(
                f"logit_bias token ids must be in [0, {model.n_vocab})", param="logit_bias"
            )
        if request.messages is not None:
            tokens: list[int] = []
            for part, is_content in self._template.render(request.messages, request.tools):
                tokens += model.tokenize(part, add_special=False, parse_special=not is_content)
            return tokens, None
        if request.prompt_tokens is not None:
            bad = [t for t in request.prompt_tokens if not 0 <= t < model.n_vocab]
            if bad:
                raise InvalidGenerationRequest(
                    f"prompt token ids must be in [0, {model.n_vocab}); got {len(bad)} outside",
                    param="prompt",
                )
            text: str | None = None
            if request.echo_prompt:
                text = b"".join(model.piece(t) for t in request.prompt_tokens).decode(
                    "utf-8", "replace"
                )
            return list(request.prompt_tokens), text
        prompt = request.prompt or ""
        tokens = model.tokenize(prompt, add_special=True, parse_special=request.parse_special)
        return tokens, prompt

    async def submit(self, request: GenerationRequest) -> _Handle:
        scheduler = self._scheduler
        if scheduler is None:
            raise EngineNotReady("the engine is not started")
        # Tokenising a long prompt takes milliseconds: keep it off the event loop.
        if _prompt_size(request) > 2048:
            tokens, prompt_text = await asyncio.to_thread(self.tokenize_prompt, request)
        else:
            tokens, prompt_text = self.tokenize_prompt(request)
        if not tokens:
            raise InvalidGenerationRequest("the prompt is empty", param="prompt")
        if request.n < 1 or (request.n > 1 and self.options.slots < 2):
            raise InvalidGenerationRequest(
                f"n must be 1 on this deployment ({self.options.slots} slot)"
                if request.n > 1
                else "n must be at least 1",
                param="n",
            )
        n_ctx = self.context_length
        # every choice has its own sequence of n_ctx tokens: the budget is n = 1's
        max_tokens = completion_budget(request, prompt_tokens=len(tokens), context_length=n_ctx)
        grammars = await self._grammars(request)
        job = Job(
            prompt=tokens,
            n=request.n,
            max_tokens=max_tokens,
            stop=request.stop,
            params=request.sampling,
            logprobs=request.logprobs,
            echo_prompt=request.echo_prompt,
            prompt_text=prompt_text,
            out=asyncio.Queue(),
            grammars=grammars,
        )
        try:
            scheduler.submit(job)
        except BaseException:
            job.drop_grammars()
            raise
        return _Handle(scheduler, job)

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult:
        raise InvalidGenerationRequest("this model generates text; it does not embed")

    async def _grammars(self, request: GenerationRequest) -> list[Any]:
        """One grammar sampler per choice (compiled once, cloned per choice)."""
        if request.constraint is None or self.grammars is None:
            return []
        grammars: list[Any] = []
        try:
            for _ in range(request.n):
                grammars.append(await self.grammars.sampler(request.constraint))
        except BaseException:
            for grammar in grammars:
                free_sampler(grammar)
            raise
        return grammars


def _prompt_size(request: GenerationRequest) -> int:
    if request.messages is not None:
        return sum(len(m.content) for m in request.messages)
    if request.prompt_tokens is not None:
        return len(request.prompt_tokens)
    return len(request.prompt or "")
