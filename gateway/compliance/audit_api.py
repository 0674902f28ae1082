"""Compliance API: search, export and verify the audit log.  Auditor or admin role only; every
call is itself audited (`audit.access`).  A team-scoped auditor reads only its own team's
events (`_audit_teams` says how).

    GET /audit/events             filters: start, end, key_id, team, model, kind, outcome,
                                  deployment;
                                  cursor pagination (`next_cursor`)
    GET /audit/events/{event_id}
    GET /audit/export?format=jsonl|csv|ocsf   (streamed; the same filters)
    GET /audit/verify?chain=&first_seq=&last_seq=   every chain (or one): gaps, checkpoints,
                                  witnesses, first bad seq
    GET /audit/checkpoints/latest?chain=&from_size=  a chain's latest signed tree head (default:
                                  this replica's chain), with a consistency proof from an
                                  earlier size
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec
from litestar import Request, Response, Router, get
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, FromQuery, QueryParameter
from litestar.response import Stream

from ..access.auth import Principal, audit_teams
from ..access.stack import Security
from ..audit import (
    AuditFilter,
    EventKind,
    InvalidQuery,
    Outcome,
    export,
    search,
    verify_log,
)
from ..audit import get as get_event
from ..audit.proofs import latest_with_proof
from ..audit.query import CHAIN_PATTERN, MAX_SEQ
from ..audit.witness import WitnessError, collect
from ..errors import InvalidRequest, NotFound, PermissionDenied, ServiceUnavailable
from ..http.guards import record_access, role_required

__all__ = ["compliance_router"]

_encode = msgspec.json.Encoder().encode
_MEDIA = {"jsonl": "application/x-ndjson", "csv": "text/csv", "ocsf": "application/x-ndjson"}


def _json(payload: Any) -> Response[bytes]:
    return Response(_encode(payload), media_type="application/json")


_ACTIONS = {"list_events": "audit.search", "one_event": "audit.get"}


async def _refuse(
    request: Request[Any, Any, Any], security: Security, principal: Principal, message: str
) -> PermissionDenied:
    """Audit the refusal of this call (outcome `denied`); the error to raise."""
    await record_access(
        security,
        request.scope,
        principal,
        kind="audit.access",
        action=_ACTIONS.get(request.route_handler.handler_name, "audit.export"),
        outcome="denied",
        status=403,
        error_class=PermissionDenied.code,
    )
    return PermissionDenied(message)


async def _audit_teams(
    request: Request[Any, Any, Any],
    security: NamedDependency[Security],
    principal: NamedDependency[Principal],
) -> frozenset[str] | None:
    """The teams whose events the caller may read (None: every team; `audit_teams`).

    Admins and global auditors read every team's events; any other auditor only its own
    team's: search and export are confined to it (asking for another team is 403) and another
    team's event is 404, as if it did not exist.  An auditor without a team that is not global
    reads none (403).  Verify and the latest checkpoint do not ask for this: they are open to
    every auditor, since they show counts, sequence numbers, hashes and reason codes but no
    event, and a scoped auditor needs them to trust its own team's events (one chain runs
    through every team's).
    """
    teams = audit_teams(principal)
    if teams is not None and not teams:
        raise await _refuse(
            request, security, principal, "this auditor has no team and may read no events"
        )
    return teams


async def _audit_filter(
    request: Request[Any, Any, Any],
    security: NamedDependency[Security],
    principal: NamedDependency[Principal],
    teams: NamedDependency[frozenset[str] | None],
    start: FromQuery[datetime | None] = None,
    end: FromQuery[datetime | None] = None,
    key_id: FromQuery[str | None] = None,
    team: FromQuery[str | None] = None,
    model: FromQuery[str | None] = None,
    kind: FromQuery[EventKind | None] = None,
    outcome: FromQuery[Outcome | None] = None,
    deployment: FromQuery[str | None] = None,
) -> AuditFilter:
    """The filters search and export share, from the query string, confined to the caller's
    team for a team-scoped auditor."""
    if teams is not None:
        if team is None and len(teams) == 1:
            (team,) = teams
        if team not in teams:
            raise await _refuse(
                request, security, principal, "this auditor may read only its own team's events"
            )
    return AuditFilter(
        start=start,
        end=end,
        key_id=key_id,
        team=team,
        model=model,
        kind=kind,
        outcome=outcome,
        deployment=deployment,
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
    teams: NamedDependency[frozenset[str] | None],
) -> Response[bytes]:
    """One audit event by id (another team's, for a team-scoped auditor: 404)."""
    record = await get_event(security.engine, event_id) if len(event_id) <= 64 else None
    if record is not None and teams is not None:
        who = record.event.principal
        if who is None or who.team not in teams:
            record = None  # not this auditor's: answered as if it did not exist
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
async def verify_log_route(
    request: Request[Any, Any, Any],
    security: NamedDependency[Security],
    principal: NamedDependency[Principal],
    chain: Annotated[str | None, QueryParameter(pattern=CHAIN_PATTERN)] = None,
    first_seq: Annotated[int | None, QueryParameter(ge=1, le=MAX_SEQ)] = None,
    last_seq: Annotated[int | None, QueryParameter(ge=1, le=MAX_SEQ)] = None,
) -> Response[bytes]:
    """Verify every chain (or one), the signed tree heads and the witnesses against the pinned
    keys (the same function as the CLI)."""
    if first_seq is not None and last_seq is not None and first_seq > last_seq:
        raise InvalidRequest("first_seq must not be above last_seq", param="first_seq")
    try:
        witnessed = await asyncio.to_thread(collect, security.audit.witnesses, chain)
    except WitnessError as exc:
        raise ServiceUnavailable(str(exc)) from None
    report = await verify_log(
        security.engine,
        security.trusted_audit_keys,
        witnesses=witnessed,
        chain=chain,
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
        detail={
            "ok": int(report.ok),
            "chains": len(report.chains),
            "rows": sum(c.rows for c in report.chains),
        },
    )
    return _json(report)


@get("/checkpoints/latest")
async def latest_checkpoint(
    request: Request[Any, Any, Any],
    security: NamedDependency[Security],
    principal: NamedDependency[Principal],
    chain: Annotated[str | None, QueryParameter(pattern=CHAIN_PATTERN)] = None,
    from_size: FromQuery[int | None] = None,
) -> Response[bytes]:
    """A chain's latest signed checkpoint and, with `from_size`, the RFC 6962 consistency proof
    from the tree of that size to it (for a witness that keeps checkpoints, not rows)."""
    if from_size is not None and not 0 <= from_size < 2**63:
        raise InvalidRequest("from_size is out of range", param="from_size")
    log_id = chain if chain is not None else security.audit.signing.log_id
    try:
        proved = await latest_with_proof(security.engine, log_id, from_size)
    except InvalidQuery as exc:
        raise InvalidRequest(str(exc), param="from_size") from None
    if proved is None:
        raise NotFound("the audit log has no checkpoint yet")
    await record_access(
        security,
        request.scope,
        principal,
        kind="audit.access",
        action="audit.checkpoint",
        outcome="success",
        status=200,
        detail={"chain": log_id, "size": proved.checkpoint.size},
    )
    return _json(proved)


compliance_router = Router(
    path="/audit",
    route_handlers=[list_events, one_event, export_events, verify_log_route, latest_checkpoint],
    dependencies={
        "principal": role_required("audit.access", "auditor", "admin"),
        "teams": Provide(_audit_teams),
        "selection": Provide(_audit_filter),
    },
    include_in_schema=False,
)
