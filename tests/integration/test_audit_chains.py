"""Many writers, one audit log: each replica appends to its own chain of the shared tables.

Three writers (their own keys and chain ids, as three replicas would be) append concurrently to
one database; nothing fails for it, every chain verifies against the pinned keys, and search
and export read the chains merged by time, each record naming its chain.  One chain is never
written by two processes at once, a chain deleted whole is still caught through its witness,
a start reconciles only its own chain, and a log written before chains existed migrates into
one chain that its writer continues.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from databases import fresh_database
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from bundles.kms.signer import LocalSigner
from gateway.audit import (
    AuditChainBusy,
    AuditEvent,
    AuditPrincipal,
    AuditWriter,
    export_jsonl,
    search,
    verify_log,
)
from gateway.audit._head import Head, Signing, extend
from gateway.audit.checkpoint import signed
from gateway.audit.merkle import CompactTree
from gateway.audit.reconcile import orphans
from gateway.audit.schema import audit_checkpoints, audit_events
from gateway.audit.witness import DirectoryWitness, collect
from gateway.db import create_db_engine
from gateway.db.migrate import upgrade

CHAINS = ("00000000000000a1", "00000000000000b2", "00000000000000c3")
T0 = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)


def signer() -> LocalSigner:
    return LocalSigner(Ed25519PrivateKey.generate())


def event(i: int, *, kind: str = "inference.completed", request_id: str | None = None) -> Any:
    return AuditEvent(
        event_id=f"ev-{i}-{request_id or ''}",
        ts=T0 + timedelta(microseconds=i),
        kind=kind,  # type: ignore[arg-type]
        outcome="success",
        request_id=request_id or f"req-{i}",
        principal=AuditPrincipal(key_id="k1", team="payments", method="api_key"),
        model="m",
    )


@pytest.fixture(params=["sqlite", "postgresql"])
async def engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    async with fresh_database(request.param, tmp_path) as url:
        await upgrade(url)
        eng = create_db_engine(url)
        try:
            yield eng
        finally:
            await eng.dispose()


async def test_three_writers_append_concurrently_and_every_chain_verifies(
    engine: AsyncEngine, tmp_path: Path
) -> None:
    signers = [signer() for _ in CHAINS]
    witness = DirectoryWitness(tmp_path / "witness")
    witness.path.mkdir()
    writers = [
        AuditWriter(engine, signer=s, log_id=chain, witnesses=[witness], witness_interval_s=0.05)
        for s, chain in zip(signers, CHAINS, strict=True)
    ]
    per_writer = 200
    for writer in writers:
        await writer.start()
    try:
        # interleaved in time: writer w appends events w, w+3, w+6, ...
        seqs = await asyncio.gather(
            *(writers[i % 3].append(event(i)) for i in range(per_writer * len(writers)))
        )
    finally:
        for writer in writers:
            await writer.stop()
    assert all(w.stats.failures == 0 and w.stats.appended == per_writer for w in writers)
    assert sorted(seqs) == sorted(list(range(1, per_writer + 1)) * 3)  # each chain gapless

    trusted = [s.verify_key for s in signers]
    report = await verify_log(engine, trusted, witnesses=collect([witness], None))
    assert report.ok, report
    assert [c.log_id for c in report.chains] == list(CHAINS)
    assert all(c.rows == per_writer and c.tree_checked for c in report.chains)
    assert all(w.ok and w.checkpoints > 0 for c in report.chains for w in c.witnesses)

    # each chain's key is pinned: leave one out and only that chain fails
    partial = await verify_log(engine, trusted[:2])
    assert not partial.ok
    assert [c.ok for c in partial.chains] == [True, True, False]
    assert partial.chains[2].reason == "checkpoint_untrusted_key"

    # search: merged by time (the events' order), every record names its chain, pages join up
    seen: list[tuple[str, int, str]] = []
    cursor = None
    while True:
        records, cursor = await search(engine, kind="inference.completed", cursor=cursor, limit=70)
        seen.extend((r.chain, r.seq, r.event.event_id) for r in records)
        if cursor is None:
            break
    assert [eid for _, _, eid in seen] == [event(i).event_id for i in range(per_writer * 3)]
    assert {chain for chain, _, _ in seen} == set(CHAINS)
    assert seen[0][0] == CHAINS[0] and seen[1][0] == CHAINS[1] and seen[2][0] == CHAINS[2]

    # export: the same order; each chain's lines link up on their own
    lines = [
        json.loads(line)
        for chunk in [c async for c in export_jsonl(engine)]
        for line in chunk.splitlines()
    ]
    completed = [x for x in lines if x["event"]["kind"] == "inference.completed"]
    assert [x["event"]["event_id"] for x in completed] == [eid for _, _, eid in seen]
    for chain in CHAINS:
        mine = sorted((x for x in lines if x["chain"] == chain), key=lambda x: x["seq"])
        assert [x["seq"] for x in mine] == list(range(1, len(mine) + 1))
        assert all(b["prev_hash"] == a["row_hash"] for a, b in itertools.pairwise(mine))


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
async def test_a_chain_has_one_writer_at_a_time(engine: AsyncEngine) -> None:
    """PostgreSQL: a session lock per chain (a SQLite log lives in one locked data dir)."""
    key = signer()
    first = AuditWriter(engine, signer=key, log_id=CHAINS[0])
    await first.start()
    second = AuditWriter(engine, signer=key, log_id=CHAINS[0])
    try:
        with pytest.raises(AuditChainBusy, match="its own `\\[audit\\] chain`"):
            await second._lease.acquire(wait_s=0.5)
        # another chain on the same database is not held up
        async with AuditWriter(engine, signer=key, log_id=CHAINS[1]) as other:
            await other.append(event(1))
        await first.append(event(2))
    finally:
        await first.stop()
    # once the first has stopped, the chain is free: the second continues it
    async with second:
        assert await second.append(event(3)) == 2
    report = await verify_log(engine, [key.verify_key])
    assert report.ok and [c.rows for c in report.chains] == [2, 1]


async def test_a_chain_deleted_whole_is_caught_by_its_witness(
    engine: AsyncEngine, tmp_path: Path
) -> None:
    key = signer()
    witness = DirectoryWitness(tmp_path / "witness")
    witness.path.mkdir()
    for chain in CHAINS[:2]:
        async with AuditWriter(engine, signer=key, log_id=chain, witnesses=[witness]) as w:
            for i in range(3):
                await w.append(event(i, request_id=chain))
    async with engine.begin() as conn:  # the owner, or someone who dropped the triggers
        if engine.dialect.name == "sqlite":
            for table in ("audit_events", "audit_checkpoints"):
                await conn.execute(text(f"DROP TRIGGER {table}_no_delete"))
        else:
            await conn.execute(text("SET session_replication_role = replica"))
        for table in (audit_events, audit_checkpoints):
            await conn.execute(table.delete().where(table.c.log_id == CHAINS[1]))
    report = await verify_log(engine, [key.verify_key], witnesses=collect([witness], None))
    assert [c.log_id for c in report.chains] == list(CHAINS[:2])
    kept, gone = report.chains
    dropped = {"append_only_missing"} if engine.dialect.name == "sqlite" else set()
    assert not report.ok and {p.reason for p in kept.problems} == dropped
    assert {"no_checkpoint", "witness_truncated"} <= {p.reason for p in gone.problems}


async def test_a_start_reconciles_only_its_own_chain(engine: AsyncEngine) -> None:
    key = signer()
    for chain in CHAINS[:2]:
        writer = AuditWriter(engine, signer=key, log_id=chain)
        await writer.start()
        await writer.append(event(1, kind="inference.admitted", request_id=chain))
        # the process dies here: no terminal event, no close checkpoint
        writer._task.cancel()  # type: ignore[union-attr]
        await asyncio.gather(writer._task, return_exceptions=True)  # type: ignore[arg-type]
        await writer._lease.release()
    assert [e.request_id for e in await orphans(engine, CHAINS[0])] == [CHAINS[0]]
    assert [e.request_id for e in await orphans(engine, CHAINS[1])] == [CHAINS[1]]


async def test_a_log_from_before_chains_migrates_into_one_chain(tmp_path: Path) -> None:
    """A single gateway's log written at the previous revision: after the upgrade its rows are
    one chain (the id its checkpoints name), it verifies, and the writer continues it."""
    for kind in ("sqlite", "postgresql"):
        async with fresh_database(kind, tmp_path / kind) as url:
            (tmp_path / kind).mkdir(exist_ok=True)
            await upgrade(url, "20261202_01_tamper")
            key = signer()
            signing = Signing(
                log_id=CHAINS[0], alg=key.verify_key.alg, key_id=key.verify_key.key_id
            )
            head = Head(seq=0, row_hash="0" * 64, checkpoint=None, tree=CompactTree())
            rows, unsigned, _ = extend(
                head, [event(i) for i in range(5)], every=2, ts_us=1, signing=signing
            )
            cps = [signed(cp, key.sign(cp.message())).row(frontier) for cp, frontier in unsigned]
            eng = create_db_engine(url)
            try:
                async with eng.begin() as conn:  # the tables as that revision had them
                    for row in rows:
                        # columns later revisions added (log_id here, deployment after)
                        old = {k: v for k, v in row.items() if k not in ("log_id", "deployment")}
                        names = ", ".join(old)
                        await conn.execute(
                            text(
                                f"INSERT INTO audit_events ({names}) "
                                f"VALUES ({', '.join(':' + k for k in old)})"
                            ),
                            old,
                        )
                    for cp in cps:
                        names = ", ".join(cp)
                        await conn.execute(
                            text(
                                f"INSERT INTO audit_checkpoints ({names}) "
                                f"VALUES ({', '.join(':' + k for k in cp)})"
                            ),
                            cp,
                        )
                await upgrade(url)
                report = await verify_log(eng, [key.verify_key])
                assert report.ok and [(c.log_id, c.rows) for c in report.chains] == [(CHAINS[0], 5)]
                async with AuditWriter(eng, signer=key, log_id=CHAINS[0]) as writer:
                    assert await writer.append(event(5)) == 6
                assert (await verify_log(eng, [key.verify_key])).ok
            finally:
                await eng.dispose()
