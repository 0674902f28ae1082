"""The audit store on real databases: SQLite (a file in tmp) and PostgreSQL (a throwaway
`airgate_test_<random>` database per test on 127.0.0.1:5432): migrations, the writer (durable
appends, group commit, resume, failure), search, export and the append-only triggers."""

from __future__ import annotations

import asyncio
import csv
import io
import socket
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from databases import PG_HOST, PG_PORT, fresh_database
from sqlalchemy import event as sa_event
from sqlalchemy import func, insert, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from bench.audit_throughput import measure_throughput
from gateway.audit import (
    AuditEvent,
    AuditFilter,
    AuditPrincipal,
    AuditRejected,
    AuditUnavailable,
    AuditWriter,
    InvalidCursor,
    InvalidQuery,
    export,
    get,
    new_event_id,
    search,
    verify,
)
from gateway.audit.chain import GENESIS, link, row_hash
from gateway.audit.event import ts_us
from gateway.audit.export import CSV_COLUMNS
from gateway.audit.schema import audit_checkpoints, audit_events
from gateway.db import create_db_engine, metadata
from gateway.db.migrate import (
    SchemaOutdated,
    current_revision,
    ensure_schema,
    head_revision,
    offline_sql,
    upgrade,
)

KEY = Ed25519PrivateKey.generate()
TRUSTED = [KEY.public_key()]
T0 = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgresql"])
async def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    async with fresh_database(request.param, tmp_path) as url:
        yield url


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    await upgrade(db_url)
    eng = create_db_engine(db_url)
    yield eng
    await eng.dispose()


def make_event(i: int = 0, **changes: Any) -> AuditEvent:
    fields: dict[str, Any] = {
        "event_id": new_event_id(),
        "ts": T0 + timedelta(seconds=i),
        "kind": "inference.completed",
        "outcome": "success",
        "request_id": f"req-{i}",
        "principal": AuditPrincipal(key_id=f"k{i % 3}", team=f"t{i % 2}", method="api_key"),
        "action": "chat.completions",
        "model": f"m{i % 4}",
        "http_status": 200,
        "prompt_tokens": i,
        "completion_tokens": 2 * i,
        "latency_ms": 1.5 * i,
        "sampling": {"temperature": 0.5, "max_tokens": 16},
    }
    fields.update(changes)
    return AuditEvent(**fields)


async def count(engine: AsyncEngine, table: Any = audit_events) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(table))).scalar_one())


# -- migrations -------------------------------------------------------------------------------


async def test_migrations_create_the_schema_the_code_declares(db_url: str) -> None:
    assert await current_revision(db_url) is None
    await ensure_schema(db_url, migrate=True)
    assert await current_revision(db_url) == head_revision()
    await ensure_schema(db_url, migrate=False)  # current: nothing to do
    eng = create_db_engine(db_url)
    try:
        async with eng.connect() as conn:

            def diff(sync_conn: Any) -> list[Any]:
                return list(compare_metadata(MigrationContext.configure(sync_conn), metadata))

            changes = await conn.run_sync(diff)
    finally:
        await eng.dispose()
    audit = [c for c in changes if "audit_" in repr(c)]
    assert audit == []


async def test_postgresql_is_migrated_only_when_allowed(tmp_path: Path) -> None:
    async with fresh_database("postgresql", tmp_path) as url:
        with pytest.raises(SchemaOutdated):
            await ensure_schema(url, migrate=False)
        assert await current_revision(url) is None
        await upgrade(url, "20261129_01_audit")
        if head_revision() != "20261129_01_audit":
            with pytest.raises(SchemaOutdated):
                await ensure_schema(url, migrate=False)
        await ensure_schema(url, migrate=True)
        assert await current_revision(url) == head_revision()
    async with fresh_database("sqlite", tmp_path) as url:
        await ensure_schema(url, migrate=False)  # SQLite: always migrated
        assert await current_revision(url) == head_revision()


