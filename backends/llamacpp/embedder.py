"""The llama.cpp embedding engine: GGUF encoders (BERT, ...) with inputs packed across requests.

One worker thread owns the context.  Requests queue as jobs (lower `priority` first, then in
arrival order); each `llama_decode` takes whole inputs from the head of the queue, one sequence
id per input, until the batch's tokens or sequences run out, so a request of many short inputs
and several concurrent requests share decodes.  The model's pooling (mean for MiniLM) happens
in llama.cpp; the vectors are L2-normalised here.

Everything a request can get wrong (an input over the context, a token id outside the
vocabulary) is refused before its job is queued: nothing is computed for a refused request.
Text is tokenised as plain text with the model's special tokens added ([CLS] ... [SEP]), and
special-token text inside it is not parsed; token-id inputs are taken as they are.

On CPUs the cost is per token, so packing saves the per-decode overhead, not the arithmetic:
for short sentences (~12 tokens, all-MiniLM-L6-v2 f32, 2 shared cores) 16 inputs per decode gave
1.2-2.5x the inputs/s of one at a time; larger batches gained nothing more (a non-causal
decode's attention grows with the square of its tokens), hence 512 tokens / 16 inputs.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Sequence

import msgspec
import numpy as np
import numpy.typing as npt

from ..errors import (
    ContextLengthExceeded,
    EngineFailure,
    EngineNotReady,
    EngineOverloaded,
    InvalidGenerationRequest,
)
from ..types import (
    EmbeddingRequest,
    EmbeddingResult,
    EngineLoad,
    GenerationHandle,
    GenerationRequest,
    ModelSource,
    Task,
)
from ._native import Batch, EmbeddingContext, Model, open_model
from .engine import available_cores

__all__ = ["LlamaCppEmbedder", "LlamaCppEmbedderOptions"]

_log = logging.getLogger("airgate.llamacpp")
_POOLING_NONE, _POOLING_RANK = 0, 4
_TOKENISE_OFF_LOOP = 8192  # characters: above this, tokenising leaves the event loop


class LlamaCppEmbedderOptions(msgspec.Struct, frozen=True, kw_only=True):
    context_length: int | None = None  # tokens per input; None: the model's trained context
    # Tokens per decode; an input never spans decodes, so this also caps `context_length`.
    batch_size: int = 512
    # Inputs per decode: a power of two dividing batch_size (llama.cpp aborts otherwise).
    sequences: int = 16
    max_waiting: int = 64  # requests queued beyond `sequences` running ones
    n_threads: int | None = None  # None: every core available to the process
    truncatable: bool = False  # Matryoshka-trained: a prefix of a vector keeps its meaning

    def __post_init__(self) -> None:
        n = self.sequences
        if n < 1 or n & (n - 1) or self.batch_size % n:
            raise ValueError("sequences must be a power of two that divides batch_size")


class _Job:
    __slots__ = (
        "cancelled",
        "future",
        "left",
        "loop",
        "next",
        "order",
        "priority",
        "started",
        "t0",
        "tokens",
        "vectors",
    )

    def __init__(
        self,
        tokens: list[list[int]],
        n_embd: int,
        priority: int,
        order: int,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.tokens = tokens
        self.vectors = np.empty((len(tokens), n_embd), dtype=np.float32)
        self.next = 0  # the next input to put in a decode
        self.left = len(tokens)  # inputs not embedded yet
        self.priority = priority
        self.order = order
        self.loop = loop
        self.future: asyncio.Future[npt.NDArray[np.float32]] = loop.create_future()
        self.cancelled = False
        self.started = False
        self.t0 = time.monotonic()

    @property
    def key(self) -> tuple[int, int]:
        return (self.priority, self.order)

    def resolve(self, outcome: npt.NDArray[np.float32] | BaseException) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
            self.loop.call_soon_threadsafe(_settle, self.future, outcome)


def _settle(
    future: asyncio.Future[npt.NDArray[np.float32]],
    outcome: npt.NDArray[np.float32] | BaseException,
) -> None:
    if future.done():  # the caller went away
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


class LlamaCppEmbedder:
    """llama.cpp embedding a GGUF encoder in this process (see the module docstring).

    `model` is a GGUF path, an open file descriptor or a `ModelSource` (a decrypted bundle)
    released right after loading, as for `LlamaCppEngine`.
    """

    name = "llama.cpp"
    task: Task = "embed"

    def __init__(
        self, model: str | int | ModelSource, options: LlamaCppEmbedderOptions | None = None
    ) -> None:
        self._source = f"/proc/self/fd/{model}" if isinstance(model, int) else model
        self.options = options or LlamaCppEmbedderOptions()
        self.n_threads = self.options.n_threads or available_cores()
        self._model: Model | None = None
        self._ctx: EmbeddingContext | None = None
        self._context_length = self.options.context_length or 0
        self._cv = threading.Condition()
        self._jobs: list[_Job] = []  # sorted by (priority, arrival)
        self._order = itertools.count()
        self._running = 0  # jobs with inputs decoded or in a decode
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._mean_duration_s = 0.1  # EMA of a request's time, for Retry-After
        self.decodes = 0  # llama_decode calls so far (how well inputs were packed)

    # ---- Engine protocol ------------------------------------------------------------------

    @property
    def context_length(self) -> int:
        return self._context_length

    @property
    def embedding_size(self) -> int | None:
        return self._ctx.n_embd if self._ctx is not None else None

    @property
    def truncatable(self) -> bool:
        return self.options.truncatable

    async def start(self) -> None:
        await asyncio.to_thread(self._load)
        assert self._ctx is not None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="airgate-embed", daemon=True)
        self._thread.start()
        _log.info(
            "llama.cpp embedder ready: %d-wide vectors, %d tokens per input, %d inputs / %d "
            "tokens per decode, %d threads",
            self._ctx.n_embd,
            self._context_length,
            self._ctx.n_seq,
            self._ctx.n_batch,
            self.n_threads,
        )

    def _load(self) -> None:
        opts = self.options
        model = open_model(self._source)
        try:
            ctx = EmbeddingContext(
                model, n_seq=opts.sequences, n_batch=opts.batch_size, n_threads=self.n_threads
            )
        except BaseException:
            model.close()
            raise
        if ctx.pooling in (_POOLING_NONE, _POOLING_RANK):
            ctx.close()
            model.close()
            raise EngineFailure("the model does not pool its outputs: it is not an embedder")
        self._model, self._ctx = model, ctx
        wanted = opts.context_length or model.n_ctx_train
        self._context_length = min(wanted, model.n_ctx_train, ctx.n_batch)

    async def stop(self) -> None:
        thread = self._thread
        if thread is not None:
            with self._cv:
                self._stopping = True
                self._cv.notify()
            await asyncio.to_thread(thread.join)
            self._thread = None
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None
        if self._model is not None:
            self._model.close()
            self._model = None

    def load(self) -> EngineLoad:
        with self._cv:
            running = self._running
            waiting = len(self._jobs) - running
        return EngineLoad(running, waiting, self.options.sequences, self.options.max_waiting, 0.0)

    async def submit(self, request: GenerationRequest) -> GenerationHandle:
        raise InvalidGenerationRequest("this model embeds; it does not generate text")

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult:
        model, ctx = self._model, self._ctx
        if model is None or ctx is None or self._thread is None:
            raise EngineNotReady("the engine is not started")
        n_embd = ctx.n_embd
        if request.dimensions is not None:
            if not self.truncatable:
                raise InvalidGenerationRequest(
                    "this model does not support shorter vectors (dimensions)", param="dimensions"
                )
            if not 1 <= request.dimensions <= n_embd:
                raise InvalidGenerationRequest(
                    f"dimensions must be between 1 and {n_embd}", param="dimensions"
                )
        if not request.inputs:
            raise InvalidGenerationRequest("there is no input to embed", param="input")
        size = sum(len(i) for i in request.inputs)
        if size > _TOKENISE_OFF_LOOP:
            tokens = await asyncio.to_thread(self._tokenize, model, request.inputs)
        else:
            tokens = self._tokenize(model, request.inputs)

        loop = asyncio.get_running_loop()
        job = _Job(tokens, n_embd, request.priority, next(self._order), loop)
        self._enqueue(job)
        try:
            vectors = await job.future
        except asyncio.CancelledError:
            job.cancelled = True  # the worker drops what it has not started
            raise
        if request.dimensions is not None and request.dimensions < n_embd:
            vectors = _normalised(np.ascontiguousarray(vectors[:, : request.dimensions]))
        return EmbeddingResult(vectors, tuple(len(t) for t in tokens))

    # ---- called from the event loop -------------------------------------------------------

    def _tokenize(self, model: Model, inputs: Sequence[str | tuple[int, ...]]) -> list[list[int]]:
        """Every input's tokens, refusing the request at its first bad input.  Thread-safe."""
        out: list[list[int]] = []
        for index, item in enumerate(inputs):
            if isinstance(item, str):
                tokens = model.tokenize(item, add_special=True, parse_special=False)
            else:
                tokens = list(item)
                if not tokens:
                    raise InvalidGenerationRequest(f"input[{index}] is empty", param="input")
                if any(not 0 <= t < model.n_vocab for t in tokens):
                    raise InvalidGenerationRequest(
                        f"input[{index}] holds a token id outside the vocabulary "
                        f"(0..{model.n_vocab - 1})",
                        param="input",
                    )
            if len(tokens) > self._context_length:
                raise ContextLengthExceeded(
                    prompt_tokens=len(tokens),
                    max_tokens=0,
                    context_length=self._context_length,
                    index=index,
                )
            out.append(tokens)
        return out

    def _enqueue(self, job: _Job) -> None:
        with self._cv:
            if self._stopping:
                raise EngineNotReady("the engine is shutting down")
            # as the router counts: `sequences` requests may run (share a decode), and
            # `max_waiting` more wait
            capacity = self.options.sequences
            if len(self._jobs) >= capacity + self.options.max_waiting:
                waiting = len(self._jobs) - self._running
                raise EngineOverloaded(
                    f"the engine is at capacity ({self._running} running, {waiting} waiting)",
                    retry_after_s=max(1.0, self._mean_duration_s * (waiting + 1) / capacity),
                )
            bisect.insort(self._jobs, job, key=lambda j: j.key)
            self._cv.notify()

    # ---- the worker thread ----------------------------------------------------------------

    def _run(self) -> None:
        assert self._ctx is not None
        ctx = self._ctx
        batch = Batch(ctx.n_batch, ctx.n_seq)
        try:
            while True:
                with self._cv:
                    while not self._stopping and not self._jobs:
                        self._cv.wait()
                    if self._stopping:
                        return
                    plan = self._plan(ctx)
                if plan:
                    self._step(ctx, batch, plan)
        except BaseException:
            _log.exception("the embedding worker failed; the engine stops")
        finally:
            batch.close()
            with self._cv:
                self._stopping = True
                jobs, self._jobs, self._running = self._jobs, [], 0
            for job in jobs:
                job.resolve(EngineNotReady("the engine is shutting down"))

    def _plan(self, ctx: EmbeddingContext) -> list[tuple[_Job, int]]:
        """Whole inputs from the head of the queue, as many as one decode holds (lock held)."""
        plan: list[tuple[_Job, int]] = []
        used = 0
        for job in list(self._jobs):
            if job.cancelled:
                self._drop(job)
                continue
            while job.next < len(job.tokens):
                n = len(job.tokens[job.next])
                if len(plan) == ctx.n_seq or used + n > ctx.n_batch:
                    return plan
                plan.append((job, job.next))
                used += n
                job.next += 1
                if not job.started:
                    job.started = True
                    self._running += 1
        return plan

    def _drop(self, job: _Job) -> None:
        self._jobs.remove(job)
        if job.started:
            self._running -= 1

    def _step(self, ctx: EmbeddingContext, batch: Batch, plan: list[tuple[_Job, int]]) -> None:
        batch.clear()
        for seq, (job, row) in enumerate(plan):
            batch.add(job.tokens[row], 0, seq, True)
        failure: EngineFailure | None = None
        self.decodes += 1
        if ctx.decode(batch) != 0:
            failure = EngineFailure("llama.cpp failed to embed the batch")
        done: list[_Job] = []
        for seq, (job, row) in enumerate(plan):
            if failure is None:
                job.vectors[row] = ctx.pooled(seq)
            job.left -= 1
            if job.left == 0 or failure is not None:
                done.append(job)
        with self._cv:
            for job in dict.fromkeys(done):
                if job in self._jobs:
                    self._drop(job)
                    elapsed = time.monotonic() - job.t0
                    self._mean_duration_s += 0.2 * (elapsed - self._mean_duration_s)
        for job in dict.fromkeys(done):
            job.resolve(failure if failure is not None else _normalised(job.vectors))


def _normalised(vectors: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    out: npt.NDArray[np.float32] = (vectors / np.maximum(norms, 1e-12)).astype(np.float32)
    return out
