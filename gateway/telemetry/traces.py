"""OpenTelemetry traces: one GenAI inference span per request, content-free by construction.

Zero retention holds at export, not at the call sites: every span passes the allow-list in
`export.py` before it leaves the process, so an attribute, event or status text set here or by a
library instrumentation that is not metadata is never exported.

Each app owns its `TracerProvider` (never the global one), started in its lifespan and shut
down (flushed) with it.  With `[telemetry] otlp_endpoint` empty nothing of the SDK is created
and every span call returns one shared no-op object.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from types import TracebackType
from typing import Any, Final, Literal

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ..config import TelemetrySettings
from .export import span_exporter

__all__ = ["InferenceSpan", "Telemetry"]

# gen_ai.provider.name is an open enum: "the GenAI telemetry format flavor", set by the
# instrumentation's best knowledge.  airgate hosts the models itself (llama.cpp, vLLM in
# process) and its own attributes are airgate.*, so it is the provider here.
PROVIDER: Final = "airgate"
_SCOPE: Final = "airgate.gateway"
_PROPAGATOR: Final = TraceContextTextMapPropagator()


def _airgate_version() -> str:
    try:
        return version("airgate")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0.0.0"


class InferenceSpan:
    """One inference, as a context manager: `set_*` record metadata, the exit ends the span.

    The setters only fill a dict; the span gets it in one call at the end (one lock, one
    validation pass).  The span is not made the current one: an SSE stream crosses tasks and
    `yield`s, where a context token cannot be detached safely.  An exception leaving the block
    records its class name as `error.type` (never its message) unless `set_error` was called.
    A span that is off (telemetry disabled, not sampled) is one shared object doing nothing.
    """

    __slots__ = ("_attrs", "_error", "_span")

    def __init__(self, span: trace.Span | None, attrs: dict[str, Any] | None) -> None:
        self._span = span
        self._attrs = attrs
        self._error = False

    @property
    def recording(self) -> bool:
        return self._attrs is not None

    def __enter__(self) -> InferenceSpan:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None and not self._error and self._attrs is not None:
            self.set_error(exc_type.__name__)
        self.end()

    def end(self) -> None:
        """End the span (for a span whose life is not one `with` block); later calls do
        nothing."""
        span, attrs = self._span, self._attrs
        if span is None or attrs is None:
            return
        self._span = None
        span.set_attributes(attrs)
        if self._error:
            span.set_status(Status(StatusCode.ERROR))
        span.end()

    def set_request(
        self,
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        seed: int | None = None,
        frequency_penalty: float | None = None,
        presence_penalty: float | None = None,
        n: int | None = None,
        stream: bool = False,
    ) -> None:
        """The request's sampling parameters (None: not in the request, not recorded)."""
        attrs = self._attrs
        if attrs is None:
            return
        attrs["airgate.stream"] = stream
        if max_tokens is not None:
            attrs["gen_ai.request.max_tokens"] = max_tokens
        if temperature is not None:
            attrs["gen_ai.request.temperature"] = float(temperature)
        if top_p is not None:
            attrs["gen_ai.request.top_p"] = float(top_p)
        if top_k is not None:
            attrs["gen_ai.request.top_k"] = float(top_k)  # a double in the semconv
        if seed is not None:
            attrs["gen_ai.request.seed"] = seed
        if frequency_penalty is not None:
            attrs["gen_ai.request.frequency_penalty"] = float(frequency_penalty)
        if presence_penalty is not None:
            attrs["gen_ai.request.presence_penalty"] = float(presence_penalty)
        if n is not None and n != 1:  # the semconv: only when in the request and != 1
            attrs["gen_ai.request.choice.count"] = n

    def set_route(self, *, deployment: str, engine: str, engine_class: str, reason: str) -> None:
        """Where the request went and why."""
        attrs = self._attrs
        if attrs is None:
            return
        attrs["airgate.deployment"] = deployment
        attrs["airgate.engine"] = engine
        attrs["airgate.engine_class"] = engine_class
        attrs["airgate.route_reason"] = reason

    def set_response(
        self,
        *,
        prompt_tokens: int,
        completion_tokens: int,
        finish_reasons: Sequence[str],
        ttft_s: float | None,
        response_id: str | None = None,
        response_model: str | None = None,
    ) -> None:
        """Usage and outcome; `ttft_s` is None when no token was produced."""
        attrs = self._attrs
        if attrs is None:
            return
        attrs["gen_ai.usage.input_tokens"] = prompt_tokens
        attrs["gen_ai.usage.output_tokens"] = completion_tokens
        attrs["gen_ai.response.finish_reasons"] = tuple(finish_reasons)
        if ttft_s is not None:
            attrs["airgate.ttft_ms"] = round(ttft_s * 1000.0, 3)
        if response_id is not None:
            attrs["gen_ai.response.id"] = response_id
        if response_model is not None:
            attrs["gen_ai.response.model"] = response_model

    def set_error(self, error_type: str) -> None:
        """The error's code ("rate_limit_exceeded", "context_length_exceeded"), never a
        message; the span ends with status ERROR."""
        attrs = self._attrs
        if attrs is None:
            return
        attrs["error.type"] = error_type
        self._error = True


