"""The audit store on real databases: SQLite (a file in tmp) and PostgreSQL (a throwaway
`airgate_test_<random>` database per test on 127.0.0.1:5432): migrations, the writer (durable
appends, each committed with its signed tree head, group commit, resume, witnesses, failure),
search, export and the append-only triggers."""

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

from bench.audit_throughput import measure
from bundles.kms.signer import LocalSigner
from gateway.audit import (
    AuditCorrupt,
    AuditEvent,
    AuditFilter,
    AuditPrincipal,
    AuditRejected,
    AuditUnavailable,
    AuditWriter,
    Checkpoint,
    InvalidCursor,
    InvalidQuery,
    export,
    get,
    new_event_id,
    search,
    verify,
)
from gateway.audit._head import read_head
from gateway.audit.chain import GENESIS, link, row_hash
from gateway.audit.checkpoint import (
    check_signature,
    checkpoint_from_row,
    checkpoint_hash,
    trusted_by_id,
)
from gateway.audit.event import ts_us
from gateway.audit.export import CSV_COLUMNS
from gateway.audit.merkle import merkle_root
from gateway.audit.schema import audit_checkpoints, audit_events
from gateway.audit.witness import DirectoryWitness, collect
from gateway.db import create_db_engine, metadata
from gateway.db.migrate import (
    SchemaOutdated,
    current_revision,
    ensure_schema,
    head_revision,
    offline_sql,
    upgrade,
)

SIGNER = LocalSigner(Ed25519PrivateKey.generate())
TRUSTED = [SIGNER.verify_key]
LOG_ID = "0123456789abcdef"
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


def writer_on(engine: AsyncEngine, **options: Any) -> AuditWriter:
    return AuditWriter(engine, signer=SIGNER, log_id=LOG_ID, **options)


async def checkpoints(engine: AsyncEngine) -> list[Checkpoint]:
    async with engine.connect() as conn:
        query = select(audit_checkpoints).order_by(audit_checkpoints.c.id)
        return [checkpoint_from_row(row) for row in (await conn.execute(query)).all()]


async def row_hashes(engine: AsyncEngine) -> list[bytes]:
    async with engine.connect() as conn:
        query = select(audit_events.c.row_hash).order_by(audit_events.c.seq)
        return [bytes.fromhex(h) for h in (await conn.execute(query)).scalars()]


def assert_signed_tree_heads(cps: list[Checkpoint], hashes: list[bytes]) -> None:
    """Each checkpoint is the tree head over rows 1..size (recomputed from scratch), chained to
    the one before and signed by the pinned key; the batch checkpoints cover consecutive ranges
    and together every row; open and close add none."""
    trusted = trusted_by_id(TRUSTED)
    prev: Checkpoint | None = None
    covered = 0
    for cp in cps:
        assert (cp.id, cp.prev_hash, cp.log_id) == (
            prev.id + 1 if prev else 1,
            checkpoint_hash(prev),
            LOG_ID,
        )
        assert cp.root == merkle_root(hashes[: cp.size]).hex(), cp.id
        assert check_signature(cp, trusted) == "ok", cp.id
        if cp.kind == "batch":
            assert cp.count > 0 and (cp.first_seq, cp.size) == (covered + 1, covered + cp.count)
            covered = cp.size
        else:
            assert (cp.count, cp.size) == (0, covered), cp.id
        prev = cp
    assert covered == len(hashes)


async def test_concurrent_appends_are_gapless_durable_signed_and_verify(
    engine: AsyncEngine,
) -> None:
    events = [make_event(i) for i in range(300)]
    async with writer_on(engine, checkpoint_every=64) as writer:

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
    assert report.ok and report.chain_ok and report.tree_checked, report
    assert (report.rows, report.first_seq, report.last_seq) == (320, 1, 320)
    assert (report.log_id, report.epoch) == (LOG_ID, 1)
    assert report.trusted_keys == [SIGNER.verify_key.key_id]
    assert report.chain_only_rows == 0 and report.chain_only_from is None
    cps = await checkpoints(engine)
    assert report.checkpoints_checked == len(cps) == writer.stats.checkpoints
    assert (cps[0].kind, cps[-1].kind) == ("open", "close")
    batches = [cp for cp in cps if cp.kind == "batch"]
    assert len(batches) >= writer.stats.batches and max(cp.count for cp in batches) <= 64
    assert_signed_tree_heads(cps, await row_hashes(engine))


