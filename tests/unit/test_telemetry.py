"""gateway.telemetry: the export allow-list, the inference span API, the disabled path."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from importlib.metadata import version
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)
from opentelemetry.util.types import AttributeValue

from gateway.config import ConfigError, TelemetrySettings
from gateway.telemetry.export import (
    ALLOWED_ATTRIBUTES,
    AllowListExporter,
    TelemetryConfigError,
    allowed_attributes,
)
from gateway.telemetry.traces import Telemetry

CANARY = "CANARY-7f3a9c"
CONTENT = f"Summarize the merger memo {CANARY} for the board"
FORBIDDEN: dict[str, AttributeValue] = {
    "gen_ai.input.messages": f'[{{"role": "user", "content": "{CONTENT}"}}]',
    "gen_ai.output.messages": CONTENT,
    "gen_ai.system_instructions": CONTENT,
    "gen_ai.tool.definitions": CONTENT,
    "gen_ai.request.stop_sequences": (CANARY,),
    "exception.message": CANARY,
    "exception.stacktrace": CANARY,
    "http.url": f"http://gw/v1/chat?q={CANARY}",
    "url.full": f"http://gw/v1/chat?q={CANARY}",
    "url.query": f"q={CANARY}",
    "airgate.prompt": CANARY,
}
ALLOWED: dict[str, AttributeValue] = {
    "gen_ai.operation.name": "chat",
    "gen_ai.provider.name": "airgate",
    "gen_ai.request.model": "meta-llama/Llama-3.1-8B-Instruct",
    "gen_ai.request.max_tokens": 256,
    "gen_ai.request.temperature": 0.7,
    "gen_ai.response.finish_reasons": ("stop", "length"),
    "airgate.stream": True,
    "airgate.request_id": "9f1c2e3d4b5a69788796a5b4",
}
ENDPOINT = "http://127.0.0.1:9/v1/traces"  # never contacted: these tests export in memory


@pytest.fixture
def memory() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracer(memory: InMemorySpanExporter) -> Iterator[trace.Tracer]:
    """A tracer exporting synchronously through the allow-list into memory."""
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(AllowListExporter(memory)))
    yield provider.get_tracer("test")
    provider.shutdown()


@pytest.fixture
def telemetry(memory: InMemorySpanExporter) -> Iterator[Telemetry]:
    """A started Telemetry (batch processor, sampler, resource) exporting into memory."""
    started = Telemetry.start(TelemetrySettings(otlp_endpoint=ENDPOINT), exporter=memory)
    yield started
    started.shutdown()


def _exported(telemetry: Telemetry, memory: InMemorySpanExporter) -> tuple[ReadableSpan, ...]:
    assert telemetry.force_flush()
    return memory.get_finished_spans()


def _mentions_canary(span: ReadableSpan) -> bool:
    return CANARY in span.to_json()


def test_forbidden_attributes_events_links_and_status_description_are_dropped(
    tracer: trace.Tracer, memory: InMemorySpanExporter
) -> None:
    with tracer.start_as_current_span("linked") as other:
        pass
    span = tracer.start_span(
        "chat gemma-3-270m",
        attributes={**ALLOWED, **FORBIDDEN},
        links=[Link(other.get_span_context(), {"note": CONTENT})],
    )
    span.add_event("gen_ai.content.prompt", {"gen_ai.prompt": CONTENT})
    span.record_exception(ValueError(CONTENT))
    span.set_status(Status(StatusCode.ERROR, f"ValueError: {CONTENT}"))
    span.end()

    exported = memory.get_finished_spans()[-1]
    assert dict(exported.attributes or {}) == ALLOWED
    assert exported.events == ()
    assert exported.links == ()
    assert exported.status.status_code is StatusCode.ERROR
    assert exported.status.description is None
    assert exported.name == "chat gemma-3-270m"
    assert not _mentions_canary(exported)


def test_forbidden_keys_are_not_in_the_allow_list() -> None:
    assert not ALLOWED_ATTRIBUTES & set(FORBIDDEN)


@pytest.mark.parametrize(
    "value",
    [
        CONTENT,
        "two words",
        "line\nbreak",
        'say "hi"',
        "{json: 1}",
        "a" * 129,
        "",
        "-starts-with-dash",
        ("stop", CONTENT),
        (("nested",),),
        ("x",) * 65,
        b"bytes",
        None,
    ],
)
def test_values_that_do_not_look_like_identifiers_are_dropped(value: Any) -> None:
    assert allowed_attributes({"airgate.deployment": value}) == {}


@pytest.mark.parametrize(
    "value",
    [
        "gemma-3-270m-it",
        "meta-llama/Llama-3.1-8B-Instruct",
        "qwen2.5:7b-q4_K_M",
        "rate_limit_exceeded",
        "chatcmpl-9f1c2e3d4b5a69788796a5b4",
        "a" * 128,
        0,
        -3,
        0.25,
        False,
        ("stop", "length"),
        (1, 2),
        (),
    ],
)
def test_identifiers_numbers_and_booleans_are_kept(value: Any) -> None:
    assert allowed_attributes({"airgate.deployment": value}) == {"airgate.deployment": value}


@pytest.mark.parametrize(
    ("name", "exported"),
    [
        ("chat gemma-3-270m-it", "chat gemma-3-270m-it"),
        ("POST /v1/chat/completions", "POST /v1/chat/completions"),
        ("GET /v1/models/{model}", "GET /v1/models/{model}"),
        (CONTENT, "redacted"),
        (f"chat {CANARY} and more", "redacted"),
    ],
)
def test_span_names_that_are_not_identifiers_are_replaced(
    tracer: trace.Tracer, memory: InMemorySpanExporter, name: str, exported: str
) -> None:
    tracer.start_span(name).end()
    assert memory.get_finished_spans()[-1].name == exported


def test_tracestate_from_the_caller_is_dropped(
    tracer: trace.Tracer, memory: InMemorySpanExporter
) -> None:
    parent = SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", CANARY.lower())]),
    )
    context = trace.set_span_in_context(NonRecordingSpan(parent))
    tracer.start_span("child", context=context).end()
    exported = memory.get_finished_spans()[-1]
    assert exported.context is not None
    assert exported.context.trace_id == parent.trace_id
    assert not exported.context.trace_state
    assert exported.parent is not None and not exported.parent.trace_state


def test_inference_span_records_request_route_and_response(
    telemetry: Telemetry, memory: InMemorySpanExporter
) -> None:
    with telemetry.inference_span("chat", "gemma-3-270m-it", "req0001") as span:
        assert span.recording
        span.set_request(
            max_tokens=64,
            temperature=0.5,
            top_p=0.9,
            top_k=40,
            seed=7,
            frequency_penalty=0.1,
            presence_penalty=0.2,
            n=2,
            stream=True,
        )
        span.set_route(
            deployment="gemma-small", engine="llamacpp", engine_class="cpu", reason="default"
        )
        span.set_response(
            prompt_tokens=12,
            completion_tokens=30,
            finish_reasons=["stop", "length"],
            ttft_s=0.0425,
            response_id="chatcmpl-req0001",
            response_model="gemma-3-270m-it",
        )
    (exported,) = _exported(telemetry, memory)
    assert exported.name == "chat gemma-3-270m-it"
    assert exported.kind is SpanKind.INTERNAL
    assert exported.status.status_code is StatusCode.UNSET
    assert dict(exported.attributes or {}) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "airgate",
        "gen_ai.request.model": "gemma-3-270m-it",
        "airgate.request_id": "req0001",
        "gen_ai.request.max_tokens": 64,
        "gen_ai.request.temperature": 0.5,
        "gen_ai.request.top_p": 0.9,
        "gen_ai.request.top_k": 40.0,
        "gen_ai.request.seed": 7,
        "gen_ai.request.frequency_penalty": 0.1,
        "gen_ai.request.presence_penalty": 0.2,
        "gen_ai.request.choice.count": 2,
        "airgate.stream": True,
        "airgate.deployment": "gemma-small",
        "airgate.engine": "llamacpp",
        "airgate.engine_class": "cpu",
        "airgate.route_reason": "default",
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 30,
        "gen_ai.response.finish_reasons": ("stop", "length"),
        "airgate.ttft_ms": 42.5,
        "gen_ai.response.id": "chatcmpl-req0001",
        "gen_ai.response.model": "gemma-3-270m-it",
    }
    assert set(exported.attributes or {}) <= ALLOWED_ATTRIBUTES
    assert dict(exported.resource.attributes) == {
        "service.name": "airgate",
        "service.version": version("airgate"),
    }


def test_parameters_absent_from_the_request_are_not_recorded(
    telemetry: Telemetry, memory: InMemorySpanExporter
) -> None:
    with telemetry.inference_span("text_completion", "m", "r") as span:
        span.set_request(n=1)
    (exported,) = _exported(telemetry, memory)
    assert exported.name == "text_completion m"
    assert not {k for k in exported.attributes or {} if k.startswith("gen_ai.request.")} - {
        "gen_ai.request.model"
    }
    assert (exported.attributes or {})["airgate.stream"] is False


def test_set_error_ends_the_span_with_status_error(
    telemetry: Telemetry, memory: InMemorySpanExporter
) -> None:
    with telemetry.inference_span("chat", "m", "r") as span:
        span.set_error("rate_limit_exceeded")
    (exported,) = _exported(telemetry, memory)
    assert exported.status.status_code is StatusCode.ERROR
    assert exported.status.description is None
    assert (exported.attributes or {})["error.type"] == "rate_limit_exceeded"


def test_an_exception_leaving_the_span_records_its_class_never_its_message(
    telemetry: Telemetry, memory: InMemorySpanExporter
) -> None:
    with pytest.raises(ValueError), telemetry.inference_span("chat", "m", "r"):
        raise ValueError(CONTENT)
    with pytest.raises(KeyError), telemetry.inference_span("chat", "m", "r") as span:
        span.set_error("context_length_exceeded")
        raise KeyError(CONTENT)
    first, second = _exported(telemetry, memory)
    assert (first.attributes or {})["error.type"] == "ValueError"
    assert (second.attributes or {})["error.type"] == "context_length_exceeded"
    for exported in (first, second):
        assert exported.status.status_code is StatusCode.ERROR
        assert exported.events == ()
        assert not _mentions_canary(exported)


def test_code_elsewhere_setting_content_on_the_tracer_still_exports_none(
    telemetry: Telemetry, memory: InMemorySpanExporter
) -> None:
    span = telemetry.tracer.start_span("chat m", attributes=FORBIDDEN)
    span.record_exception(RuntimeError(CONTENT))
    span.set_status(Status(StatusCode.ERROR, CONTENT))
    span.end()
    (exported,) = _exported(telemetry, memory)
    assert dict(exported.attributes or {}) == {}
    assert not _mentions_canary(exported)


def test_a_sampled_caller_trace_is_joined(
    telemetry: Telemetry, memory: InMemorySpanExporter
) -> None:
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with telemetry.inference_span("chat", "m", "r", traceparent=traceparent):
        pass
    (exported,) = _exported(telemetry, memory)
    assert exported.context is not None and exported.parent is not None
    assert exported.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert exported.parent.span_id == 0xB7AD6B7169203331


def test_sampling_ratio_zero_exports_nothing(memory: InMemorySpanExporter) -> None:
    settings = TelemetrySettings(otlp_endpoint=ENDPOINT, sample_ratio=0.0)
    telemetry = Telemetry.start(settings, exporter=memory)
    try:
        for i in range(50):
            with telemetry.inference_span("chat", "m", f"r{i}") as span:
                assert not span.recording
                span.set_request(max_tokens=1)
                span.set_error("internal_error")
        # ParentBased: a caller's unsampled trace stays unsampled as well
        unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
        with telemetry.inference_span("chat", "m", "r", traceparent=unsampled) as span:
            assert not span.recording
        assert _exported(telemetry, memory) == ()
    finally:
        telemetry.shutdown()


def _providers() -> int:
    # type(), not isinstance(): isinstance reads `__class__`, which some lazy objects (torch's
    # deprecated module attributes, once torch is imported) answer with a warning
    return sum(issubclass(type(o), TracerProvider) for o in gc.get_objects())


def test_disabled_telemetry_is_a_no_op_and_creates_no_provider() -> None:
    gc.collect()
    providers, threads = _providers(), set(threading.enumerate())

    telemetry = Telemetry.start(TelemetrySettings())
    first = telemetry.inference_span("chat", "m", "r1")
    with first as span:
        span.set_request(max_tokens=1, stream=True)
        span.set_route(deployment="d", engine="e", engine_class="c", reason="r")
        span.set_response(prompt_tokens=1, completion_tokens=1, finish_reasons=["stop"], ttft_s=0)
        span.set_error("internal_error")
    with pytest.raises(ValueError), telemetry.inference_span("chat", "m", "r2"):
        raise ValueError(CONTENT)

    assert not telemetry.enabled
    assert not first.recording
    assert telemetry.inference_span("text_completion", "x", "r3") is first  # one shared object
    assert isinstance(telemetry.tracer, trace.NoOpTracer)
    assert telemetry.force_flush()
    telemetry.shutdown()
    telemetry.shutdown()
    assert _providers() == providers
    assert set(threading.enumerate()) <= threads  # no export thread started


@pytest.mark.parametrize(
    "endpoint",
    [
        "grpc://127.0.0.1:4317",
        "127.0.0.1:4318",
        "localhost:4318/v1/traces",
        "ftp://collector/v1/traces",
        "file:///tmp/traces",
        "http://",
        "https:///v1/traces",
        "http://[::1/v1/traces",
        "http://collector:port/v1/traces",
        "http://collector:0/v1/traces",
    ],
)
def test_endpoints_other_than_http_urls_are_rejected(endpoint: str) -> None:
    with pytest.raises(TelemetryConfigError, match=r"telemetry\.otlp_endpoint") as caught:
        Telemetry.start(TelemetrySettings(otlp_endpoint=endpoint))
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, ConfigError)


def test_a_ca_file_needs_https_and_must_exist(tmp_path: Any) -> None:
    with pytest.raises(TelemetryConfigError, match=r"telemetry\.ca_file"):
        Telemetry.start(TelemetrySettings(otlp_endpoint=ENDPOINT, ca_file=str(tmp_path)))
    with pytest.raises(TelemetryConfigError, match=r"telemetry\.ca_file .* is not a file"):
        Telemetry.start(
            TelemetrySettings(
                otlp_endpoint="https://collector:4318/v1/traces", ca_file=str(tmp_path / "no")
            )
        )


def test_shutdown_is_idempotent_and_turns_spans_off(memory: InMemorySpanExporter) -> None:
    telemetry = Telemetry.start(TelemetrySettings(otlp_endpoint=ENDPOINT), exporter=memory)
    with telemetry.inference_span("chat", "m", "before"):
        pass
    telemetry.shutdown()
    telemetry.shutdown()
    assert [s.name for s in memory.get_finished_spans()] == ["chat m"]
    assert not telemetry.enabled
    assert not telemetry.inference_span("chat", "m", "after").recording
