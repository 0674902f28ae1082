"""Search the audit log: filters, every chain merged by time, opaque cursors.

Rows are ordered by (event time, chain, seq): one replica's chain interleaves with the
others' as the events happened, and each record names its chain.  A cursor is the position of
the last row of the previous page, wrapped so clients treat it as opaque; the next page starts
strictly after it, so pages never repeat a row.  A row committed after a page was read with an
event time before that page's end (a request admitted earlier on another replica, finished
later) is found by a new search over its time, not by the next page: writers stamp events when
they happen, not when they commit.  Filters are exact matches on the indexed columns; `start`
is inclusive and `end` exclusive, both on the event time.
"""

from __future__ import annotations

import base64
import binascii
from datetime import datetime
from typing import Any

import msgspec
from sqlalchemy import Row, Select, select, tuple_
from sqlalchemy.ext.asyncio import AsyncEngine

from .errors import AuditCorrupt, InvalidCursor, InvalidQuery
from .event import AuditRecord, EventKind, Outcome, decode_event, ts_us
from .schema import audit_events

__all__ = [
    "CHAIN_PATTERN",
    "MAX_PAGE",
    "MAX_SEQ",
    "START",
    "AuditFilter",
    "Position",
    "get",
    "page",
    "position",
    "record",
    "rows",
    "rows_query",
    "search",
]

MAX_PAGE = 1000
MAX_SEQ = 2**63 - 1  # the seq column is a signed 64-bit integer (SQLite and PostgreSQL)
_CURSOR_PREFIX = b"at:"
_LOG_ID = frozenset("0123456789abcdef")
CHAIN_PATTERN = r"^[0-9a-f]{1,32}$"  # a chain id as queries may name it

Position = tuple[int, str, int]  # (ts_us, log_id, seq): a row's place in the merged order
START: Position = (-MAX_SEQ - 1, "", 0)


class AuditFilter(msgspec.Struct, frozen=True, kw_only=True):
    """What a search or an export selects (None: any)."""

    start: datetime | None = None
    end: datetime | None = None
    key_id: str | None = None
    team: str | None = None
    model: str | None = None
    kind: EventKind | None = None
    outcome: Outcome | None = None
    deployment: str | None = None

    def apply(self, query: Select[Any]) -> Select[Any]:
        c = audit_events.c
        for name, column in (
            ("key_id", c.key_id),
            ("team", c.team),
            ("model", c.model),
            ("kind", c.kind),
            ("outcome", c.outcome),
            ("deployment", c.deployment),
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


def encode_cursor(at: Position) -> str:
    text = f"{at[0]}:{at[1]}:{at[2]}".encode()
    return base64.urlsafe_b64encode(_CURSOR_PREFIX + text).decode().rstrip("=")


def decode_cursor(cursor: str) -> Position:
    try:
        raw = base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise InvalidCursor("the cursor is not one this server issued") from None
    parts = raw.removeprefix(_CURSOR_PREFIX).split(b":")
    # Numbers the columns cannot hold would overflow the database driver (a 500), not select.
    if len(parts) == 3 and all(p.isdigit() and len(p) <= 19 for p in (parts[0], parts[2])):
        at = (int(parts[0]), parts[1].decode("ascii", "replace"), int(parts[2]))
        if (
            at[0] <= MAX_SEQ
            and 1 <= at[2] <= MAX_SEQ
            and len(at[1]) <= 32
            and set(at[1]) <= _LOG_ID
            and encode_cursor(at) == cursor
        ):
            return at
    raise InvalidCursor("the cursor is not one this server issued")


def position(row: Row[Any]) -> Position:
    return (int(row.ts_us), str(row.log_id), int(row.seq))


def record(row: Row[Any]) -> AuditRecord:
    """A stored row as a record; `AuditCorrupt` when its body no longer decodes."""
    try:
        event = decode_event(row.body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise AuditCorrupt(
            f"audit row {row.seq} of chain {row.log_id} does not decode; run verify"
        ) from None
    return AuditRecord(
        chain=str(row.log_id),
        seq=int(row.seq),
        event=event,
        prev_hash=str(row.prev_hash),
        row_hash=str(row.row_hash),
    )


_COLUMNS = (
    audit_events.c.ts_us,
    audit_events.c.log_id,
    audit_events.c.seq,
    audit_events.c.body,
    audit_events.c.prev_hash,
    audit_events.c.row_hash,
)


def rows_query(flt: AuditFilter, *, after: Position = START, limit: int = 100) -> Select[Any]:
    """The SELECT of `rows` (what the benchmark and the plan tests EXPLAIN)."""
    c = audit_events.c
    order = (c.ts_us, c.log_id, c.seq)
    query = flt.apply(select(*_COLUMNS))
    if after != START:
        # PostgreSQL also bounds a filter's (column, ts_us) index scan with this row
        # comparison (as `ts_us >=`): a deep page does not read the rows before the cursor.
        query = query.where(tuple_(*order) > tuple_(*after))
    return query.order_by(*order).limit(limit)


async def rows(
    engine: AsyncEngine, flt: AuditFilter, *, after: Position = START, limit: int = 100
) -> list[Row[Any]]:
    """Up to `limit` stored rows (ts_us, log_id, seq, body, prev_hash, row_hash) after `after`
    that match `flt`, in the merged order."""
    async with engine.connect() as conn:
        return list((await conn.execute(rows_query(flt, after=after, limit=limit))).all())


async def page(
    engine: AsyncEngine, flt: AuditFilter, *, after: Position = START, limit: int = 100
) -> list[AuditRecord]:
    """Up to `limit` records after `after` that match `flt`, in the merged order."""
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
    deployment: str | None = None,
    cursor: str | None = None,
    limit: int = 100,
) -> tuple[list[AuditRecord], str | None]:
    """One page of matching records and the cursor of the next page (None: no more).
    `limit` is clamped to 1..MAX_PAGE."""
    flt = AuditFilter(
        start=start,
        end=end,
        key_id=key_id,
        team=team,
        model=model,
        kind=kind,
        outcome=outcome,
        deployment=deployment,
    )
    limit = max(1, min(limit, MAX_PAGE))
    after = decode_cursor(cursor) if cursor is not None else START
    found = await rows(engine, flt, after=after, limit=limit + 1)
    if len(found) > limit:
        return [record(r) for r in found[:limit]], encode_cursor(position(found[limit - 1]))
    return [record(r) for r in found], None


async def get(engine: AsyncEngine, event_id: str) -> AuditRecord | None:
    """The record of one event, or None."""
    query: Select[Any] = select(*_COLUMNS).where(audit_events.c.event_id == event_id)
    async with engine.connect() as conn:
        row = (await conn.execute(query)).first()
    return record(row) if row is not None else None
