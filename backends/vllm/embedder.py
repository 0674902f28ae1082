"""The vLLM embedder: `AsyncLLM` with the pooling runner behind the `Engine` protocol.

One `embed()` call hands every input to vLLM at once, one pooling request each (vLLM's
scheduler batches them, up to `max_num_seqs` a step), and returns when all are pooled.
Inputs are tokenised here (text as plain text: `[SEP]` typed by a client stays characters) and
checked before anything is computed: a token id outside the vocabulary or an input longer than
the context refuses the whole call, naming the input.  vLLM normalises the pooled vectors; they
are normalised again here in float32, so that the contract holds whatever the pooler config.

`dimensions` keeps the first components and re-normalises, only for a model trained for it
(Matryoshka: `matryoshka_dimensions` or `is_matryoshka` in its config, vLLM's own test); any
other model takes only its full size.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import (
    ContextLengthExceeded,
    EngineError,
    EngineFailure,
    EngineNotReady,
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
from ._load import SchedulerSnapshot, admit, split_load
from ._options import VllmOptions
from ._start import abort_request, build_llm, opened, start_llm, stop_llm
from ._tokenizer import Tokenizer

__all__ = ["VllmEmbedder"]

_log = logging.getLogger("airgate.vllm")

Vector = npt.NDArray[np.float32]


class VllmEmbedder:
    """vLLM's pooling runner in this process (engine core in a child process it owns).

    `weights` is a directory of safetensors weights, config and tokenizer (sentence-transformers
    layout included: vLLM reads its pooling and normalisation modules), or a `ModelSource`
    released once the model and tokenizer are loaded.  Of `VllmOptions`, `chat_template` and
    `enable_prefix_caching` do not apply (vLLM decides prefix caching per pooling model).
    """

    name = "vllm"
    task: Task = "embed"

    def __init__(self, weights: str | ModelSource, options: VllmOptions | None = None) -> None:
        self._source = weights
        self.options = options or VllmOptions()
        self._llm: Any = None  # vllm AsyncLLM
        self._tokenizer: Tokenizer | None = None
        self._snapshot = SchedulerSnapshot()
        self._context_length = self.options.max_model_len or 0
        self._vocab = 0
        self._size = 0
        # None: not truncatable; empty: any size from 1 to the full one; else the sizes allowed
        self._matryoshka: tuple[int, ...] | None = None
        self._open: weakref.WeakSet[Any] = weakref.WeakSet()  # vLLM output collectors
        self._mean_duration_s = 0.5  # EMA of call time, for Retry-After

    @property
    def context_length(self) -> int:
        return self._context_length

    @property
    def embedding_size(self) -> int | None:
        return self._size or None

    @property
    def truncatable(self) -> bool:
        return self._matryoshka is not None

    async def start(self) -> None:
        """Load the model; returns when the engine core is ready to embed."""
        if self._llm is not None:
            return
        started = time.monotonic()
        llm = await start_llm(self._load)
        self._llm = llm
        self._context_length = int(llm.model_config.max_model_len)
        self._vocab = int(llm.model_config.get_vocab_size())
        _log.info(
            "vLLM embedder ready in %.1f s: %d dimensions, inputs up to %d tokens",
            time.monotonic() - started,
            self._size,
            self._context_length,
        )

    def _load(self) -> Any:
        with opened(self._source) as directory:
            tokenizer = Tokenizer.load(directory)
            # Prefix caching as vLLM decides per model: off for encoders (forced on for BERT,
            # the engine core fails to start: no cacheable KV-cache group).
            llm = build_llm(
                directory,
                self.options,
                self._snapshot,
                runner="pooling",
                convert="auto",
                enable_prefix_caching=None,
            )
            try:
                # Read while the directory exists: vLLM finds a projection's size in its files.
                config = llm.model_config
                self._size = int(config.embedding_size)
                if config.is_matryoshka:
                    self._matryoshka = tuple(int(d) for d in config.matryoshka_dimensions or ())
            except BaseException:
                llm.shutdown()
                raise
        self._tokenizer = tokenizer
        return llm

    async def stop(self) -> None:
        """Shut the engine down: calls still embedding end with EngineNotReady."""
        llm, self._llm = self._llm, None
        if llm is None:
            return
        for collector in list(self._open):
            pending = collector.output
            if not getattr(pending, "finished", False):
                collector.put(EngineNotReady("the engine stopped"))
        await stop_llm(llm)

    def load(self) -> EngineLoad:
        """Inputs being embedded, as `VllmEngine.load` counts requests (one per input)."""
        opts = self.options
        llm = self._llm
        if llm is None:
            return EngineLoad(0, 0, opts.max_num_seqs, opts.max_waiting, 0.0)
        in_flight = llm.get_num_unfinished_requests()
        running, waiting = split_load(in_flight, opts.max_num_seqs, self._snapshot.waiting)
        return EngineLoad(
            running, waiting, opts.max_num_seqs, opts.max_waiting, self._snapshot.kv_usage
        )

    async def submit(self, request: GenerationRequest) -> GenerationHandle:
        raise InvalidGenerationRequest("this model embeds; it does not generate text")

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult:
        llm = self._llm
        if llm is None:
            raise EngineNotReady("the engine is not started")
        size = self._check_dimensions(request.dimensions)
        if sum(len(i) for i in request.inputs if isinstance(i, str)) > 2048:
            inputs = await asyncio.to_thread(self.tokenize_inputs, request)
        else:
            inputs = self.tokenize_inputs(request)
        opts = self.options
        admit(
            llm.get_num_unfinished_requests(),
            len(inputs),
            capacity=opts.max_num_seqs,
            max_waiting=opts.max_waiting,
            mean_duration_s=self._mean_duration_s,
        )
        started = time.monotonic()
        vectors = np.empty((len(inputs), size), dtype=np.float32)
        pooled = await self._pool(llm, request, inputs)
        for row, vector in enumerate(pooled):
            vectors[row] = _normalised(vector[:size])
        self._mean_duration_s = 0.9 * self._mean_duration_s + 0.1 * (time.monotonic() - started)
        return EmbeddingResult(vectors, tuple(len(ids) for ids in inputs))

    def tokenize_inputs(self, request: EmbeddingRequest) -> list[list[int]]:
        """Every input's token ids, checked against the vocabulary and the context.  Thread-safe."""
        tok = self._tokenizer
        if tok is None or self._llm is None:
            raise EngineNotReady("the engine is not started")
        out: list[list[int]] = []
        for index, item in enumerate(request.inputs):
            if isinstance(item, str):
                ids = tok.encode_input(item)
            else:
                ids = list(item)
                bad = sum(1 for t in ids if not 0 <= t < self._vocab)
                if bad:
                    raise InvalidGenerationRequest(
                        f"input[{index}] holds {bad} token ids outside [0, {self._vocab})",
                        param="input",
                    )
            if not ids:
                raise InvalidGenerationRequest(f"input[{index}] is empty", param="input")
            if len(ids) > self._context_length:
                raise ContextLengthExceeded(
                    prompt_tokens=len(ids),
                    max_tokens=0,
                    context_length=self._context_length,
                    index=index,
                )
            out.append(ids)
        return out

    def _check_dimensions(self, dimensions: int | None) -> int:
        """The length of the vectors to return, or InvalidGenerationRequest."""
        if dimensions is None or dimensions == self._size:
            return self._size
        allowed = self._matryoshka
        if allowed is None:
            raise InvalidGenerationRequest(
                f"this model's vectors cannot be shortened: dimensions must be {self._size}",
                param="dimensions",
            )
        if not 1 <= dimensions <= self._size or (allowed and dimensions not in allowed):
            sizes = ", ".join(map(str, allowed)) if allowed else f"1 to {self._size}"
            raise InvalidGenerationRequest(f"dimensions must be one of {sizes}", param="dimensions")
        return dimensions

    async def _pool(
        self, llm: Any, request: EmbeddingRequest, inputs: list[list[int]]
    ) -> list[Vector]:
        """Every input's pooled vector, computed concurrently; the first failure (or the
        caller's cancellation) aborts the rest.  vLLM's errors become ours."""
        from vllm.exceptions import VLLMValidationError
        from vllm.pooling_params import PoolingParams
        from vllm.v1.engine.exceptions import EngineDeadError

        params = PoolingParams(task="embed")
        tasks = [
            asyncio.ensure_future(
                self._one(llm, f"{request.request_id}-{i}", ids, params, request.priority)
            )
            for i, ids in enumerate(inputs)
        ]
        try:
            return await asyncio.gather(*tasks)
        except BaseException as exc:
            for task in tasks:
                if not task.cancelling():  # a second cancel would interrupt its abort
                    task.cancel()
            await asyncio.wait(tasks)  # every abort has reached vLLM
            if isinstance(exc, EngineError | asyncio.CancelledError):
                raise
            if isinstance(exc, VLLMValidationError):
                message = str(exc.args[0]) if exc.args else "invalid input"
                raise InvalidGenerationRequest(
                    f"the vLLM engine rejected the input: {message}", param="input"
                ) from exc
            if isinstance(exc, EngineDeadError):
                raise EngineFailure("the vLLM engine is not running") from exc
            if isinstance(exc, Exception):
                raise EngineFailure(
                    f"the vLLM engine failed while embedding ({type(exc).__name__})"
                ) from exc
            raise

    async def _one(
        self, llm: Any, request_id: str, ids: list[int], params: Any, priority: int
    ) -> Vector:
        """One input's pooled vector (float32, as vLLM's pooler left it).  vLLM clones
        `params` per request."""
        from vllm.inputs import tokens_input

        collector = await llm.add_request(request_id, tokens_input(ids), params, priority=priority)
        self._open.add(collector)
        try:
            while True:
                output = collector.get_nowait() or await collector.get()
                if output.finished:
                    break
        except asyncio.CancelledError:
            await abort_request(llm, collector.request_id)
            raise
        finally:
            self._open.discard(collector)
        if output.error is not None:
            raise EngineFailure("the vLLM engine failed to embed an input")
        data = output.outputs.data
        vector: Vector = np.asarray(data.float().cpu().numpy(), dtype=np.float32).reshape(-1)
        if vector.shape[0] < self._size:  # an aborted request has no vector
            raise EngineFailure("the vLLM engine returned no vector for an input")
        return vector


def _normalised(vector: Vector) -> Vector:
    norm = float(np.linalg.norm(vector))
    out: Vector = (vector / norm if norm > 0.0 else vector).astype(np.float32, copy=False)
    return out