_OFF: Final = InferenceSpan(None, None)


class Telemetry:
    """The app's tracing: `start` it in the lifespan, `shutdown` it (flushes) on the way out."""

    __slots__ = ("_lock", "_provider", "_tracer")

    def __init__(self, provider: TracerProvider | None) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer(_SCOPE, _airgate_version()) if provider else None
        self._lock = threading.Lock()

    @classmethod
    def start(
        cls, settings: TelemetrySettings, *, exporter: SpanExporter | None = None
    ) -> Telemetry:
        """Tracing per `settings`; off (no SDK object at all) when `otlp_endpoint` is empty.

        `exporter` replaces the OTLP/HTTP exporter (tests); it is wrapped by the allow-list
        like the real one.  Raises `TelemetryConfigError` when `[telemetry]` is unusable.
        """
        if not settings.otlp_endpoint:
            return cls(None)
        allow_listed = span_exporter(settings, exporter)
        provider = TracerProvider(
            # Resource(...) rather than Resource.create(...): no detectors, no host or
            # process attributes, nothing from OTEL_RESOURCE_ATTRIBUTES.
            resource=Resource(
                {"service.name": settings.service_name, "service.version": _airgate_version()}
            ),
            sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)),
            shutdown_on_exit=False,  # the lifespan shuts it down; no atexit reference
        )
        provider.add_span_processor(BatchSpanProcessor(allow_listed))
        return cls(provider)

    @property
    def enabled(self) -> bool:
        return self._provider is not None

    @property
    def tracer(self) -> trace.Tracer:
        """For spans of our own beyond inference; they pass the same allow-list at export."""
        return self._tracer if self._tracer is not None else trace.NoOpTracer()

    def inference_span(
        self,
        operation: Literal["chat", "text_completion", "embeddings"],
        model: str,
        request_id: str,
        *,
        traceparent: str | None = None,
    ) -> InferenceSpan:
        """A span for one inference, named "{operation} {model}".

        Kind INTERNAL: the semconv asks for CLIENT when the model runs in another process and
        allows INTERNAL for a model running in the same process, which is airgate's case
        (llama.cpp and vLLM engines live in the gateway).  The remote hop (client -> gateway)
        is the HTTP server span's; a CLIENT span here would draw an edge to a peer that does
        not exist in service graphs.

        `traceparent`: the caller's W3C header, to join its trace (its `tracestate` is never
        read).
        """
        tracer = self._tracer
        if tracer is None:
            return _OFF
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": PROVIDER,
            "gen_ai.request.model": model,
            "airgate.request_id": request_id,
        }
        context = _PROPAGATOR.extract({"traceparent": traceparent}) if traceparent else None
        span = tracer.start_span(
            f"{operation} {model}",
            context=context,
            kind=SpanKind.INTERNAL,
            attributes=attrs,  # the sampler sees them; the span copies them
            record_exception=False,
            set_status_on_exception=False,
        )
        if not span.is_recording():
            return _OFF
        return InferenceSpan(span, {})

    def force_flush(self, timeout_s: float = 30.0) -> bool:
        """Export what is pending now; False when it did not finish in time."""
        if self._provider is None:
            return True
        return self._provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        """Flush pending spans and stop the export thread; later calls do nothing."""
        with self._lock:
            provider, self._provider, self._tracer = self._provider, None, None
        if provider is not None:
            provider.shutdown()