@pytest.mark.parametrize("url", ["postgresql+asyncpg://h/db", "sqlite+aiosqlite:///x.db"])
def test_offline_sql_for_a_dba(url: str) -> None:
    sql = offline_sql(url)
    assert "CREATE TABLE audit_events" in sql and "CREATE TABLE audit_checkpoints" in sql
    assert "20261129_01_audit" in sql
    assert ("EXECUTE FUNCTION" if url.startswith("postgresql") else "RAISE(ABORT") in sql


# -- the writer -------------------------------------------------------------------------------


async def test_concurrent_appends_are_gapless_durable_and_verify(engine: AsyncEngine) -> None:
    events = [make_event(i) for i in range(300)]
    async with AuditWriter(engine, signing_key=KEY, checkpoint_every=64) as writer:

        async def appender(k: int) -> list[int]:
            return [await writer.append(e) for e in events[k::30]]

        results = await asyncio.gather(*(appender(k) for k in range(30)))
        for e in events[:5]:  # committed by the time append returns: visible on another connection
            assert (await get(engine, e.event_id)) is not None
        for i in range(20):
            writer.append_nowait(make_event(1000 + i))
    seqs = sorted(s for r in results for s in r)
    assert seqs == list(range(1, 301))
    assert await count(engine) == 320
    by_id = {e.event_id: s for r, k in zip(results, range(30), strict=True)
             for e, s in zip(events[k::30], r, strict=True)}  # fmt: skip
    for e in events[:10]:
        rec = await get(engine, e.event_id)
        assert rec is not None and rec.seq == by_id[e.event_id] and rec.event == e
    report = await verify(engine, TRUSTED)
    assert report.ok and report.chain_ok, report
    assert (report.rows, report.first_seq, report.last_seq) == (320, 1, 320)
    assert report.checkpoints_checked == 5  # 320 = 5 x 64: nothing left for stop to sign
    assert report.chain_only_rows == 0 and report.chain_only_from is None


async def test_group_commit_takes_everything_queued(engine: AsyncEngine) -> None:
    commits = 0

    def on_commit(_conn: Any) -> None:
        nonlocal commits
        commits += 1

    sa_event.listen(engine.sync_engine, "commit", on_commit)
    async with AuditWriter(
        engine, signing_key=KEY, batch_max=50, checkpoint_every=100_000
    ) as writer:
        seqs = await asyncio.gather(*(writer.append(make_event(i)) for i in range(200)))
        stats = writer.stats
        assert sorted(seqs) == list(range(1, 201))
        assert stats.appended == 200 and stats.max_batch == 50
        assert stats.batches == 4  # all 200 were queued before the first commit ran
        # SQLite batches commit on the writer's own connection (one thread hop per batch)
        assert commits == (0 if engine.dialect.name == "sqlite" else 4)
    assert stats.checkpoints == 1  # the tail, at stop
    assert (await verify(engine, TRUSTED)).ok


async def test_resume_after_restart(db_url: str, engine: AsyncEngine) -> None:
    async with AuditWriter(engine, signing_key=KEY, checkpoint_every=10) as writer:
        assert [await writer.append(make_event(i)) for i in range(15)] == list(range(1, 16))
    # a crash after a commit, before any checkpoint: rows 16-18 unchecked
    prev = (await search(engine, limit=1000))[0][-1].row_hash
    rows = []
    for seq in (16, 17, 18):
        rows.append(link(prev, seq, make_event(seq)))
        prev = rows[-1]["row_hash"]
    async with engine.begin() as conn:
        await conn.execute(insert(audit_events), rows)
    report = await verify(engine, TRUSTED)
    assert report.ok and report.chain_only_from == 16 and report.chain_only_rows == 3
    other = create_db_engine(db_url)  # a new process
    try:
        async with AuditWriter(other, signing_key=KEY, checkpoint_every=10) as writer:
            assert [await writer.append(make_event(i)) for i in range(19, 26)] == list(
                range(19, 26)
            )
    finally:
        await other.dispose()
    report = await verify(engine, TRUSTED)
    assert report.ok and report.rows == 25 and report.chain_only_rows == 0
    async with engine.connect() as conn:
        ranges = (
            await conn.execute(
                select(audit_checkpoints.c.first_seq, audit_checkpoints.c.last_seq).order_by(
                    audit_checkpoints.c.id
                )
            )
        ).all()
    assert [tuple(r) for r in ranges] == [(1, 10), (11, 15), (16, 25)]


