"""The console pages the benchmark fetches, and the plans PostgreSQL picks for their queries.

Each page is a console URL and the `AuditFilter` (and cursor position) its search runs with;
`explain` runs EXPLAIN (ANALYZE) on exactly the SELECT the search issues (`query.rows_query`,
one row more than the page, as `search` asks) and summarises the plan: its scan nodes and the
execution time PostgreSQL reports.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import asyncpg
from sqlalchemy.dialects import postgresql

from bench.console_fill import LogShape
from gateway.audit.query import START, AuditFilter, Position, encode_cursor, rows_query

__all__ = ["Page", "explain", "pages", "plan_summary"]

PAGE = 50  # the console's page size


@dataclass(frozen=True)
class Page:
    label: str
    path: str
    flt: AuditFilter | None  # None: not a search (the event page)
    after: Position = START


def _events(label: str, flt: AuditFilter, after: Position = START, **params: str) -> Page:
    query = {k: v for k, v in params.items() if v}
    if after != START:
        query["cursor"] = encode_cursor(after)
    return Page(label, "/console/events" + ("?" + urlencode(query) if query else ""), flt, after)


async def _middle(conn: asyncpg.Connection, where: str = "TRUE", *args: Any) -> asyncpg.Record:
    count = await conn.fetchval(f"SELECT count(*) FROM audit_events WHERE {where}", *args)
    return await conn.fetchrow(
        f"SELECT ts_us, log_id, seq, event_id FROM audit_events WHERE {where} "
        f"ORDER BY ts_us, log_id, seq OFFSET {count // 2} LIMIT 1",
        *args,
    )


def _at(row: asyncpg.Record) -> Position:
    return (int(row["ts_us"]), str(row["log_id"]), int(row["seq"]))


async def pages(dsn: str, shape: LogShape) -> list[Page]:
    """The pages to time, with values that exist in the log (the middle of it for cursors)."""
    team, key, model = shape.teams[3], shape.keys[5 * 12 + 1], shape.models[2]
    day = (shape.start + timedelta(days=15)).replace(hour=9, minute=0, second=0)
    start, end = (
        day.strftime("%Y-%m-%dT%H:%M"),
        (day + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M"),
    )
    span = {"start": day, "end": day + timedelta(days=1)}
    conn = await asyncpg.connect(dsn)
    try:
        middle = await _middle(conn)
        team_middle = await _middle(conn, "team = $1", team)
    finally:
        await conn.close()
    return [
        _events("first page (no filter)", AuditFilter()),
        _events("team", AuditFilter(team=team), team=team),
        _events("key", AuditFilter(key_id=key), key_id=key),
        _events("model", AuditFilter(model=model), model=model),
        _events(
            "kind + outcome",
            AuditFilter(kind="policy.denied", outcome="denied"),
            kind="policy.denied",
            outcome="denied",
        ),
        _events(
            "kind + outcome, no match",
            AuditFilter(kind="inference.completed", outcome="failure"),
            kind="inference.completed",
            outcome="failure",
        ),
        _events(
            "deployment",
            AuditFilter(deployment=shape.deployments[1]),
            deployment=shape.deployments[1],
        ),
        _events("time range (one day)", AuditFilter(**span), start=start, end=end),
        _events(
            "team + time range", AuditFilter(team=team, **span), team=team, start=start, end=end
        ),
        _events("deep page (cursor at row 500,000)", AuditFilter(), _at(middle)),
        _events("team, deep page (cursor)", AuditFilter(team=team), _at(team_middle), team=team),
        Page("event detail", f"/console/events/{middle['event_id']}", None),
    ]


def plan_summary(plan: dict[str, Any]) -> str:
    """`Limit > Index Scan using ix_… ` and the execution time, from EXPLAIN (FORMAT JSON)."""
    nodes: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        name = node["Node Type"]
        if "Index Name" in node:
            name += f" {node['Index Name']}"
        nodes.append(name)
        for child in node.get("Plans", ()):
            walk(child)

    walk(plan["Plan"])
    return f"{' > '.join(nodes)}; {plan['Execution Time']:.1f} ms"


def compiled(flt: AuditFilter, after: Position, limit: int = PAGE + 1) -> str:
    query = rows_query(flt, after=after, limit=limit)
    return str(query.compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}))


async def explain(dsn: str, wanted: list[Page]) -> dict[str, str]:
    """Each search page's plan summary, by label."""
    conn = await asyncpg.connect(dsn)
    out: dict[str, str] = {}
    try:
        for page in wanted:
            if page.flt is None:
                continue
            sql = compiled(page.flt, page.after)
            raw = await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}")
            out[page.label] = plan_summary(json.loads(raw)[0])
    finally:
        await conn.close()
    return out


if __name__ == "__main__":
    print(compiled(AuditFilter(team="t", start=datetime(2026, 1, 1, tzinfo=UTC)), (1, "ab", 2)))
