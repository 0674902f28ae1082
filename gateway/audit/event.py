"""The audit event: metadata about one request or operation, never its content.

Kept (DESIGN.md, "Audit"): ids, timestamps, principal (key id, team, subject, auth method),
action, model, bundle digest, deployment, route, outcome, HTTP status, error class, token counts,
latency, TTFT, finish reason, sampling parameters, request/response byte sizes, policy version
and decision.

Never kept: messages, system prompts, completions, stop strings, tool arguments, embedding
inputs or vectors, logprob token text, exception messages that echo input.

The type makes the second list impossible rather than merely discouraged: every string field is
an identifier or an enum (a bounded pattern without whitespace), sampling holds numbers and
booleans only, and an event is checked against those constraints when it is constructed
(msgspec checks `Meta` constraints only when decoding; `_validator` compiles the same constraints
into a check that `__post_init__` runs).  Exception messages have no field at all: `error_class`
is a class name or an error code.  The stored body is the canonical JSON of the event
(`encode_event`), which the hash chain covers byte for byte.
"""

from __future__ import annotations

import contextvars
from datetime import UTC, datetime, timedelta
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from ..ids import random_hex
from ._validator import compile_validator
from .errors import InvalidAuditEvent

__all__ = [
    "KINDS",
    "OUTCOMES",
    "AuditEvent",
    "AuditPrincipal",
    "AuditRecord",
    "EventKind",
    "Outcome",
    "decode_event",
    "encode_event",
    "new_event_id",
    "ts_us",
]

EventKind = Literal[
    "inference.admitted",
    "inference.completed",
    "inference.failed",
    "inference.cancelled",
    "inference.interrupted",
    "embedding.completed",
    "auth.failure",
    "policy.denied",
    "rate.limited",
    "admin.action",
    "audit.access",
    "bundle.loaded",
    "audit.epoch",
    "egress.denied",
]
KINDS: tuple[EventKind, ...] = EventKind.__args__  # type: ignore[attr-defined]
Outcome = Literal["success", "failure", "denied", "cancelled"]
OUTCOMES: tuple[Outcome, ...] = Outcome.__args__  # type: ignore[attr-defined]

# Identifiers: bounded, no whitespace, so no sentence of a prompt fits in one.
# `(?!\n)$`: Python's `$` also matches before a final newline
EventId = Annotated[str, Meta(pattern=r"^[A-Za-z0-9._:-]{1,64}(?!\n)$")]
Ident = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_.:@/+-]{1,128}(?!\n)$")]
# a JWT `sub`, an API key's owner, a client certificate's fingerprint or escaped DN (`\20` for
# a space): printable ASCII without spaces
Subject = Annotated[str, Meta(pattern=r"^[!-~]{1,256}(?!\n)$")]
Code = Annotated[str, Meta(pattern=r"^[a-z][a-z0-9_]{0,31}(?!\n)$")]  # finish reason, decision
Route = Annotated[str, Meta(pattern=r"^/[A-Za-z0-9_.~/{}:-]{0,127}(?!\n)$")]  # never a query
Digest = Annotated[str, Meta(pattern=r"^[0-9a-f]{64}(?!\n)$")]
Count = Annotated[int, Meta(ge=0)]
Millis = Annotated[float, Meta(ge=0)]
Key = Annotated[str, Meta(pattern=r"^[a-z][a-z0-9_]{0,31}(?!\n)$")]
Sampling = Annotated[dict[Key, bool | int | float], Meta(max_length=24)]
Detail = Annotated[dict[Key, Ident | int], Meta(max_length=16)]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
# set while the (validating) decoder builds an event, so its __post_init__ does not check twice
_decoding: contextvars.ContextVar[bool] = contextvars.ContextVar("audit_decoding", default=False)


class AuditPrincipal(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Who acted, as auth resolved it (all optional: an auth failure may know none of it)."""

    key_id: Ident | None = None
    team: Ident | None = None
    subject: Subject | None = None
    method: Code | None = None  # "api_key", "jwt", "mtls"


class AuditEvent(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One audit record's content.  Construct with keywords; invalid values raise
    `InvalidAuditEvent` naming the field.  `ts` is any timezone-aware datetime, kept in UTC
    with microsecond precision."""

    event_id: EventId
    ts: Annotated[datetime, Meta(tz=True)]
    kind: EventKind
    outcome: Outcome
    request_id: EventId | None = None
    principal: AuditPrincipal | None = None
    action: Ident | None = None  # "chat.completions", "audit.export", "keys.revoke", ...
    model: Ident | None = None
    bundle_digest: Digest | None = None
    deployment: Ident | None = None
    route: Route | None = None
    http_status: Annotated[int, Meta(ge=100, le=599)] | None = None
    error_class: Ident | None = None  # an exception class name or error code, never a message
    prompt_tokens: Count | None = None
    completion_tokens: Count | None = None
    latency_ms: Millis | None = None
    ttft_ms: Millis | None = None
    finish_reason: Code | None = None
    sampling: Sampling = {}  # temperature, top_p, max_tokens, n, seed, stream, ...
    # the output's shape: "text", "json_object" or "json_schema" (never the schema), how many
    # tools were offered and how many calls were made (never names, descriptions, arguments)
    response_format: Literal["json_object", "json_schema"] | None = None  # absent: text
    tools_count: Count | None = None
    tool_calls_count: Count | None = None
    inputs_count: Count | None = None  # embeddings: how many inputs (never the inputs)
    client_address: Ident | None = None  # the peer's IP address (auth failures, admin actions)
    count: Annotated[int, Meta(ge=1)] | None = None  # an aggregated event: how many it stands for
    request_bytes: Count | None = None
    response_bytes: Count | None = None
    policy_version: Ident | None = None
    decision: Code | None = None  # the policy's decision code
    degraded: bool = False
    detail: Detail = {}  # admin, audit-access and bundle events: target ids, counts, formats

    def __post_init__(self) -> None:
        ts = self.ts
        if isinstance(ts, datetime) and ts.tzinfo is not None and ts.utcoffset() != timedelta(0):
            msgspec.structs.force_setattr(self, "ts", ts.astimezone(UTC))
        if _decoding.get():
            return  # the decoder has just checked every constraint
        bad = _validate(self)
        if bad is not None:
            raise InvalidAuditEvent(f"Invalid audit event field - at `{bad}`")


class AuditRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A stored event with its place in its chain (what search, get and export return)."""

    chain: str  # the writer's chain (`log_id`)
    seq: int
    event: AuditEvent
    prev_hash: str
    row_hash: str


_encoder = msgspec.json.Encoder(order="sorted")
_decoder = msgspec.json.Decoder(AuditEvent)
_validate = compile_validator(AuditEvent)


def encode_event(event: AuditEvent) -> bytes:
    """The canonical JSON of `event`: sorted keys, defaults omitted, UTC timestamps."""
    return _encoder.encode(event)


def decode_event(body: bytes | str) -> AuditEvent:
    """Decode and validate a stored body; raises `msgspec.ValidationError`/`DecodeError`."""
    token = _decoding.set(True)
    try:
        return _decoder.decode(body)
    finally:
        _decoding.reset(token)


def ts_us(ts: datetime) -> int:
    """Microseconds since the Unix epoch (exact, no float rounding)."""
    return (ts - _EPOCH) // _MICROSECOND


def new_event_id() -> str:
    """A fresh random event id (32 hex digits; the same shape as a uuid4's hex, without the
    UUID object or a system call per id)."""
    return random_hex(16)
