"""Export the audit log as JSON Lines, CSV or OCSF, streamed as bytes.

- `jsonl`: one object per row, `{"chain", "seq", "prev_hash", "row_hash", "event"}` where
  `event` is the stored canonical body byte for byte, so each chain of the export can be
  re-verified away from the database (row_hash = SHA-256(prev_hash || seq || ts_us || event),
  see `chain.py`; a chain's rows link in seq order).
- `csv`: one header line, one line per row; a cell that starts with `=`, `+`, `-`, `@`, tab or
  CR is prefixed with `'` so a spreadsheet shows it instead of evaluating it.
- `ocsf`: one OCSF 1.1 event per line: API Activity (class 6003, category 6) for everything
  but authentication failures, which are Authentication (class 3002, category 3).  activity_id:
  1 create (inference), 2 read (audit access), 3 update / 4 delete (admin actions whose
  `detail.op` says so), 99 other; status_id: 1 success, 2 failure or denied, 99 cancelled.
  Fields OCSF has no place for go under `unmapped`.

Rows are read in pages in the search's merged order (event time, chain, seq; `query.py` says
what that means for rows committed while an export runs); `max_rows` caps it (resource limits
are the caller's policy).
"""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator
from typing import Any, Literal

import msgspec
from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncEngine

from .event import AuditRecord, ts_us
from .query import START, AuditFilter, position, record, rows

__all__ = [
    "CSV_COLUMNS",
    "Format",
    "export",
    "export_csv",
    "export_jsonl",
    "export_ocsf",
    "ocsf_event",
]

Format = Literal["jsonl", "csv", "ocsf"]
_PAGE = 1000
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_encoder = msgspec.json.Encoder(order="sorted")

CSV_COLUMNS = (
    "chain",
    "seq",
    "event_id",
    "ts",
    "kind",
    "outcome",
    "request_id",
    "key_id",
    "team",
    "subject",
    "auth_method",
    "action",
    "model",
    "bundle_digest",
    "deployment",
    "route",
    "http_status",
    "error_class",
    "prompt_tokens",
    "completion_tokens",
    "latency_ms",
    "ttft_ms",
    "finish_reason",
    "sampling",
    "request_bytes",
    "response_bytes",
    "policy_version",
    "decision",
    "degraded",
    "detail",
    "response_format",
    "tools_count",
    "tool_calls_count",
    "inputs_count",
    "client_address",
    "count",
    "row_hash",
)


async def _pages(
    engine: AsyncEngine, flt: AuditFilter, max_rows: int | None
) -> AsyncIterator[list[Row[Any]]]:
    after, left = START, max_rows
    while left is None or left > 0:
        limit = _PAGE if left is None else min(_PAGE, left)
        page = await rows(engine, flt, after=after, limit=limit)
        if not page:
            return
        yield page
        after = position(page[-1])
        if left is not None:
            left -= len(page)
        if len(page) < limit:
            return


async def export_jsonl(
    engine: AsyncEngine, flt: AuditFilter | None = None, *, max_rows: int | None = None
) -> AsyncIterator[bytes]:
    async for page in _pages(engine, flt or AuditFilter(), max_rows):
        lines = [
            _encoder.encode(
                {
                    "chain": str(row.log_id),
                    "seq": int(row.seq),
                    "prev_hash": row.prev_hash,
                    "row_hash": row.row_hash,
                    "event": msgspec.Raw(str(row.body).encode("utf-8")),
                }
            )
            for row in page
        ]
        yield b"\n".join(lines) + b"\n"


def csv_safe(value: object) -> str:
    """A cell as text, neutralised against spreadsheet formula injection."""
    if value is None:
        return ""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, dict):
        text = _encoder.encode(value).decode("utf-8") if value else ""
    else:
        text = str(value)
    return "'" + text if text.startswith(_FORMULA_START) else text


def _csv_row(rec: AuditRecord) -> list[str]:
    ev, who = rec.event, rec.event.principal
    values: dict[str, object] = {
        "chain": rec.chain,
        "seq": rec.seq,
        "ts": ev.ts.isoformat().replace("+00:00", "Z"),
        "key_id": who.key_id if who else None,
        "team": who.team if who else None,
        "subject": who.subject if who else None,
        "auth_method": who.method if who else None,
        "row_hash": rec.row_hash,
    }
    return [csv_safe(values[name] if name in values else getattr(ev, name)) for name in CSV_COLUMNS]


async def export_csv(
    engine: AsyncEngine, flt: AuditFilter | None = None, *, max_rows: int | None = None
) -> AsyncIterator[bytes]:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow(CSV_COLUMNS)
    yield buffer.getvalue().encode("utf-8")
    async for page in _pages(engine, flt or AuditFilter(), max_rows):
        buffer.seek(0)
        buffer.truncate()
        writer.writerows(_csv_row(record(row)) for row in page)
        yield buffer.getvalue().encode("utf-8")


