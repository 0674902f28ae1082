"""After a crash: every admitted request gets a terminal event.

A request is audited twice: `inference.admitted` before the engine runs, and a terminal event
(completed, failed, cancelled, or `embedding.completed`) when it ends.  A process killed in
between leaves admissions without an end, and a compliance officer cannot tell "still
running" from "lost".  At start, before the open checkpoint, `orphans` finds them among the
rows the last run wrote (after its own open checkpoint; nothing, when that run closed cleanly)
and the writer appends one `inference.interrupted` event for each, naming the same request,
caller, model and route.
"""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from .event import AuditEvent, decode_event, new_event_id
from .schema import audit_checkpoints, audit_events

__all__ = ["interrupted", "orphans"]

_TERMINAL = frozenset(
    {
        "inference.completed",
        "inference.failed",
        "inference.cancelled",
        "inference.interrupted",
        "embedding.completed",
    }
)
_PAGE = 2000


async def orphans(engine: AsyncEngine, log_id: str) -> list[AuditEvent]:
    """The `inference.admitted` events of chain `log_id` since its last clean stop that have
    no terminal event (a start that itself died before its reconciliation committed is covered
    too).  Each writer reconciles only its own chain: another replica's admissions may still
    be running."""
    cps = audit_checkpoints.c
    async with engine.connect() as conn:
        last_kind = (
            await conn.execute(
                select(cps.kind).where(cps.log_id == log_id).order_by(cps.id.desc()).limit(1)
            )
        ).scalar()
        if last_kind is None or last_kind == "close":
            return []
        closed = (
            await conn.execute(
                select(func.max(cps.last_seq)).where(cps.log_id == log_id, cps.kind == "close")
            )
        ).scalar()
        after = int(closed or 0)
        admitted: dict[str, AuditEvent] = {}
        while True:
            rows = (
                await conn.execute(
                    select(audit_events.c.seq, audit_events.c.kind, audit_events.c.body)
                    .where(
                        audit_events.c.log_id == log_id,
                        audit_events.c.seq > after,
                        audit_events.c.kind.in_(("inference.admitted", *_TERMINAL)),
                    )
                    .order_by(audit_events.c.seq)
                    .limit(_PAGE)
                )
            ).all()
            for row in rows:
                try:
                    event = decode_event(str(row.body))
                except (msgspec.DecodeError, msgspec.ValidationError):
                    continue  # verify reports it; reconciliation only completes what it can read
                if event.request_id is None:
                    continue
                if row.kind == "inference.admitted":
                    admitted[event.request_id] = event
                else:
                    admitted.pop(event.request_id, None)
            if len(rows) < _PAGE:
                break
            after = int(rows[-1].seq)
    return list(admitted.values())


def interrupted(admitted: AuditEvent, now: datetime | None = None) -> AuditEvent:
    """The terminal event for an orphaned admission."""
    return AuditEvent(
        event_id=new_event_id(),
        ts=now or datetime.now(UTC),
        kind="inference.interrupted",
        outcome="failure",
        request_id=admitted.request_id,
        principal=admitted.principal,
        action=admitted.action,
        model=admitted.model,
        deployment=admitted.deployment,
        route=admitted.route,
        policy_version=admitted.policy_version,
        error_class="process_ended",
    )
