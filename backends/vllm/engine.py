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
import logging
import time
import weakref
from typing import Any

from ..chat_template import ChatTemplate
from ..errors import EngineError, EngineFailure, EngineNotReady, InvalidGenerationRequest
from ..types import (
    EmbeddingRequest,
    EmbeddingResult,
    EngineLoad,
    GenerationRequest,
    ModelSource,
    Task,
)
from ._handle import Handle, HandleContext
from ._load import SchedulerSnapshot, admit, split_load
from ._options import VllmOptions
from ._params import sampling_kwargs, sequences, structured_outputs
from ._start import abort_request, build_llm, opened, start_llm, stop_llm
from ._tokenizer import Tokenizer

__all__ = ["VllmEngine", "VllmOptions"]

_log = logging.getLogger("airgate.vllm")

# vLLM's validation errors name the parameter; ours use the request field's name.
_PARAMS = {
    "n": "n",
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


class VllmEngine:
    """vLLM in this process (engine core in a child process it owns).

    `model` is a directory of safetensors weights, config and tokenizer, or a `ModelSource`
    (a decrypted bundle in a private tmpfs directory), opened when the engine loads and released
    once everything that reads it (vLLM's load, our tokenizer and chat template) is done.
    """

    name = "vllm"
    task: Task = "generate"

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

    @property
    def embedding_size(self) -> int | None:
        return None  # a generating engine

    @property
    def truncatable(self) -> bool:
        return False

    async def start(self) -> None:
        """Load the model; returns when the engine core is ready to generate."""
        if self._llm is not None:
            return
        started = time.monotonic()
        self._loop = asyncio.get_running_loop()
        llm = await start_llm(self._load)
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
        opts = self.options
        with opened(self._source) as directory:
            tokenizer = Tokenizer.load(directory)
            template_source = opts.chat_template or tokenizer.chat_template
            template = (
                ChatTemplate(
                    template_source, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token
                )
                if template_source
                else None
            )
            llm = build_llm(directory, opts, self._snapshot)
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
        await stop_llm(llm)

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
        return tok.encode_prompt(prompt, parse_special=request.parse_special), prompt

    async def submit(self, request: GenerationRequest) -> Handle:
        llm = self._llm
        if llm is None:
            raise EngineNotReady("the engine is not started")
        if request.n < 1:
            raise InvalidGenerationRequest("n must be at least 1", param="n")
        opts = self.options
        admit(
            llm.get_num_unfinished_requests(),
            sequences(request),
            capacity=opts.max_num_seqs,
            max_waiting=opts.max_waiting,
            mean_duration_s=self._ctx.mean_duration_s,
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
            choices=request.n,
            copies=request.n > 1 and kwargs["n"] == 1,
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

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult:
        raise InvalidGenerationRequest("this model generates text; it does not embed")

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
        task = asyncio.get_running_loop().create_task(abort_request(llm, request_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _piece(self, token_id: int) -> bytes:
        tok = self._tokenizer
        return tok.piece(token_id) if tok is not None else b""


def _prompt_size(request: GenerationRequest) -> int:
    if request.messages is not None:
        return sum(len(m.content) for m in request.messages)
    if request.prompt_tokens is not None:
        return len(request.prompt_tokens)
    return len(request.prompt or "")