_STATUS = {"success": (1, "Success"), "failure": (2, "Failure"), "denied": (2, "Failure")}
_SEVERITY = {"success": 1, "cancelled": 1, "failure": 2, "denied": 3}
_ADMIN_OPS = {"create": 1, "read": 2, "update": 3, "delete": 4}


def _activity(rec: AuditRecord) -> int:
    kind = rec.event.kind
    if kind == "audit.access":
        return 2
    if kind == "admin.action":
        return _ADMIN_OPS.get(str(rec.event.detail.get("op", "")), 99)
    if kind in ("bundle.loaded", "egress.denied"):
        return 99
    return 1  # inference, and the policy, limit and auth refusals of an inference request


def _prune(value: Any) -> Any:
    if isinstance(value, dict):
        pruned = {k: _prune(v) for k, v in value.items()}
        return {k: v for k, v in pruned.items() if v not in (None, {}, [])}
    if isinstance(value, list):
        return [_prune(v) for v in value]
    return value


def ocsf_event(rec: AuditRecord) -> dict[str, Any]:
    """One record as an OCSF 1.1 event (a plain dict, None values left out)."""
    ev, who = rec.event, rec.event.principal
    auth = ev.kind == "auth.failure"
    class_uid, category_uid = (3002, 3) if auth else (6003, 6)
    activity_id = 1 if auth else _activity(rec)  # 3002: 1 is Logon
    status_id, status = _STATUS.get(ev.outcome, (99, "Other"))
    user = {
        "uid": who.key_id if who else None,
        "name": who.subject if who else None,
        "groups": [{"name": who.team}] if who and who.team else None,
    }
    out: dict[str, Any] = {
        "class_uid": class_uid,
        "category_uid": category_uid,
        "activity_id": activity_id,
        "type_uid": class_uid * 100 + activity_id,
        "time": ts_us(ev.ts) // 1000,
        "severity_id": _SEVERITY[ev.outcome],
        "status_id": status_id,
        "status": status if status_id != 99 else "Cancelled",
        "status_code": str(ev.http_status) if ev.http_status is not None else None,
        "status_detail": ev.error_class,
        "metadata": {
            "version": "1.1.0",
            "uid": ev.event_id,
            "correlation_uid": ev.request_id,
            "sequence": rec.seq,
            "log_name": f"airgate-audit/{rec.chain}",
            "product": {"name": "airgate", "vendor_name": "airgate"},
        },
        "http_request": {"url": {"path": ev.route}} if ev.route else None,
        "src_endpoint": {"ip": ev.client_address} if ev.client_address else None,
        "dst_endpoint": {"svc_name": ev.deployment} if ev.deployment else None,
        "unmapped": {
            "kind": ev.kind,
            "model": ev.model,
            "bundle_digest": ev.bundle_digest,
            "prompt_tokens": ev.prompt_tokens,
            "completion_tokens": ev.completion_tokens,
            "latency_ms": ev.latency_ms,
            "ttft_ms": ev.ttft_ms,
            "finish_reason": ev.finish_reason,
            "sampling": ev.sampling,
            "request_bytes": ev.request_bytes,
            "response_bytes": ev.response_bytes,
            "degraded": ev.degraded or None,
            "detail": ev.detail,
            "response_format": ev.response_format,
            "tools_count": ev.tools_count,
            "tool_calls_count": ev.tool_calls_count,
            "inputs_count": ev.inputs_count,
            "count": ev.count,
            "row_hash": rec.row_hash,
        },
    }
    if auth:
        out["user"] = user
        out["auth_protocol"] = who.method if who else None
    else:
        out["actor"] = {
            "user": user,
            "authorizations": [{"decision": ev.decision, "policy": {"uid": ev.policy_version}}]
            if ev.decision or ev.policy_version
            else None,
        }
        out["api"] = {
            "operation": ev.action or ev.kind,
            "request": {"uid": ev.request_id},
            "response": {"code": ev.http_status, "error": ev.error_class},
        }
    pruned: dict[str, Any] = _prune(out)
    return pruned


async def export_ocsf(
    engine: AsyncEngine, flt: AuditFilter | None = None, *, max_rows: int | None = None
) -> AsyncIterator[bytes]:
    async for page in _pages(engine, flt or AuditFilter(), max_rows):
        yield b"\n".join(_encoder.encode(ocsf_event(record(row))) for row in page) + b"\n"


def export(
    engine: AsyncEngine,
    fmt: Format,
    flt: AuditFilter | None = None,
    *,
    max_rows: int | None = None,
) -> AsyncIterator[bytes]:
    """The export of the rows `flt` selects, in `fmt`, as a stream of byte chunks."""
    exporters = {"jsonl": export_jsonl, "csv": export_csv, "ocsf": export_ocsf}
    return exporters[fmt](engine, flt, max_rows=max_rows)
