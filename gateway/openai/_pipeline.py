"""What chat and completions share: OpenAI parameters -> engine requests, then running them.

Running covers the things every endpoint must get right once: routing to a deployment and
submitting (engine errors become HTTP errors before any byte is sent; a deployment that fails
before the first token is retried once on another), merging several choices, metrics, the
request's log facts, aborting the engine when the client goes away, and SSE framing.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
from litestar import Request

from backends import errors as engine_errors
from backends.types import GenerationDelta, GenerationHandle, GenerationRequest, SamplingParams

from ..errors import (
    ClientClosedRequest,
    GatewayError,
    InternalError,
    InvalidRequest,
    UnsupportedParameter,
    error_body,
    translate_engine_errors,
)
from ..gate import Admitted, admit
from ..identity import SecurityHolder, caller
from ..metrics import Metrics
from ..registry import ModelRegistry, ServedModel
from ..reqlog import RequestInfo
from ..routing import Lease, Router
from ..security import Security
from ..telemetry import InferenceSpan, Telemetry

__all__ = [
    "SSE_DONE",
    "Run",
    "Services",
    "TextFrame",
    "audit_sampling",
    "finish_reason",
    "sampling_params",
    "sse",
    "stop_strings",
]

SSE_DONE = b"data: [DONE]\n\n"
_TOKEN_ID = re.compile(r"[0-9]{1,9}")  # ASCII digits only; the engine checks the vocabulary
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True, slots=True)
class Services:
    """What the inference handlers use, injected as ONE dependency: Litestar resolves several
    independent dependencies concurrently in an anyio task group, which cost more CPU per
    request than authentication, policy and limits together (py-spy, echo engine)."""

    models: ModelRegistry
    metrics: Metrics
    router: Router
    telemetry: Telemetry
    holder: SecurityHolder

    @property
    def security(self) -> Security:
        return self.holder.get()


def sse(payload: msgspec.Struct) -> bytes:
    return b"data: " + _encode(payload) + b"\n\n"


_SLOT = "\x00"  # a text no token carries as such: msgspec writes it as "\u0000"


class TextFrame:
    """The SSE frame of a chunk that only carries text, pre-encoded around the text.

    Built once per stream from the chunk struct itself (`make(_SLOT)`), so a token's frame is
    byte for byte what `sse(make(text))` gives, at the cost of encoding the text alone: no
    struct, list or envelope is built or encoded per token."""

    __slots__ = ("_head", "_tail")

    def __init__(self, make: Callable[[str], msgspec.Struct]) -> None:
        frame = sse(make(_SLOT))
        head, found, tail = frame.partition(_encode(_SLOT))
        if not found or _encode(_SLOT) in tail:
            raise ValueError("the chunk must carry the text exactly once")
        self._head, self._tail = head, tail

    def __call__(self, text: str) -> bytes:
        return self._head + _encode(text) + self._tail


def sampling_params(body: Any) -> SamplingParams:
    """Sampling from the fields chat and completions share (validated ranges already)."""
    if body.n != 1:
        raise UnsupportedParameter(
            "n > 1 is not supported: send one request per choice.", param="n"
        )
    bias: list[tuple[int, float]] = []
    for key, value in (body.logit_bias or {}).items():
        if not _TOKEN_ID.fullmatch(key):
            raise InvalidRequest(
                "logit_bias keys must be token ids (decimal integers as strings).",
                param="logit_bias",
            )
        bias.append((int(key), float(value)))
    return SamplingParams(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=max(0, body.top_k or 0),
        min_p=body.min_p or 0.0,
        seed=None if body.seed is None else body.seed & 0xFFFFFFFF,
        repetition_penalty=body.repetition_penalty or 1.0,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        logit_bias=tuple(bias),
    )


_SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "n",
    "max_tokens",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
)


def audit_sampling(body: Any) -> dict[str, bool | int | float]:
    """The request's sampling parameters for the audit log: numbers and flags only."""
    out: dict[str, bool | int | float] = {"stream": bool(body.stream)}
    for name in _SAMPLING_FIELDS:
        value = getattr(body, name, None)
        if isinstance(value, bool | int | float):
            out[name] = value
    return out


