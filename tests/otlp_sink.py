"""A real OTLP/HTTP traces receiver for tests: `POST /v1/traces` on 127.0.0.1, random port.

It decodes each request (protobuf, optionally gzip) with opentelemetry-proto and keeps both the
bodies (for canary scans of exactly what left the process) and the decoded spans.

    with OtlpSink() as sink:
        telemetry = Telemetry.start(TelemetrySettings(otlp_endpoint=sink.endpoint))
        ...
        spans = sink.wait_for_spans(3)
"""

from __future__ import annotations

import gzip
import ssl
import threading
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

__all__ = ["OtlpSink", "SinkSpan"]

_PATH = "/v1/traces"


@dataclass(frozen=True)
class SinkSpan:
    """One received span, decoded."""

    name: str
    kind: int  # opentelemetry.proto.trace.v1 Span.SpanKind
    attributes: dict[str, Any]
    events: list[str]  # event names
    links: int
    status_code: int  # opentelemetry.proto.trace.v1 Status.StatusCode: 0 unset, 1 ok, 2 error
    status_message: str
    trace_id: str
    span_id: str
    parent_span_id: str
    trace_state: str
    resource: dict[str, Any] = field(default_factory=dict)
    scope: str = ""


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(v) for v in value.array_value.values)
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    if kind is None:
        return None
    return getattr(value, kind)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs if isinstance(kv, KeyValue)}


def _decode(request: ExportTraceServiceRequest) -> list[SinkSpan]:
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    SinkSpan(
                        name=span.name,
                        kind=span.kind,
                        attributes=_attributes(span.attributes),
                        events=[event.name for event in span.events],
                        links=len(span.links),
                        status_code=span.status.code,
                        status_message=span.status.message,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        trace_state=span.trace_state,
                        resource=resource,
                        scope=scope_spans.scope.name,
                    )
                )
    return spans


class OtlpSink:
    """The receiver; a context manager that serves in a background thread."""

    def __init__(self, *, tls: tuple[Path, Path] | None = None) -> None:
        """`tls`: (certificate chain, private key) PEM files to serve https instead."""
        self._cond = threading.Condition()
        self._bodies: list[bytes] = []  # decompressed protobuf, as received
        self._spans: list[SinkSpan] = []
        self._encodings: list[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._scheme = "http"
        if tls is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(tls[0], tls[1])
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
            self._scheme = "https"
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="otlp-sink", daemon=True
        )

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                if self.path != _PATH:
                    self._reply(404, b"")
                    return
                encoding = self.headers.get("Content-Encoding", "identity")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                sink._received(body, encoding, _decode(request))
                self._reply(200, ExportTraceServiceResponse().SerializeToString())

            def _reply(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet

        return Handler

    def _received(self, body: bytes, encoding: str, spans: list[SinkSpan]) -> None:
        with self._cond:
            self._bodies.append(body)
            self._encodings.append(encoding)
            self._spans.extend(spans)
            self._cond.notify_all()

    @property
    def endpoint(self) -> str:
        port = self._server.server_address[1]
        return f"{self._scheme}://127.0.0.1:{port}{_PATH}"

    @property
    def spans(self) -> list[SinkSpan]:
        with self._cond:
            return list(self._spans)

    @property
    def encodings(self) -> list[str]:
        """The Content-Encoding of each request received."""
        with self._cond:
            return list(self._encodings)

    def raw_bytes(self) -> bytes:
        """Every request body received (decompressed), concatenated: for canary scans."""
        with self._cond:
            return b"".join(self._bodies)

    def wait_for_spans(self, count: int, timeout_s: float = 30.0) -> list[SinkSpan]:
        """The spans, once at least `count` have arrived; AssertionError after `timeout_s`."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._spans) >= count, timeout_s):
                raise AssertionError(
                    f"{len(self._spans)} spans arrived within {timeout_s} s, expected {count}"
                )
            return list(self._spans)

    def __enter__(self) -> OtlpSink:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
