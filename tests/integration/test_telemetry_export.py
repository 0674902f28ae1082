"""Telemetry over real OTLP/HTTP: spans reach a receiver with their values, and no content."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from opentelemetry.trace import Status, StatusCode
from otlp_sink import OtlpSink  # tests/ is on sys.path

from gateway.config import TelemetrySettings
from gateway.telemetry.traces import Telemetry

CANARY = "CANARY-c41f0e5b"
CONTENT = f"Please rewrite the layoff letter {CANARY} in a warmer tone"
SPAN_KIND_INTERNAL = 1
STATUS_UNSET, STATUS_ERROR = 0, 2


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink() as receiver:
        yield receiver


@pytest.fixture
def telemetry(sink: OtlpSink, monkeypatch: pytest.MonkeyPatch) -> Iterator[Telemetry]:
    """Exporting in the background: batches leave every 50 ms instead of every 5 s."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    started = Telemetry.start(TelemetrySettings(otlp_endpoint=sink.endpoint, timeout_s=10))
    yield started
    started.shutdown()


def _full_span(telemetry: Telemetry, request_id: str) -> None:
    with telemetry.inference_span("chat", "gemma-3-270m-it", request_id) as span:
        span.set_request(
            max_tokens=128,
            temperature=0.2,
            top_p=0.95,
            top_k=20,
            seed=42,
            frequency_penalty=0.0,
            presence_penalty=0.5,
            n=3,
            stream=True,
        )
        span.set_route(
            deployment="gemma-small", engine="llamacpp", engine_class="cpu", reason="default"
        )
        span.set_response(
            prompt_tokens=17,
            completion_tokens=99,
            finish_reasons=["stop", "length", "stop"],
            ttft_s=0.125,
            response_id=f"chatcmpl-{request_id}",
            response_model="gemma-3-270m-it",
        )


def test_spans_arrive_with_their_values(telemetry: Telemetry, sink: OtlpSink) -> None:
    _full_span(telemetry, "req-ok")
    with telemetry.inference_span("text_completion", "gemma-3-270m-it", "req-err") as span:
        span.set_request(max_tokens=8)
        span.set_error("rate_limit_exceeded")

    ok, err = sorted(sink.wait_for_spans(2), key=lambda s: s.name)
    assert ok.name == "chat gemma-3-270m-it"
    assert ok.kind == SPAN_KIND_INTERNAL
    assert ok.status_code == STATUS_UNSET
    assert ok.attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "airgate",
        "gen_ai.request.model": "gemma-3-270m-it",
        "airgate.request_id": "req-ok",
        "gen_ai.request.max_tokens": 128,
        "gen_ai.request.temperature": 0.2,
        "gen_ai.request.top_p": 0.95,
        "gen_ai.request.top_k": 20.0,
        "gen_ai.request.seed": 42,
        "gen_ai.request.frequency_penalty": 0.0,
        "gen_ai.request.presence_penalty": 0.5,
        "gen_ai.request.choice.count": 3,
        "airgate.stream": True,
        "airgate.deployment": "gemma-small",
        "airgate.engine": "llamacpp",
        "airgate.engine_class": "cpu",
        "airgate.route_reason": "default",
        "gen_ai.usage.input_tokens": 17,
        "gen_ai.usage.output_tokens": 99,
        "gen_ai.response.finish_reasons": ("stop", "length", "stop"),
        "airgate.ttft_ms": 125.0,
        "gen_ai.response.id": "chatcmpl-req-ok",
        "gen_ai.response.model": "gemma-3-270m-it",
    }
    assert ok.resource == {
        "service.name": "airgate",
        "service.version": ok.resource["service.version"],
    }
    assert set(ok.resource) == {"service.name", "service.version"}

    assert err.name == "text_completion gemma-3-270m-it"
    assert err.status_code == STATUS_ERROR
    assert err.status_message == ""
    assert err.attributes["error.type"] == "rate_limit_exceeded"
    assert err.attributes["gen_ai.operation.name"] == "text_completion"
    assert err.events == []


