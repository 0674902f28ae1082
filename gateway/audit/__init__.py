"""The tamper-evident audit log: metadata-only events in a hash chain with signed checkpoints.

`AuditWriter` appends (one task, group commit, durable before `append` returns); `search`/`get`
read; `export` streams JSONL, CSV or OCSF; `verify` checks the chain and the checkpoints against
trusted public keys.  Tables in `schema.py`, created only by the Alembic migrations.  A laptop's
chain travels home as signed segments (`segment.py`, `segment_store.py`), checked at HQ against
the device's enrolled key, which vouches for that chain only (`devices.py`).
"""

from .checkpoint import Checkpoint
from .devices import DeviceKey, Enrolment, EnrolmentError, chain_keys, device_keys
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
from .segment import CheckedSegment, Segment, SegmentRefused, check_segment
from .segment_store import SegmentSourceError, import_segment, read_segment
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
    "CheckedSegment",
    "Checkpoint",
    "DeviceKey",
    "Enrolment",
    "EnrolmentError",
    "EventKind",
    "Format",
    "InvalidAuditEvent",
    "InvalidCursor",
    "InvalidQuery",
    "LogReport",
    "Outcome",
    "Problem",
    "Segment",
    "SegmentRefused",
    "SegmentSourceError",
    "VerifyReport",
    "WriterStats",
    "chain_keys",
    "check_segment",
    "device_keys",
    "export",
    "export_csv",
    "export_jsonl",
    "export_ocsf",
    "get",
    "import_segment",
    "new_event_id",
    "read_segment",
    "search",
    "verify",
    "verify_log",
]
