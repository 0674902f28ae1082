"""The inference pipeline: one straight line from an adapter's facts to its encoded answer.

    Pipeline.start(request)   resolve the model -> admit (policy, limits, `inference.admitted`)
                              -> build the engine requests once -> route and submit (attempts)
    Inference.result(render)  every delta -> the adapter renders the body -> `inference.completed`
    Inference.stream(encoder) the adapter encodes each delta -> `inference.completed` -> closing

The pipeline owns the request's end: the completion event is durable before the final bytes
(strict mode), a failure or a client gone is audited and refunded exactly once, the engine is
aborted when nobody listens any more.  Adapters only decode and encode.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from backends.tool_calls import ToolCallParser
from backends.types import ChatMessage, GenerationDelta, GenerationRequest, Usage

from ..access.stack import Security, SecurityHolder
from ..engines.registry import ModelRegistry, ServedModel
from ..errors import (
    ClientClosedRequest,
    GatewayError,
    InternalError,
    InvalidRequest,
    translate_engine_errors,
)
from ..routing import Router
from ..telemetry.metrics import Metrics
from ..telemetry.traces import InferenceSpan, Telemetry
from .admission import admit
from .attempts import Attempts
from .completion import Admitted
from .embedding import Embedded
from .embedding import embed as run_embedding
from .facts import Action, InferenceRequest, Progress, RawPrompt, Record

__all__ = ["Inference", "Pipeline", "StreamEncoder"]

_OPERATION: dict[Action, Literal["chat", "text_completion"]] = {
    "chat.completions": "chat",
    "completions": "text_completion",
    "responses": "chat",
}


class StreamEncoder(Protocol):
    """How an adapter writes a streamed answer (SSE for OpenAI, NDJSON for Ollama)."""

    def opening(self) -> bytes:
        """Before the first delta (b"": nothing)."""
        ...

    def delta(self, index: int, delta: GenerationDelta) -> bytes:
        """One delta of choice `index` (b"": nothing to send for it)."""
        ...

    def closing(self, usage: Usage) -> bytes:
        """After every choice finished and the completion is durable: the final bytes."""
        ...

    def failure(self, error: GatewayError) -> bytes:
        """The one event that ends a stream that failed after it began."""
        ...


@dataclass(frozen=True, slots=True)
class Pipeline:
    """Everything an inference needs, built once by the composition root and injected as ONE
    dependency: Litestar resolves several independent dependencies concurrently in an anyio
    task group, which cost more CPU per request than authentication, policy and limits
    together (py-spy, echo engine)."""

    models: ModelRegistry
    metrics: Metrics
    router: Router
    telemetry: Telemetry
    holder: SecurityHolder

    @property
    def security(self) -> Security:
        return self.holder.get()

    async def start(self, request: InferenceRequest, record: Record) -> Inference:
        """Admit, route and submit one request; its errors are raised before any byte is
        sent.  `record` (the request's log record) gets the request's `Progress`."""
        model = self.models.resolve(request.model)
        if model.task != "generate":
            raise InvalidRequest(
                "this model creates embeddings; it does not generate text", param="model"
            )
        progress = Progress(model.id, request.stream)
        record.progress = progress
        span = self._span(request, model)
        security = self.security
        try:
            admitted = await admit(security, request, model, progress)
        except GatewayError as exc:
            span.set_error(exc.code or exc.type)
            span.end()
            raise
        requests = _engine_requests(request, admitted, security)
        inference = Inference(self, request, model, progress, admitted, span, requests)
        await inference.submit(request, record.started)
        return inference

    async def embed(self, request: InferenceRequest, record: Record) -> Embedded:
        """Admit, route and run one embeddings request (`request.embedding` set)."""
        return await run_embedding(self, request, record)

    def _span(self, request: InferenceRequest, model: ServedModel) -> InferenceSpan:
        span = self.telemetry.inference_span(
            _OPERATION[request.action],
            model.id,
            request.request_id,
            traceparent=request.traceparent,
        )
        if span.recording:
            sent = request.sampling

            def number(name: str) -> float | None:
                value = sent.get(name)
                return None if value is None else float(value)

            seed = sent.get("seed")
            span.set_request(
                max_tokens=request.generation.max_tokens,
                temperature=number("temperature"),
                top_p=number("top_p"),
                top_k=None if sent.get("top_k") is None else int(sent["top_k"]),
                seed=None if seed is None else int(seed),
                frequency_penalty=number("frequency_penalty"),
                presence_penalty=number("presence_penalty"),
                n=request.n,
                stream=request.stream,
            )
        return span


def _engine_requests(
    request: InferenceRequest, admitted: Admitted, security: Security
) -> list[GenerationRequest]:
    """The engine requests, built once the policy has decided: a request without max_tokens
    gets the policy's cap; every one gets its tenant's prefix-cache salt and the priority, and
    a raw prompt the rule's choice of parsing control tokens in it."""
    g = request.generation
    decision = admitted.decision
    # without max_tokens the policy's cap is a ceiling: the completion may use what remains of
    # the context up to it (an explicit max_tokens must fit, as the client asked for it)
    max_tokens = g.max_tokens if g.max_tokens is not None else decision.effective_max_tokens
    fit = g.max_tokens is None
    salt = security.cache_salt(request.principal)

    def build(
        request_id: str,
        messages: tuple[ChatMessage, ...] | None = None,
        prompt: RawPrompt | None = None,
    ) -> GenerationRequest:
        return GenerationRequest(
            request_id=request_id,
            messages=messages,
            prompt=prompt if isinstance(prompt, str) else None,
            parse_special=decision.raw_prompt_special_tokens,
            prompt_tokens=prompt if isinstance(prompt, tuple) else None,
            max_tokens=max_tokens,
            fit_to_context=fit,
            stop=g.stop,
            sampling=g.sampling,
            logprobs=g.logprobs,
            echo_prompt=g.echo_prompt,
            cache_salt=salt,
            priority=decision.priority,
            tools=g.tools,
            constraint=g.constraint,
            n=request.n,
        )

    if g.messages is not None:
        return [build(request.request_id, messages=g.messages)]
    return [build(f"{request.request_id}-{i}", prompt=p) for i, p in enumerate(g.prompts)]


class Inference:
    """One admitted request on its way through an engine, until its answer is complete."""

    def __init__(
        self,
        pipeline: Pipeline,
        request: InferenceRequest,
        model: ServedModel,
        progress: Progress,
        admitted: Admitted,
        span: InferenceSpan,
        requests: Sequence[GenerationRequest],
    ) -> None:
        self.model = model
        self.progress = progress
        self.headers = admitted.headers  # limits' x-ratelimit-*; the deployment once routed
        # choices in the answer: n per engine request (prompt p's choice j is p * n + j)
        self.sequences = len(requests) * request.n
        self._admitted = admitted
        self._span = span
        self._attempts = Attempts(pipeline, request, model, progress, admitted, span, requests)
        g = request.generation
        self._parsers: list[ToolCallParser] | None = None
        if g.tool_calls is not None:
            self._parsers = [ToolCallParser(g.tool_calls) for _ in range(self.sequences)]
            progress.tool_calls = 0

    def _deltas(self) -> AsyncIterator[tuple[int, GenerationDelta]]:
        """The engine's deltas; where tools were offered, with tool calls read out of the text
        (a plain request pays nothing for it)."""
        if self._parsers is None:
            return self._attempts.deltas()
        return self._parsed(self._parsers)

    async def _parsed(
        self, parsers: list[ToolCallParser]
    ) -> AsyncIterator[tuple[int, GenerationDelta]]:
        progress = self.progress
        async for index, delta in self._attempts.deltas():
            delta = parsers[index].feed(delta)
            if delta.finish_reason is not None:
                progress.tool_calls = sum(p.calls for p in parsers)
                if delta.finish_reason == "tool_calls":
                    progress.finish_reason = "tool_calls"
            yield index, delta

    async def submit(self, request: InferenceRequest, started: float) -> None:
        try:
            with translate_engine_errors(request.prompt_param):
                await self._attempts.dispatch(started)
        except GatewayError as exc:
            self.progress.error_code = exc.code or exc.type
            self._attempts.drop()
            self._attempts.end_span(exc)
            await self._admitted.close(exc)
            raise

    async def result(
        self,
        render: Callable[[list[list[GenerationDelta]]], bytes],
        disconnected: Callable[[], Awaitable[None]],
    ) -> bytes:
        """The whole answer: every delta per choice, rendered by the adapter, then audited as
        complete (durable before it is returned).  `disconnected` returns when the client has
        gone; the generation is then aborted and ClientClosedRequest raised."""
        per_choice: list[list[GenerationDelta]] = [[] for _ in range(self.sequences)]

        async def gather() -> None:
            async for index, delta in self._deltas():
                per_choice[index].append(delta)

        # Gathered in a task of its own: each delta then resumes that task's short stack, not
        # the handler's and every middleware's frames above it.
        task = asyncio.ensure_future(gather())
        watcher = asyncio.ensure_future(disconnected())
        try:
            await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            if not task.done():
                task.cancel()
                self.progress.error_code = "client_disconnected"
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if task.cancelled():  # the client went away: its generation was aborted above
            raise ClientClosedRequest("the client closed the connection")
        task.result()
        try:
            payload = render(per_choice)
        except BaseException as exc:
            await self._admitted.close(exc)
            raise
        await self._complete(len(payload))
        return payload

    async def stream(self, encoder: StreamEncoder) -> AsyncIterator[bytes]:
        """The encoded answer, chunk by chunk; a failure after the first byte becomes the
        encoder's one failure event.  A client that goes away closes this generator, which
        aborts the generation."""
        opening = encoder.opening()
        if opening:
            yield opening
        prompt = completion = 0
        try:
            async for index, delta in self._deltas():
                chunk = encoder.delta(index, delta)
                if chunk:
                    yield chunk
                if delta.usage is not None:
                    prompt += delta.usage.prompt_tokens
                    completion += delta.usage.completion_tokens
            await self._complete()  # durable before the closing bytes
        except Exception as exc:
            err = exc if isinstance(exc, GatewayError) else InternalError("internal error")
            self.progress.error_code = err.code or err.type
            yield encoder.failure(err)
            return
        yield encoder.closing(Usage(prompt, completion))

    async def _complete(self, response_bytes: int | None = None) -> None:
        try:
            await self._admitted.complete(response_bytes=response_bytes)
        finally:
            await self._admitted.close()  # the refund; no further event once complete