async def test_a_checkpoint_falls_due_by_time(engine: AsyncEngine) -> None:
    async with AuditWriter(
        engine, signing_key=KEY, checkpoint_every=1000, checkpoint_interval_s=0.01
    ) as writer:
        await writer.append(make_event(1))
        # waiting for the condition (the writer task's own timer), not for a time
        while writer.stats.checkpoints == 0:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        assert await count(engine, audit_checkpoints) == 1
        await writer.append(make_event(2))
    report = await verify(engine, TRUSTED)
    assert report.ok and report.checkpoints_checked == 2


async def _rename(engine: AsyncEngine, old: str, new: str) -> None:
    async with engine.begin() as conn:
        await conn.execute(text(f"ALTER TABLE {old} RENAME TO {new}"))


async def test_append_fails_closed_while_the_table_is_gone_then_recovers(
    engine: AsyncEngine,
) -> None:
    async with AuditWriter(engine, signing_key=KEY, checkpoint_every=1000) as writer:
        assert await writer.append(make_event(1)) == 1
        await _rename(engine, "audit_events", "audit_events_away")
        results = await asyncio.gather(
            *(writer.append(make_event(i)) for i in range(2, 12)), return_exceptions=True
        )
        assert all(isinstance(r, AuditUnavailable) for r in results), results
        assert writer.stats.failures >= 1
        await _rename(engine, "audit_events_away", "audit_events")
        assert await writer.append(make_event(12)) == 2  # head re-read: no gap, no fork
    report = await verify(engine, TRUSTED)
    assert report.ok and report.rows == 2


async def test_duplicate_event_ids_fail_alone_and_retries_are_idempotent(
    engine: AsyncEngine,
) -> None:
    async with AuditWriter(engine, signing_key=KEY) as writer:
        first = make_event(1)
        assert await writer.append(first) == 1
        assert await writer.append(first) == 1  # the same event again: its stored seq
        impostor = make_event(2, event_id=first.event_id)
        results = await asyncio.gather(
            writer.append(make_event(3)),
            writer.append(impostor),
            writer.append(make_event(4)),
            return_exceptions=True,
        )
        assert isinstance(results[1], AuditRejected)
        assert sorted(r for r in results if isinstance(r, int)) == [2, 3]
        assert writer.stats.rejected == 1
    assert (await verify(engine, TRUSTED)).ok


async def test_a_stopped_writer_refuses(engine: AsyncEngine) -> None:
    writer = AuditWriter(engine, signing_key=KEY)
    with pytest.raises(AuditUnavailable):
        await writer.append(make_event())
    writer.append_nowait(make_event())
    assert writer.stats.dropped == 1
    async with writer:
        assert writer.running
    assert not writer.running
    with pytest.raises(AuditUnavailable):
        await writer.append(make_event())


async def test_start_fails_when_postgresql_is_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    eng = create_db_engine(f"postgresql+asyncpg://postgres@127.0.0.1:{port}/none")
    try:
        with pytest.raises(AuditUnavailable):
            await AuditWriter(eng, signing_key=KEY).start()
    finally:
        await eng.dispose()


