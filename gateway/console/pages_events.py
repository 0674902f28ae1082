"""Events: the filtered, paginated list; one event with every field, its hashes and the
checkpoint covering it; and the export of the current filter (JSONL, CSV, OCSF, streamed).

The filters are the compliance API's (`AuditFilter`: time range, team, key, model, deployment,
kind, outcome), and pages follow the API's keyset cursor, so page N costs what page 1 does
(BENCHMARKS.md, "console": 1M events in PostgreSQL).  Times typed without a zone are UTC.  A
team-scoped auditor sees only its team's events (as in the API: another team's filter is
refused, another team's event is "not found").  Bad input is shown back as a message of ours
on the page (status 400), never a 500.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final

import msgspec
from litestar import Request, Response, get
from litestar.di import NamedDependency
from litestar.params import FromPath
from litestar.response import Stream

from ..access.auth import audit_teams
from ..access.stack import Security
from ..audit import KINDS, OUTCOMES, AuditFilter, AuditRecord, InvalidQuery, export, search
from ..audit import get as get_event
from .checkpoints import covering
from .web import ConsoleError, Viewer, render_page, secure, viewed

__all__ = ["event_page", "events_page", "export_events"]

PAGE_SIZE: Final = 50
_TEXT_FILTERS = ("team", "key_id", "model", "deployment")
_MEDIA = {"jsonl": "application/x-ndjson", "csv": "text/csv", "ocsf": "application/x-ndjson"}


class _Form(msgspec.Struct, kw_only=True):
    """The filter form as typed (shown back as it was), and what it selects."""

    values: dict[str, str]
    selection: AuditFilter
    errors: list[str]


def _when(text: str, name: str, errors: list[str]) -> datetime | None:
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        errors.append(f"{name}: give a date and time such as 2026-12-01T09:00 (UTC).")
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def _form(request: Request[Any, Any, Any]) -> _Form:
    q = request.query_params
    values = {
        name: str(q.get(name) or "").strip()[:256]
        for name in ("start", "end", "kind", "outcome", *_TEXT_FILTERS)
    }
    errors: list[str] = []
    start = _when(values["start"], "From", errors)
    end = _when(values["end"], "Until", errors)
    text: dict[str, str | None] = {}
    for name in _TEXT_FILTERS:
        value = values[name]
        if len(value) > 128:
            errors.append(f"{name}: at most 128 characters.")
            value = ""
        text[name] = value or None
    kind = values["kind"] if values["kind"] in KINDS else None
    if values["kind"] and kind is None:
        errors.append("Kind: choose one from the list.")
    outcome = values["outcome"] if values["outcome"] in OUTCOMES else None
    if values["outcome"] and outcome is None:
        errors.append("Outcome: choose one from the list.")
    selection = AuditFilter(
        start=start,
        end=end,
        team=text["team"],
        key_id=text["key_id"],
        model=text["model"],
        deployment=text["deployment"],
        kind=kind,
        outcome=outcome,
    )
    return _Form(values=values, selection=selection, errors=errors)


async def _confined(
    request: Request[Any, Any, Any], security: Security, viewer: Viewer, form: _Form, action: str
) -> AuditFilter:
    """The selection confined to the viewer's team for a team-scoped auditor (else 403)."""
    teams = audit_teams(viewer.principal)
    if teams is None:
        return form.selection
    team = form.selection.team
    if team is None and len(teams) == 1:
        (team,) = teams
        form.values["team"] = team
    if team not in teams:
        await viewed(
            request,
            security,
            viewer,
            action,
            outcome="denied",
            status=403,
            error_class="permission_denied",
        )
        raise ConsoleError(403, "This auditor key may read only its own team's events.")
    return msgspec.structs.replace(form.selection, team=team)


def _query(values: dict[str, str], **more: str) -> dict[str, str]:
    """The non-empty filter values (for links that keep the filter), plus `more`."""
    return {k: v for k, v in {**values, **more}.items() if v}


