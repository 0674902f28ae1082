"""Audit errors.  One tree; the HTTP layer and the CLI translate it, nothing else.

    AuditError                  anything the audit log refuses or cannot do
    ├── AuditUnavailable        the database did not take (or did not confirm) a write, or the
    │                           writer is not running: strict mode fails the request closed (503)
    ├── InvalidAuditEvent       an event breaks the schema (a bug in the caller, never client
    │                           input); the message names the field path, never its value
    ├── AuditRejected           the database refused one event (its event_id is already stored)
    ├── InvalidQuery            a search filter that cannot be right (a naive datetime)
    │   └── InvalidCursor       a search cursor this code did not issue
    ├── AuditCorrupt            a stored row no longer decodes: run `verify`
    └── AuditChainBusy          another running process holds this writer's chain

Messages never contain field values: an event is metadata, but a caller's bug could still put
something in it that has no place in a log line.
"""

from __future__ import annotations

__all__ = [
    "AuditChainBusy",
    "AuditCorrupt",
    "AuditError",
    "AuditRejected",
    "AuditUnavailable",
    "InvalidAuditEvent",
    "InvalidCursor",
    "InvalidQuery",
]


class AuditError(Exception):
    """Base of every audit failure."""


class AuditUnavailable(AuditError):
    """The event is not known to be durable; the caller must not act as if it were."""


class InvalidAuditEvent(AuditError):
    """The event does not satisfy the schema (bounded ids and enums only)."""


class AuditRejected(AuditError):
    """The database refused this event (and only this one) for a reason retrying cannot fix."""


class InvalidQuery(AuditError):
    """A search or export filter is malformed."""


class InvalidCursor(InvalidQuery):
    """The cursor is malformed; cursors are opaque and only ever come from `search`."""


class AuditCorrupt(AuditError):
    """A stored row does not decode as an audit event; `verify` says where the log was altered."""


class AuditChainBusy(AuditError):
    """Another running process writes this chain: each writer needs its own (`[audit] chain`)."""
