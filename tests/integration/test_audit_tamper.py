"""Tampering with the audit log behind the gateway's back, and `verify` catching it, on SQLite and
PostgreSQL.

Every log here holds rows 1-35 written by the writer with a checkpoint every 10 rows (signed
ranges 1-10, 11-20, 21-30 and, at stop, 31-35) plus rows 36-40 that a crash left without a
checkpoint (protected by the chain alone).  The attacker has the database: the append-only
triggers are dropped (SQLite) or disabled (PostgreSQL) first.  Tampering inside a signed range
makes its root fail, so `first_bad_seq` is then the range's first seq (11 for row 14) and the
row-level finding is among `problems`; in the unchecked tail the chain alone names the row.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from databases import fresh_database
from sqlalchemy import delete, insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.audit import (
    AuditCorrupt,
    AuditEvent,
    AuditPrincipal,
    AuditWriter,
    VerifyReport,
    new_event_id,
    search,
    verify,
)
from gateway.audit.chain import link, row_hash
from gateway.audit.checkpoint import checkpoint_from_row, make_checkpoint
from gateway.audit.event import encode_event
from gateway.audit.schema import audit_checkpoints, audit_events
from gateway.db import create_db_engine
from gateway.db.migrate import upgrade

KEY = Ed25519PrivateKey.generate()
ATTACKER = Ed25519PrivateKey.generate()
TRUSTED = [KEY.public_key()]
T0 = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)


def make_event(i: int, **changes: Any) -> AuditEvent:
    fields: dict[str, Any] = {
        "event_id": new_event_id(),
        "ts": T0 + timedelta(seconds=i),
        "kind": "inference.completed",
        "outcome": "success",
        "principal": AuditPrincipal(key_id=f"k{i % 3}", team="t"),
        "model": "m",
        "http_status": 200,
        "completion_tokens": i,
    }
    fields.update(changes)
    return AuditEvent(**fields)


async def disable_append_only(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        if engine.dialect.name == "sqlite":
            names = await conn.execute(text("SELECT name FROM sqlite_master WHERE type='trigger'"))
            for (name,) in names.all():
                await conn.execute(text(f"DROP TRIGGER {name}"))
        else:
            for table in ("audit_events", "audit_checkpoints"):
                await conn.execute(text(f"ALTER TABLE {table} DISABLE TRIGGER USER"))


@pytest.fixture(params=["sqlite", "postgresql"])
async def log(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    """A log of 40 rows (1-35 checkpointed, 36-40 chain only) open to tampering."""
    async with fresh_database(request.param, tmp_path) as url:
        await upgrade(url)
        engine = create_db_engine(url)
        try:
            async with AuditWriter(engine, signing_key=KEY, checkpoint_every=10) as writer:
                appends = [writer.append(make_event(i)) for i in range(1, 36)]
                assert await asyncio.gather(*appends) == list(range(1, 36))
            prev = (await row(engine, 35))["row_hash"]
            tail = []
            for seq in range(36, 41):
                tail.append(link(prev, seq, make_event(seq)))
                prev = tail[-1]["row_hash"]
            async with engine.begin() as conn:
                await conn.execute(insert(audit_events), tail)
            report = await verify(engine, TRUSTED)
            assert report.ok and report.rows == 40 and report.checkpoints_checked == 4
            assert (report.chain_only_from, report.chain_only_rows) == (36, 5)
            await disable_append_only(engine)
            yield engine
        finally:
            await engine.dispose()


# -- the attacker's tools ----------------------------------------------------------------------


async def row(engine: AsyncEngine, seq: int) -> dict[str, Any]:
    async with engine.connect() as conn:
        found = (await conn.execute(select(audit_events).where(audit_events.c.seq == seq))).one()
    return dict(found._mapping)


async def set_row(engine: AsyncEngine, seq: int, **values: Any) -> None:
    async with engine.begin() as conn:
        await conn.execute(update(audit_events).where(audit_events.c.seq == seq).values(**values))


async def renumber(engine: AsyncEngine, pairs: list[tuple[int, int]]) -> None:
    """Move rows to new seq numbers (through negative ones, so the primary key never clashes)."""
    async with engine.begin() as conn:
        for old, _ in pairs:
            await conn.execute(
                update(audit_events).where(audit_events.c.seq == old).values(seq=-old)
            )
        for old, new in pairs:
            await conn.execute(
                update(audit_events).where(audit_events.c.seq == -old).values(seq=new)
            )


async def edit_body(engine: AsyncEngine, seq: int, **changes: Any) -> None:
    """Rewrite an event's body (and the columns copied from it) without touching hashes."""
    stored = msgspec.json.decode((await row(engine, seq))["body"], type=AuditEvent)
    edited = msgspec.structs.replace(stored, **changes)
    await set_row(engine, seq, body=encode_event(edited).decode(), model=edited.model)


