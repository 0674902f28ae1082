"""The vLLM engine: `vllm.v1.engine.async_llm.AsyncLLM` behind the `Engine` protocol.

vLLM is an optional extra: nothing here imports it (or torch) until `start()`.

The engine core always runs in a child process: `AsyncLLM` builds its client with
`make_async_mp_client` whatever `VLLM_ENABLE_V1_MULTIPROCESSING` says.  That variable (process-wide,
left to the operator) only decides where the model worker runs: in a process of its own under the
engine core (the default; vLLM's CPU platform wants it for OpenMP thread binding) or inside the
engine-core process (one process fewer, a faster start).  Prompts are tokenised in this process
with the model's tokenizer (message content can never become control tokens) and handed to vLLM
as token ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import time
import weakref
from typing import Any, Literal

import msgspec

from ..chat_template import ChatTemplate
from ..errors import (
    EngineError,
    EngineFailure,
    EngineNotReady,
    EngineOverloaded,
    InvalidGenerationRequest,
)
from ..types import EngineLoad, GenerationRequest, ModelSource
from ._handle import Handle, HandleContext
from ._load import SchedulerSnapshot, split_load, stat_logger_factory
from ._params import sampling_kwargs, structured_outputs
from ._processes import EngineProcesses
from ._tokenizer import Tokenizer

__all__ = ["VllmEngine", "VllmOptions"]

_log = logging.getLogger("airgate.vllm")

# Air-gap defaults, set before vLLM (and through it huggingface_hub) is imported; the engine-core
# process inherits them.  An operator's explicit value wins.
_OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}

# Imported once, off the event loop, before anything else of vLLM (see `_import_vllm`).
_HEAVY_MODULES = (
    "tokenizers",
    "transformers",
    "vllm.engine.arg_utils",
    "vllm.exceptions",
    "vllm.inputs",
    "vllm.sampling_params",
    "vllm.v1.engine.async_llm",
    "vllm.v1.engine.exceptions",
    "vllm.v1.metrics.loggers",
)

# vLLM's validation errors name the parameter; ours use the request field's name.
_PARAMS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "seed",
    "logit_bias": "logit_bias",
    "logprobs": "logprobs",
    "prompt_logprobs": "logprobs",
    "max_tokens": "max_tokens",
    "stop": "stop",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repetition_penalty": "repetition_penalty",
}


class VllmOptions(msgspec.Struct, frozen=True, kw_only=True):
    # "auto": the checkpoint's dtype, except that vLLM runs float32 checkpoints in 16 bits
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = "auto"
    max_model_len: int | None = None  # None: the model's own (max_position_embeddings)
    gpu_memory_utilization: float = 0.9  # on CPUs: the share of RAM vLLM may reserve
    tensor_parallel_size: int = 1
    enforce_eager: bool = False  # True: no torch.compile (much faster start, slower steps)
    # KV-cache size in GiB; None: from gpu_memory_utilization.  Passed as the engine argument
    # `kv_cache_memory_bytes`, which vLLM's CPU worker honours (VLLM_CPU_KVCACHE_SPACE, whole
    # GiB only and process-wide, still overrides it when an operator sets it).
    kv_cache_space_gib: float | None = None
    max_num_seqs: int = 16  # sequences that run concurrently: the engine's capacity
    max_waiting: int = 64  # beyond capacity + max_waiting, submit() raises EngineOverloaded
    chat_template: str | None = None  # Jinja or a builtin name; None: the tokenizer's own
    seed: int = 0
    enable_prefix_caching: bool = True


class VllmEngine:
    """vLLM in this process (engine core in a child process it owns).

    `model` is a directory of safetensors weights, config and tokenizer, or a `ModelSource`
    (a decrypted bundle in a private tmpfs directory), opened when the engine loads and released
    once everything that reads it (vLLM's load, our tokenizer and chat template) is done.
    """

    name = "vllm"

    def __init__(self, model: str | ModelSource, options: VllmOptions | None = None) -> None:
        self._source = model
        self.options = options or VllmOptions()
        self._llm: Any = None  # vllm AsyncLLM
        self._tokenizer: Tokenizer | None = None
        self._template: ChatTemplate | None = None
        self._snapshot = SchedulerSnapshot()
        self._context_length = self.options.max_model_len or 0
        self._model_vocab = 0
        self._open: weakref.WeakSet[Handle] = weakref.WeakSet()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ctx = HandleContext(self._piece, self._abort, self._open.discard)

    @property
    def context_length(self) -> int:
        return self._context_length

    async def start(self) -> None:
        """Load the model; returns when the engine core is ready to generate."""
        if self._llm is not None:
            return
        for key, value in _OFFLINE_ENV.items():
            os.environ.setdefault(key, value)
        started = time.monotonic()
        self._loop = asyncio.get_running_loop()
        await asyncio.to_thread(_import_vllm)
        # The engine-core handshake blocks until the model is loaded: off the event loop.
        llm = await asyncio.to_thread(self._load)
        # The output handler must be a task on this loop; AsyncLLM starts it lazily on the first
        # request otherwise, and an engine-core failure before then would go unnoticed.
        llm._run_output_handler()
        self._llm = llm
        self._context_length = int(llm.model_config.max_model_len)
        self._model_vocab = int(llm.model_config.get_vocab_size())
        _log.info(
            "vLLM engine ready in %.1f s: %d sequences x %d tokens",
            time.monotonic() - started,
            self.options.max_num_seqs,
            self._context_length,
        )

    def _load(self) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        opts = self.options
        source = self._source
        directory = source if isinstance(source, str) else source.open()
        try:
            tokenizer = Tokenizer.load(directory)
            template_source = opts.chat_template or tokenizer.chat_template
            template = (
                ChatTemplate(
                    template_source, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token
                )
                if template_source
                else None
            )
            args = AsyncEngineArgs(
                model=directory,
                tokenizer=directory,
                dtype=opts.dtype,
                seed=opts.seed,
                tensor_parallel_size=opts.tensor_parallel_size,
                gpu_memory_utilization=opts.gpu_memory_utilization,
                max_num_seqs=opts.max_num_seqs,
                enforce_eager=opts.enforce_eager,
                enable_prefix_caching=opts.enable_prefix_caching,
                scheduling_policy="priority",
                trust_remote_code=False,
                enable_log_requests=False,  # no request ids, parameters or prompts in the log
                disable_log_stats=True,  # no periodic log lines; our stat logger still gets stats
                kv_cache_memory_bytes=(
                    int(opts.kv_cache_space_gib * 2**30) if opts.kv_cache_space_gib else None
                ),
            )
            if opts.max_model_len:
                args.max_model_len = opts.max_model_len
            llm = AsyncLLM.from_engine_args(
                args, stat_loggers=[stat_logger_factory(self._snapshot)]
            )
        finally:
            if not isinstance(source, str):
                source.release()
        self._tokenizer = tokenizer
        self._template = template
        return llm

    async def stop(self) -> None:
        """Shut the engine down; the engine-core process (and its workers) are gone after."""
        llm, self._llm = self._llm, None
        if llm is None:
            return
        for handle in list(self._open):
            handle.fail(EngineNotReady("the engine stopped"))
        for task in list(self._tasks):
            task.cancel()
        # The output handler goes first: the engine core's exit is expected from here on, not
        # an error for vLLM to log.
        handler = llm.output_handler
        if handler is not None:
            handler.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await handler
        processes = EngineProcesses(llm)
        await asyncio.to_thread(llm.shutdown)
        await asyncio.to_thread(processes.wait)
        await asyncio.sleep(0)  # vLLM closes its sockets through call_soon_threadsafe

    def load(self) -> EngineLoad:
        """The engine's load, cheap enough to call for every request.

        The total is the number of requests submitted here and not yet finished or cancelled
        (vLLM's front-end count: it moves the moment submit() returns or a request ends, while
        the scheduler's statistics arrive a step late).  Of those, `waiting` are the ones beyond
        `capacity` or, if more, as many as the scheduler last reported waiting (held back for
        KV-cache room); the rest are `running`.  `kv_usage` is the scheduler's last report.
        """
        opts = self.options
        llm = self._llm
        if llm is None:
            return EngineLoad(0, 0, opts.max_num_seqs, opts.max_waiting, 0.0)
        in_flight = llm.get_num_unfinished_requests()
        running, waiting = split_load(in_flight, opts.max_num_seqs, self._snapshot.waiting)
        return EngineLoad(
            running, waiting, opts.max_num_seqs, opts.max_waiting, self._snapshot.kv_usage
        )

    def tokenize_prompt(self, request: GenerationRequest) -> tuple[list[int], str | None]:
        """The request's prompt tokens (and its text, for echo).  Thread-safe."""
        tok = self._tokenizer
        if tok is None or self._llm is None:
            raise EngineNotReady("the engine is not started")
        vocab = self._model_vocab
        if any(not 0 <= t < vocab for t, _ in request.sampling.logit_bias):
            raise InvalidGenerationRequest(
                f"logit_bias token ids must be in [0, {vocab})", param="logit_bias"
            )
        if request.messages is not None:
            if self._template is None:
                raise InvalidGenerationRequest(
                    "this model has no chat template; send a prompt instead", param="messages"
                )
            tokens: list[int] = []
            for text, is_content in self._template.render(request.messages, request.tools):
                tokens += tok.encode_segment(text, content=is_content, first=not tokens)
            return tokens, None
        if request.prompt_tokens is not None:
            limit = max(vocab, tok.n_vocab)
            bad = [t for t in request.prompt_tokens if not 0 <= t < limit]
            if bad:
                raise InvalidGenerationRequest(
                    f"prompt token ids must be in [0, {limit}); got {len(bad)} outside",
                    param="prompt",
                )
            ids = list(request.prompt_tokens)
            return ids, tok.decode(ids) if request.echo_prompt else None
        prompt = request.prompt or ""
        return tok.encode_prompt(prompt), prompt

    async def submit(self, request: GenerationRequest) -> Handle:
        llm = self._llm
        if llm is None:
            raise EngineNotReady("the engine is not started")
        opts = self.options
        in_flight = llm.get_num_unfinished_requests()
        if in_flight >= opts.max_num_seqs + opts.max_waiting:
            waiting = in_flight - opts.max_num_seqs
            raise EngineOverloaded(
                f"the engine is at capacity ({opts.max_num_seqs} running, {waiting} waiting)",
                retry_after_s=max(
                    1.0, self._ctx.mean_duration_s * (waiting + 1) / opts.max_num_seqs
                ),
            )
        # Tokenising a long prompt takes milliseconds: keep it off the event loop.
        if _prompt_size(request) > 2048:
            tokens, prompt_text = await asyncio.to_thread(self.tokenize_prompt, request)
        else:
            tokens, prompt_text = self.tokenize_prompt(request)
        if not tokens:
            raise InvalidGenerationRequest("the prompt is empty", param="prompt")
        kwargs = sampling_kwargs(
            request, prompt_tokens=len(tokens), context_length=self._context_length
        )
        collector = await self._add(llm, request, tokens, kwargs)
        handle = Handle(
            self._ctx,
            collector,
            prompt_tokens=len(tokens),
            logprobs=request.logprobs,
            echo=request.echo_prompt,
            prompt_text=prompt_text,
        )
        self._open.add(handle)
        return handle

    async def _add(
        self, llm: Any, request: GenerationRequest, tokens: list[int], kwargs: dict[str, Any]
    ) -> Any:
        """Hand the request to vLLM; its errors become ours (naming no content)."""
        from vllm.exceptions import VLLMValidationError
        from vllm.inputs import tokens_input
        from vllm.sampling_params import (
            RequestOutputKind,
            SamplingParams,
            StructuredOutputsParams,
        )
        from vllm.v1.engine.exceptions import EngineDeadError

        try:
            constrained = structured_outputs(request.constraint)
            if constrained is not None:
                kwargs["structured_outputs"] = StructuredOutputsParams(**constrained)
            params = SamplingParams(**kwargs, output_kind=RequestOutputKind.DELTA)
            # An engine input (type "token"), not a raw TokensPrompt: vLLM renders nothing.
            prompt = tokens_input(tokens, cache_salt=request.cache_salt)
            return await llm.add_request(
                request.request_id, prompt, params, priority=request.priority
            )
        except VLLMValidationError as exc:
            message = str(exc.args[0]) if exc.args else "invalid request"
            raise InvalidGenerationRequest(
                f"the vLLM engine rejected the request: {message}",
                param=_PARAMS.get(exc.parameter or ""),
            ) from exc
        except EngineDeadError as exc:
            raise EngineFailure("the vLLM engine is not running") from exc
        except EngineError:
            raise
        except ValueError as exc:
            if request.constraint is None:
                raise EngineFailure(
                    f"the vLLM engine could not accept the request ({type(exc).__name__})"
                ) from exc
            # vLLM's message may quote the schema: it is not passed on
            raise InvalidGenerationRequest(
                "the output schema cannot be compiled by vLLM's grammar backend",
                param=request.constraint.param,
            ) from exc
        except Exception as exc:
            raise EngineFailure(
                f"the vLLM engine could not accept the request ({type(exc).__name__})"
            ) from exc

    def _abort(self, request_id: str) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._spawn_abort(request_id)
        else:
            loop.call_soon_threadsafe(self._spawn_abort, request_id)

    def _spawn_abort(self, request_id: str) -> None:
        llm = self._llm
        if llm is None:
            return
        task = asyncio.get_running_loop().create_task(_abort(llm, request_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _piece(self, token_id: int) -> bytes:
        tok = self._tokenizer
        return tok.piece(token_id) if tok is not None else b""


def _import_vllm() -> None:
    """Import vLLM (and transformers, tokenizers) from a frame that holds nothing.

    Some of their modules keep an import error, traceback and all (`vllm.multimodal.media.audio`
    keeps the `torchcodec` one): every frame of the first import stays alive with its locals.
    Importing here keeps those frames free of the engine, which would otherwise never be freed.
    """
    for module in _HEAVY_MODULES:
        importlib.import_module(module)


async def _abort(llm: Any, request_id: str) -> None:
    # internal=True: the id is vLLM's own (external id + suffix), so a gateway request id shared
    # by several choices aborts only this one.
    try:
        await llm.abort(request_id, internal=True)
    except Exception:  # the engine is gone; nothing is left to abort
        _log.debug("abort after the engine stopped", exc_info=True)


def _prompt_size(request: GenerationRequest) -> int:
    if request.messages is not None:
        return sum(len(m.content) for m in request.messages)
    if request.prompt_tokens is not None:
        return len(request.prompt_tokens)
    return len(request.prompt or "")
