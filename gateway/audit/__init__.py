"""The tamper-evident audit log: metadata-only events in a hash chain with signed checkpoints.

`AuditWriter` appends (one task, group commit, durable before `append` returns); `search`/`get`
read; `export` streams JSONL, CSV or OCSF; `verify` checks the chain and the checkpoints against
trusted public keys.  Tables in `schema.py`, created only by the Alembic migrations.
"""

from .checkpoint import Checkpoint
from .errors import (
    AuditChainBusy,
    AuditCorrupt,
    AuditError,
    AuditRejected,
    AuditUnavailable,
    InvalidAuditEvent,
    InvalidCursor,
    InvalidQuery,
)
from .event import (
    KINDS,
    OUTCOMES,
    AuditEvent,
    AuditPrincipal,
    AuditRecord,
    EventKind,
    Outcome,
    new_event_id,
)
from .export import Format, export, export_csv, export_jsonl, export_ocsf
from .query import AuditFilter, get, search
from .verify import LogReport, Problem, VerifyReport, verify, verify_log
from .writer import AuditWriter, WriterStats

__all__ = [
    "KINDS",
    "OUTCOMES",
    "AuditChainBusy",
    "AuditCorrupt",
    "AuditError",
    "AuditEvent",
    "AuditFilter",
    "AuditPrincipal",
    "AuditRecord",
    "AuditRejected",
    "AuditUnavailable",
    "AuditWriter",
    "Checkpoint",
    "EventKind",
    "Format",
    "InvalidAuditEvent",
    "InvalidCursor",
    "InvalidQuery",
    "LogReport",
    "Outcome",
    "Problem",
    "VerifyReport",
    "WriterStats",
    "export",
    "export_csv",
    "export_jsonl",
    "export_ocsf",
    "get",
    "new_event_id",
    "search",
    "verify",
    "verify_log",
]