async def rehash(engine: AsyncEngine, first: int, last: int | None = None) -> None:
    """Recompute prev_hash/row_hash of rows first..last from the stored predecessor."""
    prev = (await row(engine, first - 1))["row_hash"]
    async with engine.connect() as conn:
        query = select(audit_events).where(audit_events.c.seq >= first).order_by(audit_events.c.seq)
        rows = [dict(r._mapping) for r in (await conn.execute(query)).all()]
    for r in rows:
        if last is not None and r["seq"] > last:
            break
        new = row_hash(prev, r["seq"], r["ts_us"], r["body"].encode())
        await set_row(engine, r["seq"], prev_hash=prev, row_hash=new)
        prev = new


async def resign_checkpoints(engine: AsyncEngine, from_id: int, key: Ed25519PrivateKey) -> None:
    """Replace checkpoints from `from_id` on with ones over the current rows, signed by `key`."""
    async with engine.begin() as conn:
        cps = [
            checkpoint_from_row(r)
            for r in (
                await conn.execute(select(audit_checkpoints).order_by(audit_checkpoints.c.id))
            ).all()
        ]
        await conn.execute(delete(audit_checkpoints).where(audit_checkpoints.c.id >= from_id))
        prev = cps[from_id - 2] if from_id > 1 else None
        for cp in cps[from_id - 1 :]:
            hashes = (
                await conn.execute(
                    select(audit_events.c.row_hash)
                    .where(audit_events.c.seq.between(cp.first_seq, cp.last_seq))
                    .order_by(audit_events.c.seq)
                )
            ).scalars()
            prev = make_checkpoint(prev, list(hashes), ts_us=cp.ts_us, signing_key=key)
            await conn.execute(insert(audit_checkpoints).values(**msgspec.to_builtins(prev)))


async def edit_and_rehash_row(engine: AsyncEngine, seq: int) -> None:
    await edit_body(engine, seq, model="other-model")
    await rehash(engine, seq, seq)


async def delete_rows(engine: AsyncEngine, first: int, last: int) -> None:
    async with engine.begin() as conn:
        await conn.execute(delete(audit_events).where(audit_events.c.seq.between(first, last)))


async def insert_forged(engine: AsyncEngine, seq: int) -> None:
    """Make room at `seq` and insert a well-formed row linked to its new predecessor."""
    async with engine.connect() as conn:
        top = await conn.execute(select(audit_events.c.seq).order_by(audit_events.c.seq.desc()))
        last = int(top.scalars().first() or 0)
    await renumber(engine, [(s, s + 1) for s in range(seq, last + 1)])
    forged = link((await row(engine, seq - 1))["row_hash"], seq, make_event(seq, model="forged"))
    async with engine.begin() as conn:
        await conn.execute(insert(audit_events).values(**forged))


async def recompute_chain(engine: AsyncEngine, seq: int) -> None:
    await edit_body(engine, seq, model="other-model")
    await rehash(engine, seq)