@get("/events", name="console.events")
async def events_page(
    request: Request[Any, Any, Any],
    security: NamedDependency[Security],
    viewer: NamedDependency[Viewer],
) -> Response[str]:
    """One page of events matching the filter, oldest first, with a link to the next page."""
    form = _form(request)
    selection = await _confined(request, security, viewer, form, "console.events")
    cursor = str(request.query_params.get("cursor") or "")[:512] or None
    records: list[AuditRecord] = []
    next_cursor: str | None = None
    if not form.errors:
        try:
            records, next_cursor = await search(
                security.engine,
                **msgspec.structs.asdict(selection),
                cursor=cursor,
                limit=PAGE_SIZE,
            )
        except InvalidQuery:
            form.errors.append("That page link is not valid any more: start from the first page.")
    await viewed(
        request,
        security,
        viewer,
        "console.events",
        status=400 if form.errors else 200,
        outcome="failure" if form.errors else "success",
        detail={"count": len(records)},
    )
    context = {
        "form": form.values,
        "errors": form.errors,
        "records": records,
        "kinds": KINDS,
        "outcomes": OUTCOMES,
        "next_query": _query(form.values, cursor=next_cursor) if next_cursor else None,
        "first_query": _query(form.values) if cursor else None,
        "export_query": _query(form.values),
        "scoped": audit_teams(viewer.principal) is not None,
    }
    return render_page(
        request, "events.html", context, viewer=viewer, status=400 if form.errors else 200
    )


def _fields(record: AuditRecord) -> list[tuple[str, str]]:
    """Every field of the event, flattened (`principal.team`, `sampling.temperature`), in the
    stored order; absent ones left out."""
    out: list[tuple[str, str]] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), inner)
        else:
            out.append((prefix, str(value).lower() if isinstance(value, bool) else str(value)))

    walk("", msgspec.to_builtins(record.event))
    return out


@get("/events/{event_id:str}", name="console.event")
async def event_page(
    event_id: FromPath[str],
    request: Request[Any, Any, Any],
    security: NamedDependency[Security],
    viewer: NamedDependency[Viewer],
) -> Response[str]:
    """One event: every field, its chain position and hashes, and its covering checkpoint."""
    record = await get_event(security.engine, event_id) if len(event_id) <= 64 else None
    teams = audit_teams(viewer.principal)
    if record is not None and teams is not None:
        who = record.event.principal
        if who is None or who.team not in teams:
            record = None  # not this auditor's: as if it did not exist
    await viewed(
        request,
        security,
        viewer,
        "console.event",
        outcome="success" if record else "failure",
        status=200 if record else 404,
    )
    if record is None:
        raise ConsoleError(404, "There is no such event (or it is not your team's).")
    checkpoint = await covering(security.engine, record.chain, record.seq)
    context = {
        "record": record,
        "fields": _fields(record),
        "checkpoint": checkpoint,
        "trusted": {k.key_id for k in security.trusted_audit_keys},
        "checkpoint_time": (
            datetime.fromtimestamp(checkpoint.ts_us / 1e6, UTC) if checkpoint else None
        ),
    }
    return render_page(request, "event.html", context, viewer=viewer)


@get("/export", name="console.export")
async def export_events(
    request: Request[Any, Any, Any],
    security: NamedDependency[Security],
    viewer: NamedDependency[Viewer],
) -> Stream:
    """The events of the current filter as JSONL, CSV (formula-safe) or OCSF, streamed."""
    fmt = str(request.query_params.get("format") or "jsonl")
    if fmt not in _MEDIA:
        raise ConsoleError(400, "Export format: choose JSONL, CSV or OCSF.")
    form = _form(request)
    if form.errors:
        raise ConsoleError(400, " ".join(form.errors))
    selection = await _confined(request, security, viewer, form, "audit.export")
    await viewed(request, security, viewer, "audit.export", detail={"format": fmt})
    stream = Stream(
        export(security.engine, fmt, selection),  # type: ignore[arg-type]
        media_type=_MEDIA[fmt],
        headers={"Content-Disposition": f'attachment; filename="airgate-audit.{fmt}"'},
    )
    secure(stream)
    return stream
