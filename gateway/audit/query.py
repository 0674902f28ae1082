"""Search the audit log: filters, stable order by `seq`, opaque cursors.

A cursor is the last `seq` of the previous page, wrapped so clients treat it as opaque; the
next page is `seq > cursor` in `seq` order, so pages never skip or repeat a row while the
writer keeps appending.  Filters are exact matches on the indexed columns; `start` is
inclusive and `end` exclusive, both on the event time.
"""

from __future__ import annotations

import base64
import binascii
from datetime import datetime
from typing import Any

import msgspec
from sqlalchemy import Row, Select, select
from sqlalchemy.ext.asyncio import AsyncEngine

from .errors import AuditCorrupt, InvalidCursor, InvalidQuery
from .event import AuditRecord, EventKind, Outcome, decode_event, ts_us
from .schema import audit_events

__all__ = ["MAX_PAGE", "MAX_SEQ", "AuditFilter", "get", "page", "record", "rows", "search"]

MAX_PAGE = 1000
MAX_SEQ = 2**63 - 1  # the seq column is a signed 64-bit integer (SQLite and PostgreSQL)
_CURSOR_PREFIX = b"seq:"


class AuditFilter(msgspec.Struct, frozen=True, kw_only=True):
    """What a search or an export selects (None: any)."""

    start: datetime | None = None
    end: datetime | None = None
    key_id: str | None = None
    team: str | None = None
    model: str | None = None
    kind: EventKind | None = None
    outcome: Outcome | None = None

    def apply(self, query: Select[Any]) -> Select[Any]:
        c = audit_events.c
        for name, column in (
            ("key_id", c.key_id),
            ("team", c.team),
            ("model", c.model),
            ("kind", c.kind),
            ("outcome", c.outcome),
        ):
            value = getattr(self, name)
            if value is not None:
                query = query.where(column == value)
        if self.start is not None:
            query = query.where(c.ts_us >= _micros(self.start, "start"))
        if self.end is not None:
            query = query.where(c.ts_us < _micros(self.end, "end"))
        return query


def _micros(value: datetime, name: str) -> int:
    if value.tzinfo is None:
        raise InvalidQuery(f"`{name}` must be a timezone-aware datetime")
    return ts_us(value)


def encode_cursor(seq: int) -> str:
    return base64.urlsafe_b64encode(_CURSOR_PREFIX + str(seq).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    try:
        raw = base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise InvalidCursor("the cursor is not one this server issued") from None
    digits = raw.removeprefix(_CURSOR_PREFIX)
    # A seq the column cannot hold would overflow the database driver (a 500), not select.
    if digits.isdigit() and len(digits) <= 19 and encode_cursor(int(digits)) == cursor:
        seq = int(digits)
        if 1 <= seq <= MAX_SEQ:
            return seq
    raise InvalidCursor("the cursor is not one this server issued")


def record(row: Row[Any]) -> AuditRecord:
    """A stored row as a record; `AuditCorrupt` when its body no longer decodes."""
    try:
        event = decode_event(row.body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise AuditCorrupt(f"audit row {row.seq} does not decode; run verify") from None
    return AuditRecord(
        seq=int(row.seq), event=event, prev_hash=str(row.prev_hash), row_hash=str(row.row_hash)
    )


_COLUMNS = (
    audit_events.c.seq,
    audit_events.c.body,
    audit_events.c.prev_hash,
    audit_events.c.row_hash,
)


async def rows(
    engine: AsyncEngine, flt: AuditFilter, *, after: int = 0, limit: int = 100
) -> list[Row[Any]]:
    """Up to `limit` stored rows (seq, body, prev_hash, row_hash) with `seq > after` that match
    `flt`, in `seq` order."""
    query = flt.apply(select(*_COLUMNS)).where(audit_events.c.seq > after)
    query = query.order_by(audit_events.c.seq).limit(limit)
    async with engine.connect() as conn:
        return list((await conn.execute(query)).all())


async def page(
    engine: AsyncEngine, flt: AuditFilter, *, after: int = 0, limit: int = 100
) -> list[AuditRecord]:
    """Up to `limit` records with `seq > after` that match `flt`, in `seq` order."""
    return [record(row) for row in await rows(engine, flt, after=after, limit=limit)]


async def search(
    engine: AsyncEngine,
    *,
    start: datetime | None = None,
    end: datetime | None = None,
    key_id: str | None = None,
    team: str | None = None,
    model: str | None = None,
    kind: EventKind | None = None,
    outcome: Outcome | None = None,
    cursor: str | None = None,
    limit: int = 100,
) -> tuple[list[AuditRecord], str | None]:
    """One page of matching records and the cursor of the next page (None: no more).
    `limit` is clamped to 1..MAX_PAGE."""
    flt = AuditFilter(
        start=start, end=end, key_id=key_id, team=team, model=model, kind=kind, outcome=outcome
    )
    limit = max(1, min(limit, MAX_PAGE))
    after = decode_cursor(cursor) if cursor is not None else 0
    records = await page(engine, flt, after=after, limit=limit + 1)
    if len(records) > limit:
        return records[:limit], encode_cursor(records[limit - 1].seq)
    return records, None


async def get(engine: AsyncEngine, event_id: str) -> AuditRecord | None:
    """The record of one event, or None."""
    query: Select[Any] = select(*_COLUMNS).where(audit_events.c.event_id == event_id)
    async with engine.connect() as conn:
        row = (await conn.execute(query)).first()
    return record(row) if row is not None else None