def finish_reason(delta: GenerationDelta) -> str:
    """OpenAI's finish_reason for a final delta (an abort only reaches a client that stayed)."""
    return "stop" if delta.finish_reason == "abort" else (delta.finish_reason or "stop")


def stop_strings(stop: str | Sequence[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


def _deployment_failed(exc: BaseException) -> bool:
    """The deployment's fault (retry elsewhere, count against its circuit), not the client's."""
    if isinstance(exc, engine_errors.EngineError):
        return isinstance(exc, engine_errors.EngineFailure | engine_errors.EngineNotReady)
    return isinstance(exc, Exception)


class Run:
    """The engine side of one HTTP request: a deployment lease and one handle per choice."""

    @classmethod
    async def begin(
        cls,
        request: Request[Any, Any, Any],
        body: Any,
        raw: bytes,
        requests: Sequence[GenerationRequest],
        *,
        model: ServedModel,
        info: RequestInfo,
        services: Services,
        action: Literal["chat.completions", "completions"],
        prompt_param: str,
    ) -> Run:
        """Admit the request (policy, limits, audit), route it, then submit it to the engine.

        A request without max_tokens gets the policy's cap as its default; every request gets
        its tenant's prefix-cache salt and the policy's priority."""
        principal = caller(request)
        security = services.security
        info.model, info.stream = model.id, body.stream
        asked = requests[0].max_tokens if requests else None
        span = services.telemetry.inference_span(
            "chat" if action == "chat.completions" else "text_completion",
            model.id,
            info.request_id,
            traceparent=request.headers.get("traceparent"),
        )
        if span.recording:
            span.set_request(
                max_tokens=asked,
                temperature=body.temperature,
                top_p=body.top_p,
                top_k=body.top_k,
                seed=body.seed,
                frequency_penalty=body.frequency_penalty,
                presence_penalty=body.presence_penalty,
                n=body.n,
                stream=body.stream,
            )
        try:
            admitted = await admit(
                security,
                principal,
                info,
                action=action,
                route=request.scope["path"],
                model=model.id,
                engine_classes=model.engine_classes,
                max_tokens=asked,
                n=body.n,
                sequences=len(requests),
                prompt_bytes=len(raw),
                stream=body.stream,
                sampling=audit_sampling(body),
            )
        except GatewayError as exc:
            span.set_error(exc.code or exc.type)
            span.end()
            raise
        cap = admitted.effective_max_tokens
        salt = security.cache_salt(principal)
        priority = admitted.decision.priority
        requests = [
            msgspec.structs.replace(
                r,
                max_tokens=r.max_tokens if r.max_tokens is not None else cap,
                cache_salt=salt,
                priority=priority,
            )
            for r in requests
        ]
        run = cls(
            model,
            info,
            services.metrics,
            prompt_param=prompt_param,
            admitted=admitted,
            router=services.router,
            team=principal.team or f"key:{principal.key_id}",
            span=span,
        )
        await run.submit(requests)
        return run

    def __init__(
        self,
        model: ServedModel,
        info: RequestInfo,
        metrics: Metrics,
        *,
        prompt_param: str,
        admitted: Admitted,
        router: Router,
        team: str,
        span: InferenceSpan,
    ) -> None:
        self.prompt_param = prompt_param  # named by a context-length error
        self.admitted = admitted
        self.model = model
        self.info = info
        self.metrics = metrics
        self.router = router
        self.team = team
        self.span = span
        self.handles: list[GenerationHandle] = []
        self.requests: Sequence[GenerationRequest] = ()
        self.lease: Lease | None = None
        self._tried: frozenset[str] = frozenset()
        self.start = time.perf_counter()
        self._labels = (model.id, "", "")
        info.model = model.id

    @property
    def deployment(self) -> str:
        return self.lease.deployment.name if self.lease is not None else ""

    async def submit(self, requests: Sequence[GenerationRequest]) -> None:
        self.requests = requests
        try:
            with translate_engine_errors(self.prompt_param):
                await self._dispatch()
        except GatewayError as exc:
            self.info.error_code = exc.code or exc.type
            self._drop()
            self._end_span()
            await self.admitted.close(self.info, error=exc)
            raise
        self.info.prompt_tokens = sum(h.prompt_tokens for h in self.handles)

    async def _dispatch(self) -> None:
        """Route, then submit every sequence to the chosen deployment.  A deployment that
        fails (or is full) at submission is left for another once; engine errors that are the
        client's own propagate at once."""
        while True:
            lease = await self.router.acquire(
                self.model,
                allowed=self.admitted.decision.engine_classes,
                team=self.team,
                exclude=self._tried,
            )
            self._use(lease)
            try:
                engine = lease.deployment.engine
                for req in self.requests:
                    self.handles.append(await engine.submit(req))
            except Exception as exc:
                full = isinstance(exc, engine_errors.EngineOverloaded)
                if not self._after_failure(exc, full=full):
                    raise
                continue
            self.router.observe_overhead(self.info, lease)
            return

    def _use(self, lease: Lease) -> None:
        self.lease = lease
        self._tried |= {lease.deployment.name}
        d = lease.deployment
        self._labels = (self.model.id, d.engine.name, d.name)
        self.info.deployment, self.info.route_reason = d.name, lease.reason
        self.info.attempts += 1
        self.admitted.routed(d.name, d.engine_class, lease.reason, self.info.attempts)
        self.span.set_route(
            deployment=d.name,
            engine=d.engine.name,
            engine_class=d.engine_class,
            reason=lease.reason,
        )

    def _after_failure(self, exc: BaseException, *, full: bool = False) -> bool:
        """Report a failure of the current deployment; whether to try another one."""
        failed = _deployment_failed(exc)
        if failed and self.lease is not None:
            self.lease.failed()
        self._drop()
        retry = (
            (failed or full)
            and self.router.settings.retry
            and self.info.attempts < 2
            and len(self.model.deployments) > len(self._tried)
        )
        if retry:
            self.router.retried(self.model.id)
        return retry

    def _drop(self) -> None:
        """Abort what runs and give the lease back."""
        self.cancel()
        self.handles.clear()
        if self.lease is not None:
            self.lease.release()

    async def complete(self, response_bytes: int | None = None) -> None:
        """Audit the completion before the response's final bytes go out (strict mode: durable
        when this returns; raises ServiceUnavailable when it cannot be)."""
        try:
            await self.admitted.complete(self.info, response_bytes=response_bytes)
        finally:
            await self.admitted.close(self.info)  # the refund; no further event once complete

    def cancel(self) -> None:
        for handle in self.handles:
            handle.cancel()

    async def _attempts(self) -> AsyncIterator[tuple[int, GenerationDelta]]:
        """The deltas of the current deployment; when it fails before anything was yielded,
        those of one other deployment."""
        while True:
            yielded = False
            try:
                async for item in _merge(self.handles):
                    if not yielded:
                        yielded = True
                        if self.lease is not None:
                            self.lease.ok()
                    yield item
                return
            except Exception as exc:
                if yielded or not self._after_failure(exc):
                    raise
            await self._dispatch()  # raises the client's error if nothing else can serve

    async def deltas(self) -> AsyncIterator[tuple[int, GenerationDelta]]:
        """(choice index, delta) as they come; records metrics; aborts the engine on exit."""
        last = None
        itl: Any = None  # the histogram child, once the deployment is settled (first token)
        completion = seen = 0
        finished = 0
        failed: BaseException | None = None
        try:
            with translate_engine_errors(self.prompt_param):
                async for index, delta in self._attempts():
                    labels = self._labels
                    now = time.perf_counter()
                    if delta.n_tokens:
                        seen += delta.n_tokens
                        if last is None:
                            self.info.ttft_s = now - self.start
                            self.metrics.ttft.labels(*labels).observe(self.info.ttft_s)
                            itl = self.metrics.itl.labels(*labels)
                        else:
                            itl.observe(now - last)
                        last = now
                    if delta.finish_reason is not None:
                        finished += 1
                        if delta.usage is not None:
                            completion += delta.usage.completion_tokens
                            self.info.completion_tokens = completion  # complete() audits it
                        self.info.finish_reason = delta.finish_reason
                        self.metrics.request_success.labels(*labels, delta.finish_reason).inc()
                    yield index, delta
        except Exception as exc:
            failed = exc
            raise
        finally:
            self.cancel()
            if self.lease is not None:
                if failed is None and finished == len(self.handles):
                    self.lease.ok()
                self.lease.release()
            if finished < len(self.handles) and failed is None:  # the client went away
                completion = max(completion, seen)
                if self.info.error_code is None:
                    self.info.error_code = "client_disconnected"
            self.info.completion_tokens = completion
            labels = self._labels
            self.metrics.prompt_tokens.labels(*labels).inc(self.info.prompt_tokens or 0)
            self.metrics.generation_tokens.labels(*labels).inc(completion)
            if finished == len(self.handles):
                self.metrics.e2e.labels(*labels).observe(time.perf_counter() - self.start)
            self._end_span(finished, failed)
            if failed is not None or finished < len(self.handles):
                await self.admitted.close(self.info, error=failed)  # else complete() closes

    def _end_span(self, finished: int = 0, failed: BaseException | None = None) -> None:
        """The trace span: usage, finish reason and the error code, if any (never text)."""
        span, info = self.span, self.info
        if not span.recording:
            return
        span.set_response(
            prompt_tokens=info.prompt_tokens or 0,
            completion_tokens=info.completion_tokens or 0,
            finish_reasons=[info.finish_reason] if finished and info.finish_reason else [],
            ttft_s=info.ttft_s,
            response_model=self.model.id,
        )
        if isinstance(failed, GatewayError):
            span.set_error(failed.code or failed.type)
        elif failed is not None:
            span.set_error("internal_error")
        elif info.error_code is not None:
            span.set_error(info.error_code)
        span.end()

    async def collect(self, request: Request[Any, Any, Any]) -> list[list[GenerationDelta]]:
        """Every delta per choice; a client that disconnects meanwhile aborts the generation."""
        per_choice: list[list[GenerationDelta]] = [[] for _ in self.requests]

        async def gather() -> None:
            async for index, delta in self.deltas():
                per_choice[index].append(delta)

        task = asyncio.ensure_future(gather())
        watcher = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            if not task.done():
                task.cancel()
                self.info.error_code = "client_disconnected"
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if task.cancelled():  # the client went away: its generation was aborted above
            raise ClientClosedRequest("the client closed the connection")
        task.result()
        return per_choice

    def stream_error(self, exc: BaseException) -> bytes:
        """The one SSE error event sent when generation fails after streaming began."""
        err = exc if isinstance(exc, GatewayError) else InternalError("internal error")
        self.info.error_code = err.code or err.type
        return b"data: " + error_body(err) + b"\n\n"


async def _disconnected(request: Request[Any, Any, Any]) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _merge(handles: Sequence[GenerationHandle]) -> AsyncIterator[tuple[int, GenerationDelta]]:
    if len(handles) == 1:
        async for delta in handles[0]:
            yield 0, delta
        return
    queue: asyncio.Queue[tuple[int, GenerationDelta | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, handle: GenerationHandle) -> None:
        try:
            async for delta in handle:
                queue.put_nowait((index, delta))
        except BaseException as exc:  # delivered to the consumer, which re-raises it
            queue.put_nowait((index, exc))
            return
        queue.put_nowait((index, None))

    tasks = [asyncio.ensure_future(pump(i, h)) for i, h in enumerate(handles)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