async def test_an_append_returns_only_once_a_signed_checkpoint_covers_it(
    db_url: str, engine: AsyncEngine
) -> None:
    other = create_db_engine(db_url)  # what another process sees
    trusted = trusted_by_id(TRUSTED)

    async def covered(seq: int) -> None:
        latest = (await checkpoints(other))[-1]
        assert latest.size >= seq and latest.kind == "batch"
        assert check_signature(latest, trusted) == "ok"

    try:
        async with writer_on(engine) as writer:
            assert [cp.kind for cp in await checkpoints(other)] == ["open"]
            for i in range(5):
                await covered(await writer.append(make_event(i)))

            async def one(i: int) -> None:
                await covered(await writer.append(make_event(i)))

            await asyncio.gather(*(one(i) for i in range(5, 105)))
            head = await read_head(other, LOG_ID)  # the rows end exactly at the last checkpoint
            assert head.checkpoint is not None and head.seq == head.checkpoint.size == 105
        assert (await checkpoints(other))[-1].kind == "close"
    finally:
        await other.dispose()


async def test_group_commit_takes_everything_queued(engine: AsyncEngine) -> None:
    commits = 0

    def on_commit(_conn: Any) -> None:
        nonlocal commits
        commits += 1

    sa_event.listen(engine.sync_engine, "commit", on_commit)
    async with writer_on(engine, batch_max=50, checkpoint_every=20) as writer:
        opened = commits  # the open checkpoint's transaction
        seqs = await asyncio.gather(*(writer.append(make_event(i)) for i in range(200)))
        stats = writer.stats
        assert sorted(seqs) == list(range(1, 201))
        assert stats.appended == 200 and stats.max_batch == 50
        assert stats.batches == 4  # all 200 were queued before the first commit ran
        # one transaction per batch for its rows and checkpoints together (SQLite commits
        # batches on the writer's own connection: one thread hop per batch)
        assert commits - opened == (0 if engine.dialect.name == "sqlite" else 4)
    assert stats.checkpoints == 1 + 4 * 3 + 1  # open, 20 + 20 + 10 rows per batch, close
    cps = await checkpoints(engine)
    assert [(cp.kind, cp.count) for cp in cps] == [
        ("open", 0),
        *[("batch", 20), ("batch", 20), ("batch", 10)] * 4,
        ("close", 0),
    ]
    assert len({cp.ts_us for cp in cps[1:4]}) == 1  # signed in the same commit
    assert_signed_tree_heads(cps, await row_hashes(engine))
    assert (await verify(engine, TRUSTED)).ok


async def test_resume_after_restart(db_url: str, engine: AsyncEngine) -> None:
    async with writer_on(engine, checkpoint_every=10) as writer:
        assert [await writer.append(make_event(i)) for i in range(15)] == list(range(1, 16))
    first_run = await checkpoints(engine)
    other = create_db_engine(db_url)  # a new process: the head comes from the last checkpoint
    try:
        async with writer_on(other, checkpoint_every=10) as writer:
            head = writer.head
            assert head is not None and head.checkpoint is not None
            assert (head.seq, head.tree.size, head.checkpoint.kind) == (15, 15, "open")
            assert [await writer.append(make_event(i)) for i in range(16, 26)] == list(
                range(16, 26)
            )
    finally:
        await other.dispose()
    report = await verify(engine, TRUSTED)
    assert report.ok and report.rows == 25 and report.chain_only_rows == 0, report
    cps = await checkpoints(engine)
    assert cps[: len(first_run)] == first_run  # the first run's checkpoints, untouched
    reopened = cps[len(first_run)]
    assert (reopened.kind, reopened.size, reopened.prev_hash) == (
        "open",
        15,
        checkpoint_hash(first_run[-1]),
    )
    assert [cp.kind for cp in cps].count("open") == 2
    assert [cp.kind for cp in cps].count("close") == 2
    # the second run's tree heads cover the first run's rows too: one tree, not two ranges
    assert_signed_tree_heads(cps, await row_hashes(engine))


async def test_rows_added_behind_the_writer_are_unsigned_and_stop_it(
    engine: AsyncEngine,
) -> None:
    """Someone with write access appends well-linked rows (every hash right): the chain holds,
    but no checkpoint signs them, so verify names them and no writer builds on them."""
    async with writer_on(engine) as writer:
        for i in range(3):
            await writer.append(make_event(i))
        assert writer.head is not None
        prev, rows = writer.head.row_hash, []
        for seq in (4, 5, 6):
            rows.append(link(prev, seq, make_event(seq), log_id=LOG_ID))
            prev = rows[-1]["row_hash"]
        async with engine.begin() as conn:
            await conn.execute(insert(audit_events), rows)
        with pytest.raises(AuditUnavailable):  # the log moved under it: it fails closed
            await writer.append(make_event(7))
    report = await verify(engine, TRUSTED)
    assert not report.ok and report.chain_ok and report.rows == 6
    assert (report.first_bad_seq, report.reason) == (4, "unsigned_row")
    assert (report.chain_only_from, report.chain_only_rows) == (4, 3)
    assert [p.reason for p in report.problems] == ["unsigned_row"]
    assert (await checkpoints(engine))[-1].size == 3  # no close checkpoint laundered them
    with pytest.raises(AuditCorrupt, match="outside airgate"):
        await writer_on(engine).start()