Tamper = Callable[[AsyncEngine], Awaitable[None]]
# name, tampering, first_bad_seq, its reason, a finding that must be among the problems
CASES: list[tuple[str, Tamper, int, str, tuple[int, str]]] = [
    ("edit a field",
     lambda e: edit_body(e, 14, completion_tokens=9999),
     14, "row_hash_mismatch", (14, "row_hash_mismatch")),
    ("edit an indexed column only",
     lambda e: set_row(e, 14, key_id="k9"),
     14, "column_mismatch", (14, "column_mismatch")),
    ("edit a field in the unchecked tail",
     lambda e: edit_body(e, 38, completion_tokens=0),
     38, "row_hash_mismatch", (38, "row_hash_mismatch")),
    ("edit and re-hash a row",
     lambda e: edit_and_rehash_row(e, 14),
     11, "checkpoint_root_mismatch", (15, "prev_hash_mismatch")),
    ("edit and re-hash a row in the unchecked tail",
     lambda e: edit_and_rehash_row(e, 38),
     39, "prev_hash_mismatch", (39, "prev_hash_mismatch")),
    ("delete a middle row",
     lambda e: delete_rows(e, 14, 14),
     11, "checkpoint_root_mismatch", (14, "gap")),
    ("delete a row in the unchecked tail",
     lambda e: delete_rows(e, 37, 37),
     37, "gap", (37, "gap")),
    ("delete tail rows",
     lambda e: delete_rows(e, 33, 40),
     31, "checkpoint_root_mismatch", (33, "gap")),
    ("insert a forged row",
     lambda e: insert_forged(e, 14),
     11, "checkpoint_root_mismatch", (15, "prev_hash_mismatch")),
    ("insert a forged row in the unchecked tail",
     lambda e: insert_forged(e, 38),
     39, "prev_hash_mismatch", (39, "prev_hash_mismatch")),
    ("swap two rows",
     lambda e: renumber(e, [(14, 16), (16, 14)]),
     11, "checkpoint_root_mismatch", (14, "prev_hash_mismatch")),
    ("swap two rows in the unchecked tail",
     lambda e: renumber(e, [(37, 39), (39, 37)]),
     37, "prev_hash_mismatch", (37, "prev_hash_mismatch")),
    ("recompute the whole chain",
     lambda e: recompute_chain(e, 14),
     11, "checkpoint_root_mismatch", (21, "checkpoint_root_mismatch")),
    ("corrupt a body",
     lambda e: set_row(e, 38, body="{not json"),
     38, "row_hash_mismatch", (38, "row_hash_mismatch")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("tamper", "first_bad", "reason", "finding"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
async def test_tampering_is_detected_with_the_first_bad_seq(
    log: AsyncEngine, tamper: Tamper, first_bad: int, reason: str, finding: tuple[int, str]
) -> None:
    await tamper(log)
    report = await verify(log, TRUSTED)
    assert not report.ok
    assert (report.first_bad_seq, report.reason) == (first_bad, reason), report.problems
    assert finding in [(p.seq, p.reason) for p in report.problems], report.problems
    assert report.checkpoints_untrusted == 0


async def test_only_a_checkpoint_catches_a_recomputed_chain(log: AsyncEngine) -> None:
    await recompute_chain(log, 14)
    report = await verify(log, TRUSTED)
    assert report.chain_ok and not report.ok
    assert report.checkpoints_failed == 3  # 11-20, 21-30 and 31-35
    assert [(p.seq, p.reason) for p in report.problems] == [
        (11, "checkpoint_root_mismatch"),
        (21, "checkpoint_root_mismatch"),
        (31, "checkpoint_root_mismatch"),
    ]


async def test_a_recomputed_chain_re_signed_by_an_untrusted_key(log: AsyncEngine) -> None:
    await recompute_chain(log, 14)
    await resign_checkpoints(log, 2, ATTACKER)
    report = await verify(log, TRUSTED)
    assert report.chain_ok and not report.ok
    assert (report.first_bad_seq, report.reason) == (11, "checkpoint_untrusted_key")
    assert report.checkpoints_untrusted == 3 and report.checkpoints_failed == 0
    forged_too = await verify(log, [*TRUSTED, ATTACKER.public_key()])
    assert forged_too.ok  # trusting the attacker's key is the one thing verify cannot fix


async def test_a_checkpoint_signed_by_a_key_not_trusted_yet(log: AsyncEngine) -> None:
    """Key rotation: rows appended under a new key verify once that key is trusted."""
    rotated = Ed25519PrivateKey.generate()
    async with AuditWriter(log, signing_key=rotated, checkpoint_every=10) as writer:
        assert await writer.append(make_event(41)) == 41
    report = await verify(log, TRUSTED)
    assert (report.first_bad_seq, report.reason) == (36, "checkpoint_untrusted_key")
    assert report.checkpoints_untrusted == 1
    assert (await verify(log, [*TRUSTED, rotated.public_key()])).ok


async def test_removing_or_forging_a_checkpoint(log: AsyncEngine) -> None:
    async with log.begin() as conn:
        await conn.execute(
            update(audit_checkpoints)
            .where(audit_checkpoints.c.id == 3)
            .values(merkle_root="00" * 32)
        )
    report = await verify(log, TRUSTED)
    assert (report.first_bad_seq, report.reason) == (21, "checkpoint_bad_signature")
    assert (21, "checkpoint_root_mismatch") in [(p.seq, p.reason) for p in report.problems]
    async with log.begin() as conn:
        await conn.execute(delete(audit_checkpoints).where(audit_checkpoints.c.id == 2))
    report = await verify(log, TRUSTED)
    assert (report.first_bad_seq, report.reason) == (11, "checkpoint_missing")


async def test_truncating_the_unchecked_tail_needs_a_checkpoint_kept_elsewhere(
    log: AsyncEngine,
) -> None:
    """The documented limit: rows after the last checkpoint are protected by the chain alone,
    so removing them from the end leaves a log that verifies; the report says how many rows
    were only chain-protected, which is why checkpoints are frequent and written at stop."""
    await delete_rows(log, 38, 40)
    report = await verify(log, TRUSTED)
    assert report.ok and report.rows == 37
    assert (report.chain_only_from, report.chain_only_rows) == (36, 2)


async def test_a_partial_verify_widens_to_whole_checkpoints(log: AsyncEngine) -> None:
    await edit_body(log, 25, completion_tokens=1)
    clean = await verify(log, TRUSTED, first_seq=14, last_seq=16)
    assert clean.ok and (clean.first_seq, clean.last_seq, clean.rows) == (11, 20, 10)
    dirty = await verify(log, TRUSTED, first_seq=14, last_seq=22)
    assert (dirty.first_seq, dirty.last_seq) == (11, 30)
    assert (dirty.first_bad_seq, dirty.reason) == (25, "row_hash_mismatch")
    tail = await verify(log, TRUSTED, first_seq=38)
    assert tail.ok and (tail.first_seq, tail.last_seq, tail.chain_only_rows) == (38, 40, 3)


async def test_search_refuses_a_body_that_no_longer_decodes(log: AsyncEngine) -> None:
    await set_row(log, 3, body="{not json")
    with pytest.raises(AuditCorrupt):
        await search(log, limit=10)


def _report_is_json(report: VerifyReport) -> bytes:
    return msgspec.json.encode(report)


async def test_the_report_serialises(log: AsyncEngine) -> None:
    await delete_rows(log, 14, 15)
    report = await verify(log, TRUSTED)
    decoded = msgspec.json.decode(_report_is_json(report))
    assert decoded["gaps"] == [[14, 15]] and decoded["first_bad_seq"] == 11