class Proxy:
    """A TCP proxy in front of PostgreSQL that the test can cut (connections reset, port
    closed) and restore on the same port."""

    def __init__(self) -> None:
        self.port = 0
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(PG_HOST, PG_PORT)
        self.writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except OSError:
                pass
            finally:
                dst.transport.abort()

        tasks = [
            asyncio.create_task(pipe(reader, up_writer)),
            asyncio.create_task(pipe(up_reader, writer)),
        ]
        self.tasks.update(tasks)
        await asyncio.gather(*tasks)

    async def cut(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in self.writers:
            w.transport.abort()
        self.writers.clear()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks.clear()
        await self.server.wait_closed()


async def test_append_fails_closed_when_postgresql_goes_away_then_recovers(
    tmp_path: Path,
) -> None:
    async with fresh_database("postgresql", tmp_path) as url:
        await upgrade(url)
        proxy = Proxy()
        await proxy.start()
        eng = create_db_engine(url.replace(f":{PG_PORT}/", f":{proxy.port}/"))
        try:
            async with AuditWriter(eng, signing_key=KEY, checkpoint_every=1000) as writer:
                assert await writer.append(make_event(1)) == 1
                await proxy.cut()
                for i in (2, 3):  # a dead pooled connection, then a refused connect
                    with pytest.raises(AuditUnavailable):
                        await writer.append(make_event(i))
                await proxy.start()
                assert await writer.append(make_event(4)) == 2
            report = await verify(eng, TRUSTED)
            assert report.ok and report.rows == 2
        finally:
            await eng.dispose()
            await proxy.cut()


async def test_measure_throughput(engine: AsyncEngine) -> None:
    rate = await measure_throughput(engine, 400, concurrency=40)
    assert rate > 0
    assert await count(engine) == 400


# -- search and export ------------------------------------------------------------------------


@pytest.fixture
async def populated(engine: AsyncEngine) -> list[AuditEvent]:
    kinds = ["inference.completed", "inference.failed", "policy.denied", "audit.access"]
    outcomes = {"inference.completed": "success", "inference.failed": "failure",
                "policy.denied": "denied", "audit.access": "success"}  # fmt: skip
    events = []
    for i in range(45):
        kind = kinds[i % 4]
        events.append(make_event(i, kind=kind, outcome=outcomes[kind]))
    async with AuditWriter(engine, signing_key=KEY, checkpoint_every=16) as writer:
        for e in events:
            await writer.append(e)
    return events


async def _all_pages(engine: AsyncEngine, limit: int, **filters: Any) -> list[AuditEvent]:
    found: list[AuditEvent] = []
    cursor: str | None = None
    while True:
        records, cursor = await search(engine, cursor=cursor, limit=limit, **filters)
        assert len(records) <= limit
        found += [r.event for r in records]
        if cursor is None:
            return found
        assert len(records) == limit


async def test_search_filters_and_cursor_pagination(
    engine: AsyncEngine, populated: list[AuditEvent]
) -> None:
    cases: list[tuple[dict[str, Any], Callable[[AuditEvent], bool]]] = [
        ({}, lambda e: True),
        ({"key_id": "k1"}, lambda e: e.principal is not None and e.principal.key_id == "k1"),
        ({"team": "t0"}, lambda e: e.principal is not None and e.principal.team == "t0"),
        ({"model": "m3"}, lambda e: e.model == "m3"),
        ({"kind": "policy.denied"}, lambda e: e.kind == "policy.denied"),
        ({"outcome": "success"}, lambda e: e.outcome == "success"),
        ({"start": T0 + timedelta(seconds=10), "end": T0 + timedelta(seconds=20)},
         lambda e: T0 + timedelta(seconds=10) <= e.ts < T0 + timedelta(seconds=20)),
        ({"key_id": "k0", "kind": "inference.completed", "model": "m0"},
         lambda e: e.principal is not None and e.principal.key_id == "k0"
         and e.kind == "inference.completed" and e.model == "m0"),
        ({"team": "nobody"}, lambda e: False),
    ]  # fmt: skip
    for filters, expected in cases:
        want = [e for e in populated if expected(e)]
        for limit in (1, 7, 100):
            assert await _all_pages(engine, limit, **filters) == want, (filters, limit)
    records, cursor = await search(engine, limit=10)
    assert [r.seq for r in records] == list(range(1, 11)) and cursor is not None
    more, _ = await search(engine, cursor=cursor, limit=10)
    assert [r.seq for r in more] == list(range(11, 21))
    assert records[1].prev_hash == records[0].row_hash


async def test_search_rejects_bad_input(engine: AsyncEngine, populated: list[AuditEvent]) -> None:
    with pytest.raises(InvalidCursor):
        await search(engine, cursor="not-a-cursor")
    with pytest.raises(InvalidQuery):
        await search(engine, start=datetime(2026, 1, 1))
    records, _ = await search(engine, limit=100_000)
    assert len(records) == 45  # clamped to MAX_PAGE, which is more than there is
    assert await get(engine, "no-such-event") is None


async def _collect(stream: AsyncIterator[bytes]) -> bytes:
    return b"".join([chunk async for chunk in stream])


async def test_export_jsonl_can_be_reverified_offline(
    engine: AsyncEngine, populated: list[AuditEvent]
) -> None:
    lines = (await _collect(export(engine, "jsonl"))).splitlines()
    assert len(lines) == 45
    prev = GENESIS
    for n, line in enumerate(lines, 1):
        obj = msgspec.json.decode(line)
        assert obj["seq"] == n and obj["prev_hash"] == prev
        # the stored canonical body, byte for byte
        body = bytes(msgspec.json.decode(line, type=dict[str, msgspec.Raw])["event"])
        ts = ts_us(msgspec.json.decode(body, type=AuditEvent).ts)
        assert row_hash(prev, n, ts, body) == obj["row_hash"]
        prev = obj["row_hash"]
    some = await _collect(export(engine, "jsonl", AuditFilter(team="t1"), max_rows=5))
    assert len(some.splitlines()) == 5


async def test_export_csv_is_formula_safe(engine: AsyncEngine) -> None:
    hostile = make_event(
        1,
        principal=AuditPrincipal(key_id="+cmd", team="-2+3", subject="=HYPERLINK(x)"),
        model="@SUM",
    )
    async with AuditWriter(engine, signing_key=KEY) as writer:
        await writer.append(make_event(0))
        await writer.append(hostile)
    data = (await _collect(export(engine, "csv"))).decode()
    rows = list(csv.reader(io.StringIO(data)))
    assert rows[0] == list(CSV_COLUMNS) and len(rows) == 3
    row = dict(zip(CSV_COLUMNS, rows[2], strict=True))
    assert (row["key_id"], row["team"], row["subject"], row["model"]) == (
        "'+cmd",
        "'-2+3",
        "'=HYPERLINK(x)",
        "'@SUM",
    )
    assert row["seq"] == "2" and row["ts"] == "2026-11-29T09:00:01Z"
    assert row["sampling"] == '{"max_tokens":16,"temperature":0.5}'
    for cells in rows[1:]:
        assert not any(c.startswith(("=", "+", "-", "@", "\t", "\r")) for c in cells)


async def test_export_ocsf(engine: AsyncEngine, populated: list[AuditEvent]) -> None:
    lines = (await _collect(export(engine, "ocsf", AuditFilter(kind="policy.denied")))).splitlines()
    assert len(lines) == len([e for e in populated if e.kind == "policy.denied"])
    for line in lines:
        obj = msgspec.json.decode(line)
        assert (obj["class_uid"], obj["category_uid"], obj["activity_id"]) == (6003, 6, 1)
        assert obj["type_uid"] == 600301 and obj["status_id"] == 2


# -- append-only --------------------------------------------------------------------------------


async def _expect_refused(engine: AsyncEngine, sql: str) -> None:
    with pytest.raises(DBAPIError, match="append-only"):
        async with engine.begin() as conn:
            await conn.execute(text(sql))


async def test_the_tables_refuse_update_and_delete(
    engine: AsyncEngine, populated: list[AuditEvent]
) -> None:
    for table in ("audit_events", "audit_checkpoints"):
        await _expect_refused(engine, f"UPDATE {table} SET ts_us = 0")
        await _expect_refused(engine, f"DELETE FROM {table}")
        if engine.dialect.name == "postgresql":
            await _expect_refused(engine, f"TRUNCATE {table}")
    assert await count(engine) == 45
    assert (await verify(engine, TRUSTED)).ok