async def test_witnesses_receive_the_checkpoints_and_verify_holds_the_log_to_them(
    engine: AsyncEngine, tmp_path: Path
) -> None:
    (tmp_path / "witness").mkdir()
    witness = DirectoryWitness(tmp_path / "witness")
    async with writer_on(engine, witnesses=[witness]) as writer:
        assert [cp.kind for cp in witness.checkpoints(LOG_ID)] == ["open"]  # at once
        for i in range(30):
            await writer.append(make_event(i))
    kept = witness.checkpoints(LOG_ID)
    stored = await checkpoints(engine)
    assert kept[-1] == stored[-1] and kept[-1].kind == "close"  # at once, on stop
    assert all(cp in stored for cp in kept)  # byte for byte the database's own
    report = await verify(engine, TRUSTED, witnesses=collect([witness], LOG_ID))
    assert report.ok, report
    assert [(w.name, w.ok, w.latest_size) for w in report.witnesses] == [(witness.name, True, 30)]


async def _rename(engine: AsyncEngine, old: str, new: str) -> None:
    async with engine.begin() as conn:
        await conn.execute(text(f"ALTER TABLE {old} RENAME TO {new}"))


async def test_append_fails_closed_while_the_table_is_gone_then_recovers(
    engine: AsyncEngine,
) -> None:
    async with writer_on(engine) as writer:
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
    assert report.ok and report.rows == 2, report
    # the failed batches left no checkpoint behind: open, two batches, close
    assert [cp.kind for cp in await checkpoints(engine)] == ["open", "batch", "batch", "close"]


async def test_duplicate_event_ids_fail_alone_and_retries_are_idempotent(
    engine: AsyncEngine,
) -> None:
    async with writer_on(engine) as writer:
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
    writer = writer_on(engine)
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
            await writer_on(eng).start()
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
            async with writer_on(eng) as writer:
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


async def test_the_throughput_benchmark_writes_a_log_that_verifies(engine: AsyncEngine) -> None:
    result = await measure(engine, 400, concurrency=40, signer=SIGNER, checkpoint_every=64)
    assert result.events == 400 and result.rate > 0
    assert await count(engine) == 400
    assert result.checkpoints == await count(engine, audit_checkpoints)
    assert result.checkpoints >= result.batches + 2  # every batch signed, plus open and close
    assert (await verify(engine, TRUSTED)).ok


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
    async with writer_on(engine, checkpoint_every=16) as writer:
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
    async with writer_on(engine) as writer:
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


async def _expect_refused(engine: AsyncEngine, sql: str, why: str = "append-only") -> None:
    with pytest.raises(DBAPIError, match=why):
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


async def test_sqlite_refuses_rows_and_checkpoints_that_are_not_the_next(tmp_path: Path) -> None:
    """Defence in depth on SQLite (PostgreSQL grants the gateway INSERT only): an INSERT whose
    seq or checkpoint id is not the head + 1 is refused; verification stays the guarantee."""
    async with fresh_database("sqlite", tmp_path) as url:
        await upgrade(url)
        eng = create_db_engine(url)
        try:
            async with writer_on(eng) as writer:
                for i in range(3):
                    await writer.append(make_event(i))
            head = await read_head(eng, LOG_ID)
            assert head.checkpoint is not None
            for seq in (head.seq + 2, 1_000_000):
                row = link(head.row_hash, seq, make_event(seq), log_id=LOG_ID)
                with pytest.raises(DBAPIError, match="seq is not the head"):
                    async with eng.begin() as conn:
                        await conn.execute(insert(audit_events), [row])
            later = msgspec.structs.replace(head.checkpoint, id=head.checkpoint.id + 2)
            with pytest.raises(DBAPIError, match="id is not the head"):
                async with eng.begin() as conn:
                    await conn.execute(insert(audit_checkpoints), [later.row(head.tree.stack)])
            assert await count(eng) == 3
            assert (await verify(eng, TRUSTED)).ok
        finally:
            await eng.dispose()