def test_content_set_on_a_span_never_leaves_the_process(
    telemetry: Telemetry, sink: OtlpSink
) -> None:
    forbidden = {
        "gen_ai.input.messages": CONTENT,
        "gen_ai.output.messages": CONTENT,
        "gen_ai.system_instructions": CONTENT,
        "gen_ai.tool.definitions": CONTENT,
        "gen_ai.request.stop_sequences": (CANARY,),
        "exception.message": CONTENT,
        "exception.stacktrace": CONTENT,
        "http.url": f"http://gw/?q={CANARY}",
        "url.full": f"http://gw/?q={CANARY}",
        "url.query": f"q={CANARY}",
        "gen_ai.request.model": CONTENT,  # an allowed key with a content-shaped value
    }
    span = telemetry.tracer.start_span("chat gemma-3-270m-it", attributes=forbidden)
    span.add_event("gen_ai.user.message", {"content": CONTENT})
    span.record_exception(RuntimeError(CONTENT))
    span.set_status(Status(StatusCode.ERROR, CONTENT))
    span.end()
    with (
        pytest.raises(ValueError),
        telemetry.inference_span("chat", "gemma-3-270m-it", "req-exc") as inference,
    ):
        inference.set_request(max_tokens=4)
        raise ValueError(CONTENT)
    _full_span(telemetry, "req-ok")  # a full span alongside, so the scan sees real bodies

    spans = sink.wait_for_spans(3)
    raw = sink.raw_bytes()
    assert b"gemma-3-270m-it" in raw  # the scan reads what was sent
    for needle in (CANARY, CANARY.lower(), "layoff"):
        assert needle.encode() not in raw
    by_name = {s.attributes.get("airgate.request_id", "tracer"): s for s in spans}
    assert by_name["tracer"].attributes == {}
    assert by_name["tracer"].events == []
    assert by_name["tracer"].status_code == STATUS_ERROR
    assert by_name["tracer"].status_message == ""
    assert by_name["req-exc"].attributes["error.type"] == "ValueError"
    assert by_name["req-exc"].status_code == STATUS_ERROR


def test_shutdown_flushes_pending_spans(sink: OtlpSink) -> None:
    telemetry = Telemetry.start(TelemetrySettings(otlp_endpoint=sink.endpoint))
    for i in range(25):
        _full_span(telemetry, f"req-{i}")
    telemetry.shutdown()  # the batch delay (5 s) has not passed: only the flush sends them
    assert len(sink.spans) == 25
    assert {s.attributes["airgate.request_id"] for s in sink.spans} == {
        f"req-{i}" for i in range(25)
    }
    telemetry.shutdown()


def test_sampling_ratio_zero_sends_nothing(sink: OtlpSink) -> None:
    telemetry = Telemetry.start(TelemetrySettings(otlp_endpoint=sink.endpoint, sample_ratio=0))
    for i in range(25):
        _full_span(telemetry, f"req-{i}")
    telemetry.shutdown()
    assert sink.spans == []
    assert sink.raw_bytes() == b""


def test_gzip_compressed_export(sink: OtlpSink, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "gzip")
    telemetry = Telemetry.start(TelemetrySettings(otlp_endpoint=sink.endpoint))
    _full_span(telemetry, "req-gz")
    telemetry.shutdown()
    assert sink.encodings == ["gzip"]
    assert [s.attributes["airgate.request_id"] for s in sink.spans] == ["req-gz"]


def _tls_files(directory: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key) for 127.0.0.1."""
    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("otlp-test-ca"))
        .issuer_name(name("otlp-test-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name("127.0.0.1"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_path, cert_path, key_path = (directory / n for n in ("ca.pem", "cert.pem", "key.pem"))
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return ca_path, cert_path, key_path


def test_https_collector_verified_with_the_ca_file(tmp_path: Path) -> None:
    ca, cert, key = _tls_files(tmp_path)
    with OtlpSink(tls=(cert, key)) as sink:
        assert sink.endpoint.startswith("https://127.0.0.1:")
        telemetry = Telemetry.start(TelemetrySettings(otlp_endpoint=sink.endpoint, ca_file=str(ca)))
        _full_span(telemetry, "req-tls")
        telemetry.shutdown()
        assert [s.attributes["airgate.request_id"] for s in sink.spans] == ["req-tls"]


def test_https_collector_with_an_unknown_ca_receives_nothing(tmp_path: Path) -> None:
    _, cert, key = _tls_files(tmp_path)
    with OtlpSink(tls=(cert, key)) as sink:
        telemetry = Telemetry.start(TelemetrySettings(otlp_endpoint=sink.endpoint, timeout_s=0.5))
        _full_span(telemetry, "req-untrusted")
        telemetry.shutdown()
        assert sink.spans == []
