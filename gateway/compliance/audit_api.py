"""Compliance API: search, export and verify the audit log.  Auditor or admin role only; every
call is itself audited (`audit.access`).

    GET /audit/events             filters: start, end, key_id, team, model, kind, outcome;
                                  cursor pagination (`next_cursor`)
    GET /audit/events/{event_id}
    GET /audit/export?format=jsonl|csv|ocsf   (streamed; the same filters)
    GET /audit/verify?first_seq=&last_seq=    chain, gaps, checkpoints, first bad seq
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import msgspec
from litestar import Request, Response, Router, get
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, FromQuery
from litestar.response import Stream

from ..access.auth import Principal
from ..access.stack import Security
from ..audit import (
    AuditFilter,
    EventKind,
    InvalidQuery,
    Outcome,
    export,
    search,
    verify,
)
from ..audit import get as get_event
from ..errors import InvalidRequest, NotFound
from ..http.guards import record_access, role_required

__all__ = ["compliance_router"]

_encode = msgspec.json.Encoder().encode
_MEDIA = {"jsonl": "application/x-ndjson", "csv": "text/csv", "ocsf": "application/x-ndjson"}


def _json(payload: Any) -> Response[bytes]:
    return Response(_encode(payload), media_type="application/json")


def _audit_filter(
    start: FromQuery[datetime | None] = None,
    end: FromQuery[datetime | None] = None,
    key_id: FromQuery[str | None] = None,
    team: FromQuery[str | None] = None,
    model: FromQuery[str | None] = None,
    kind: FromQuery[EventKind | None] = None,
    outcome: FromQuery[Outcome | None] = None,
) -> AuditFilter:
    """The filters search and export share, from the query string."""
    return AuditFilter(
        start=start, end=end, key_id=key_id, team=team, model=model, kind=kind, outcome=outcome
    )


@get("/events")
async def list_events(
    request: Request[Any, Any, Any],
    security: NamedDependency[Security],
    principal: NamedDependency[Principal],
    selection: NamedDependency[AuditFilter],
    cursor: FromQuery[str | None] = None,
    limit: FromQuery[int] = 100,
) -> Response[bytes]:
    """One page of audit events, oldest first; follow `next_cursor` for the next page."""
    try:
        records, next_cursor = await search(
            security.engine, **msgspec.structs.asdict(selection), cursor=cursor, limit=limit
        )
    except InvalidQuery:
        raise InvalidRequest("invalid filter or cursor", param="cursor") from None
    await record_access(
        security,
        request.scope,
        principal,
        kind="audit.access",
        action="audit.search",
        outcome="success",
        status=200,
        detail={"count": len(records)},
    )
    return _json({"data": records, "next_cursor": next_cursor})


@get("/events/{event_id:str}")
async def one_event(
    event_id: FromPath[str],
    request: Request[Any, Any, Any],
    security: NamedDependency[Security],
    principal: NamedDependency[Principal],
) -> Response[bytes]:
    """One audit event by id."""
    record = await get_event(security.engine, event_id) if len(event_id) <= 64 else None
    await record_access(
        security,
        request.scope,
        principal,
        kind="audit.access",
        action="audit.get",
        outcome="success" if record else "failure",
        status=200 if record else 404,
    )
    if record is None:
        raise NotFound("no such audit event")
    return _json(record)


@get("/export")
async def export_events(
    request: Request[Any, Any, Any],
    security: NamedDependency[Security],
    principal: NamedDependency[Principal],
    selection: NamedDependency[AuditFilter],
    format: FromQuery[Literal["jsonl", "csv", "ocsf"]] = "jsonl",
) -> Stream:
    """The selected events as JSONL, CSV (formula-injection safe) or OCSF 6003, streamed."""
    await record_access(
        security,
        request.scope,
        principal,
        kind="audit.access",
        action="audit.export",
        outcome="success",
        status=200,
        detail={"format": format},
    )
    return Stream(
        export(security.engine, format, selection),
        media_type=_MEDIA[format],
        headers={"Content-Disposition": f'attachment; filename="airgate-audit.{format}"'},
    )


@get("/verify")
async def verify_log(
    request: Request[Any, Any, Any],
    security: NamedDependency[Security],
    principal: NamedDependency[Principal],
    first_seq: FromQuery[int | None] = None,
    last_seq: FromQuery[int | None] = None,
) -> Response[bytes]:
    """Verify the hash chain and the signed checkpoints (the same function as the CLI)."""
    report = await verify(
        security.engine,
        [security.audit_key.public_key()],
        first_seq=first_seq,
        last_seq=last_seq,
    )
    await record_access(
        security,
        request.scope,
        principal,
        kind="audit.access",
        action="audit.verify",
        outcome="success",
        status=200,
        detail={"ok": int(report.ok), "rows": report.rows},
    )
    return _json(report)


compliance_router = Router(
    path="/audit",
    route_handlers=[list_events, one_event, export_events, verify_log],
    dependencies={
        "principal": role_required("audit.access", "auditor", "admin"),
        "selection": Provide(_audit_filter, sync_to_thread=False),
    },
    include_in_schema=False,
)
