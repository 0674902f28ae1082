"""Span export: the allow-list every span passes before it leaves the process, and the exporter.

Zero retention holds at export, not at the call sites: `AllowListExporter` rebuilds every span
before it leaves the process, keeping only the attribute keys in `ALLOWED_ATTRIBUTES` whose
values are numbers, booleans or short identifier-like strings, and dropping every event (so
`record_exception` leaks nothing), every link, the status description and any W3C `tracestate`.
A library instrumentation or a future change that sets `gen_ai.input.messages` or an exception
message on a span therefore still exports nothing of it.

`span_exporter` checks `[telemetry]` (endpoint scheme, CA file) and builds the OTLP/HTTP
exporter on a session that reads nothing from the environment, wrapped by the allow-list.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import requests
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, Status, TraceState

from ..config import ConfigError, TelemetrySettings

__all__ = [
    "ALLOWED_ATTRIBUTES",
    "AllowListExporter",
    "TelemetryConfigError",
    "allowed_attributes",
    "span_exporter",
]

ALLOWED_ATTRIBUTES: Final = frozenset(
    {
        # OpenTelemetry GenAI semantic conventions (inference span), metadata only.  Never the
        # opt-in content attributes (gen_ai.input.messages, gen_ai.output.messages,
        # gen_ai.system_instructions, gen_ai.tool.definitions), nor stop sequences (user text),
        # nor exception.message / exception.stacktrace, nor URLs (http.url, url.full, url.query).
        "gen_ai.operation.name",
        "gen_ai.provider.name",
        "gen_ai.request.model",
        "gen_ai.response.model",
        "gen_ai.request.max_tokens",
        "gen_ai.request.temperature",
        "gen_ai.request.top_p",
        "gen_ai.request.top_k",
        "gen_ai.request.seed",
        "gen_ai.request.frequency_penalty",
        "gen_ai.request.presence_penalty",
        "gen_ai.request.choice.count",
        "gen_ai.response.id",
        "gen_ai.response.finish_reasons",
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
        "error.type",
        # ours
        "airgate.request_id",
        "airgate.deployment",
        "airgate.engine",
        "airgate.engine_class",
        "airgate.route_reason",
        "airgate.ttft_ms",
        "airgate.stream",
    }
)

_MAX_STRING: Final = 128
_MAX_ITEMS: Final = 64
# Model ids ("org/Model-3.1-8B:q4"), request ids, enum values ("stop", "rate_limit_exceeded"):
# no whitespace, no quotes, no brackets.  A string of another shape is dropped, never
# truncated: a truncated prompt is still a prompt.
_IDENT: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/@+-]*")
_SPAN_NAME: Final = re.compile(
    r"[A-Za-z0-9_][A-Za-z0-9_.:/@+-]*( [A-Za-z0-9_{/][A-Za-z0-9_.:/@+{}-]*)?"
)
_NUMBERS: Final = (int, float)  # bool is an int
_REDACTED_NAME: Final = "redacted"
_EMPTY_STATE: Final = TraceState()


class TelemetryConfigError(ConfigError, ValueError):
    """`[telemetry]` is unusable (endpoint scheme, CA file); the message names the key."""


def _validated_endpoint(settings: TelemetrySettings) -> str:
    endpoint = settings.otlp_endpoint
    try:
        parts = urlsplit(endpoint)
        usable = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # "http://[::1", a port that is not a number
        usable = False
    if not usable:
        raise TelemetryConfigError(
            "telemetry.otlp_endpoint must be an http:// or https:// URL of an OTLP/HTTP traces "
            "receiver, e.g. http://127.0.0.1:4318/v1/traces"
        )
    if settings.ca_file is not None:
        if parts.scheme != "https":
            raise TelemetryConfigError(
                "telemetry.ca_file is set but telemetry.otlp_endpoint is not https://"
            )
        if not Path(settings.ca_file).is_file():
            raise TelemetryConfigError(f"telemetry.ca_file {settings.ca_file} is not a file")
    return endpoint


def _ca_bundle(settings: TelemetrySettings) -> str | None:
    if settings.ca_file is not None:
        return settings.ca_file
    paths = ssl.get_default_verify_paths()  # the system's (SSL_CERT_FILE / SSL_CERT_DIR)
    return paths.cafile or paths.capath  # None: requests' bundled certifi


def _session() -> requests.Session:
    # requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override the session's CA file (so a
    # configured ca_file would be silently ignored), and applies *_PROXY variables and ~/.netrc
    # credentials: none of that belongs on the way to the collector we were told to use.
    session = requests.Session()
    session.trust_env = False
    return session


def _allowed_scalar(value: Any) -> bool:
    if isinstance(value, str):
        return len(value) <= _MAX_STRING and _IDENT.fullmatch(value) is not None
    return isinstance(value, _NUMBERS)


def _allowed_value(value: Any) -> bool:
    if isinstance(value, tuple | list):  # the SDK stores sequences as tuples
        return len(value) <= _MAX_ITEMS and all(_allowed_scalar(item) for item in value)
    return _allowed_scalar(value)


def allowed_attributes(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    """The attributes that may leave the process: allow-listed key, identifier-shaped value."""
    if not attributes:
        return {}
    return {
        key: value
        for key, value in attributes.items()
        if key in ALLOWED_ATTRIBUTES and _allowed_value(value)
    }


def _without_state(context: SpanContext | None) -> SpanContext | None:
    # tracestate comes from the caller's headers and is exported as is: free text we never chose
    if context is None or not context.trace_state:
        return context
    return SpanContext(
        context.trace_id,
        context.span_id,
        context.is_remote,
        context.trace_flags,
        _EMPTY_STATE,
    )


def _scrubbed(span: ReadableSpan) -> ReadableSpan:
    name = span.name if _SPAN_NAME.fullmatch(span.name) and len(span.name) <= 200 else None
    scope = span.instrumentation_scope
    return ReadableSpan(
        name=name or _REDACTED_NAME,
        context=_without_state(span.context),
        parent=_without_state(span.parent),
        resource=span.resource,  # ours: service.name and service.version
        attributes=allowed_attributes(span.attributes),
        events=(),
        links=(),
        kind=span.kind,
        status=Status(span.status.status_code),
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=InstrumentationScope(scope.name, scope.version) if scope else None,
    )


class AllowListExporter(SpanExporter):
    """Wraps an exporter: what reaches it is only allow-listed, content-free span data."""

    def __init__(self, inner: SpanExporter) -> None:
        self._inner = inner

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self._inner.export([_scrubbed(span) for span in spans])

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._inner.force_flush(timeout_millis)


def span_exporter(
    settings: TelemetrySettings, exporter: SpanExporter | None = None
) -> AllowListExporter:
    """The exporter spans leave through: `exporter`, or OTLP/HTTP to `otlp_endpoint`, behind
    the allow-list.  Raises `TelemetryConfigError` when `[telemetry]` is unusable (checked even
    when `exporter` is given)."""
    endpoint = _validated_endpoint(settings)
    if exporter is None:
        exporter = OTLPSpanExporter(
            endpoint=endpoint,
            certificate_file=_ca_bundle(settings),
            timeout=settings.timeout_s,
            session=_session(),
        )
    return AllowListExporter(exporter)
