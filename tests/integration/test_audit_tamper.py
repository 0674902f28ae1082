"""An insider with write access to the database and the data directory, but not to the witness
or the pinned signing key, tampers with the audit log; verification against the pinned key and
the witness catches every attack, on SQLite and PostgreSQL, and so does the next start.

Every log here was written by the writer in two runs (rows 1-35, then 36-40), one event per
commit, so each row has its own signed checkpoint; the witness directory received the open and
close checkpoints of both runs and the first commit of each.  The attacker first drops
(SQLite) or disables (PostgreSQL) the append-only triggers, which verification also reports.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from databases import fresh_database
from sqlalchemy import delete, insert, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from bundles.kms.signer import LocalSigner, Signer
from gateway.audit import (
    AuditCorrupt,
    AuditEvent,
    AuditPrincipal,
    AuditWriter,
    VerifyReport,
    new_event_id,
    verify,
)
from gateway.audit.chain import GENESIS, link, row_hash
from gateway.audit.checkpoint import checkpoint_from_row, signed, unsigned_checkpoint
from gateway.audit.event import encode_event
from gateway.audit.merkle import CompactTree
from gateway.audit.schema import audit_checkpoints, audit_events
from gateway.audit.witness import DirectoryWitness, collect
from gateway.db import create_db_engine
from gateway.db.migrate import upgrade

KEY = LocalSigner(Ed25519PrivateKey.generate())
ATTACKER = LocalSigner(Ed25519PrivateKey.generate())
TRUSTED = [KEY.verify_key]
LOG_ID = "0123456789abcdef"
T0 = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)


def make_event(i: int, **changes: Any) -> AuditEvent:
    fields: dict[str, Any] = {
        "event_id": new_event_id(),
        "ts": T0 + timedelta(seconds=i),
        "kind": "admin.action" if i % 5 == 0 else "inference.completed",
        "outcome": "success",
        "principal": AuditPrincipal(key_id=f"k{i % 3}", team="t"),
        "model": "m",
        "http_status": 200,
        "completion_tokens": i,
    }
    fields.update(changes)
    return AuditEvent(**fields)


class Log:
    def __init__(self, engine: AsyncEngine, witness: DirectoryWitness) -> None:
        self.engine = engine
        self.witness = witness

    def writer(self, signer: Signer = KEY) -> AuditWriter:
        return AuditWriter(self.engine, signer=signer, log_id=LOG_ID, witnesses=[self.witness])

    async def verify(self, keys: list[Any] | None = None) -> VerifyReport:
        witnessed = collect([self.witness], LOG_ID)
        return await verify(self.engine, TRUSTED if keys is None else keys, witnesses=witnessed)


async def write(log: Log, first: int, last: int) -> None:
    async with log.writer() as writer:
        for i in range(first, last + 1):
            assert await writer.append(make_event(i)) == i


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
async def intact(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Log]:
    """A verified log of 40 rows, its witness, append-only triggers still on."""
    (tmp_path / "witness").mkdir()
    async with fresh_database(request.param, tmp_path) as url:
        await upgrade(url)
        engine = create_db_engine(url)
        try:
            log = Log(engine, DirectoryWitness(tmp_path / "witness"))
            await write(log, 1, 35)
            await write(log, 36, 40)
            report = await log.verify()
            assert report.ok, report.problems
            assert (report.rows, report.chain_only_rows) == (40, 0)
            assert report.trusted_keys == [KEY.verify_key.key_id]
            sizes = sorted(cp.size for _, kept in collect([log.witness], LOG_ID) for cp in kept)
            assert 35 in sizes and sizes[-1] == 40
            yield log
        finally:
            await engine.dispose()


@pytest.fixture
async def log(intact: Log) -> Log:
    """The same log, open to tampering."""
    await disable_append_only(intact.engine)
    return intact


# -- the attacker's tools ----------------------------------------------------------------------


async def rows(engine: AsyncEngine) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        found = await conn.execute(select(audit_events).order_by(audit_events.c.seq))
        return [dict(r._mapping) for r in found.all()]


async def set_row(engine: AsyncEngine, seq: int, **values: Any) -> None:
    async with engine.begin() as conn:
        await conn.execute(update(audit_events).where(audit_events.c.seq == seq).values(**values))


async def edit_body(engine: AsyncEngine, seq: int, **changes: Any) -> None:
    """Rewrite an event's body (and the columns copied from it) without touching hashes."""
    stored = next(r for r in await rows(engine) if r["seq"] == seq)
    edited = msgspec.structs.replace(
        msgspec.json.decode(stored["body"], type=AuditEvent), **changes
    )
    await set_row(engine, seq, body=encode_event(edited).decode(), model=edited.model)


async def rehash_from(engine: AsyncEngine, first: int) -> None:
    """Recompute prev_hash/row_hash from `first` on, as `gateway.audit.chain` does."""
    prev = GENESIS
    for r in await rows(engine):
        if r["seq"] >= first:
            new = row_hash(prev, r["seq"], r["ts_us"], r["body"].encode())
            await set_row(engine, r["seq"], prev_hash=prev, row_hash=new)
            r["row_hash"] = new
        prev = r["row_hash"]


async def delete_rows(engine: AsyncEngine, first: int, last: int) -> None:
    async with engine.begin() as conn:
        await conn.execute(delete(audit_events).where(audit_events.c.seq.between(first, last)))


async def delete_checkpoints_from_size(engine: AsyncEngine, size: int) -> None:
    async with engine.begin() as conn:
        await conn.execute(delete(audit_checkpoints).where(audit_checkpoints.c.last_seq >= size))


async def rewrite_history(
    engine: AsyncEngine, signer: Signer, keep: Callable[[AuditEvent], bool], pad: int = 0
) -> None:
    """The full rewrite: drop events, renumber, re-link the chain from genesis, add `pad`
    made-up events, and sign a fresh checkpoint chain (one per row) with `signer`."""
    events = [msgspec.json.decode(r["body"], type=AuditEvent) for r in await rows(engine)]
    events = [e for e in events if keep(e)]
    events += [make_event(1000 + i) for i in range(pad)]
    new_rows, prev = [], GENESIS
    for seq, event in enumerate(events, start=1):
        new_rows.append(link(prev, seq, event, log_id=LOG_ID))
        prev = new_rows[-1]["row_hash"]
    tree, cps, last = CompactTree(), [], None
    for kind_rows in [[]] + [[r] for r in new_rows]:
        for r in kind_rows:
            tree.append(bytes.fromhex(r["row_hash"]))
        unsigned = unsigned_checkpoint(
            last,
            log_id=LOG_ID,
            epoch=1,
            kind="batch" if kind_rows else "open",
            size=tree.size,
            root=tree.root(),
            ts_us=1,
            alg=signer.alg,
            key_id=signer.verify_key.key_id,
        )
        last = signed(unsigned, signer.sign(unsigned.message()))
        cps.append(last.row(tree.stack))
    async with engine.begin() as conn:
        await conn.execute(delete(audit_events))
        await conn.execute(delete(audit_checkpoints))
        await conn.execute(insert(audit_events), new_rows)
        await conn.execute(insert(audit_checkpoints), cps)


async def forge_append(engine: AsyncEngine) -> int:
    """A well-formed event linked after the last row (the triggers allow an INSERT)."""
    last = (await rows(engine))[-1]
    forged = link(
        last["row_hash"], last["seq"] + 1, make_event(99, action="keys.revoke"), log_id=LOG_ID
    )
    async with engine.begin() as conn:
        await conn.execute(insert(audit_events).values(**forged))
    return int(forged["seq"])


def reasons(report: VerifyReport) -> set[tuple[int, str]]:
    return {(p.seq, p.reason) for p in report.problems}


# -- row-level tampering: the chain and the signed tree heads -----------------------------------

Tamper = Callable[[AsyncEngine], Awaitable[None]]
CASES: list[tuple[str, Tamper, int, str]] = [
    ("edit a field", lambda e: edit_body(e, 14, completion_tokens=9999), 14, "row_hash_mismatch"),
    ("edit an indexed column", lambda e: set_row(e, 14, key_id="k9"), 14, "column_mismatch"),
    ("delete a middle row", lambda e: delete_rows(e, 14, 14), 14, "gap"),
]


@pytest.mark.parametrize(
    ("name", "tamper", "first_bad", "reason"), CASES, ids=[c[0] for c in CASES]
)
async def test_row_tampering_is_found_at_its_seq(
    log: Log, name: str, tamper: Tamper, first_bad: int, reason: str
) -> None:
    await tamper(log.engine)
    report = await log.verify()
    assert not report.ok
    assert (report.first_bad_seq, report.reason) == (first_bad, reason), name
    assert (0, "append_only_missing") in reasons(report)


async def test_an_edit_with_the_chain_recomputed_fails_the_signed_tree_heads_and_the_witness(
    log: Log,
) -> None:
    await edit_body(log.engine, 14, model="other-model")
    await rehash_from(log.engine, 14)
    report = await log.verify()
    assert report.chain_ok  # the chain alone is consistent again
    assert (report.first_bad_seq, report.reason) == (14, "checkpoint_root_mismatch")
    diverged = {p.witnessed_size for p in report.problems if p.reason == "witness_diverged"}
    assert {35, 40} <= diverged  # every witnessed tree head from row 14 on


async def test_rewrite_of_everything_resigned_with_a_new_key_is_untrusted(log: Log) -> None:
    """Attack 1: drop the admin.action rows, renumber, recompute, re-sign with a new key (and
    put that key in the data directory): verify never trusts a key it was not given."""
    await rewrite_history(log.engine, ATTACKER, lambda e: e.kind != "admin.action")
    report = await log.verify()
    assert not report.ok
    assert report.reason == "checkpoint_untrusted_key"
    assert report.checkpoints_untrusted == report.checkpoints_checked == 33
    truncated = {p.witnessed_size for p in report.problems if p.reason == "witness_truncated"}
    assert {35, 40} <= truncated
    # the attacker's key, named by the attacker, still cannot hide what the witness holds
    both = await log.verify([KEY.verify_key, ATTACKER.verify_key])
    assert not both.ok and "witness_truncated" in {p.reason for p in both.problems}


@pytest.mark.parametrize("pad", [0, 8])
async def test_rewrite_resigned_with_the_stolen_key_is_caught_by_the_witness(
    log: Log, pad: int
) -> None:
    """The laptop case: the attacker holds the signing key itself.  Only the witness shows it:
    a shorter log (pad 0) or one padded back to its old size whose roots differ (pad 8)."""
    await rewrite_history(log.engine, KEY, lambda e: e.kind != "admin.action", pad=pad)
    report = await log.verify()
    assert not report.ok
    assert report.checkpoints_untrusted == 0 and report.checkpoints_failed == 0
    found = {(p.reason, p.witnessed_size) for p in report.problems if p.witness}
    if pad:
        assert ("witness_diverged", 35) in found and ("witness_diverged", 40) in found
    else:
        assert ("witness_truncated", 35) in found and ("witness_truncated", 40) in found


async def test_truncating_the_tail_with_its_checkpoints_is_caught_and_blocks_the_restart(
    log: Log,
) -> None:
    """Attack 2: delete the last rows and the checkpoints covering them."""
    await delete_rows(log.engine, 33, 40)
    await delete_checkpoints_from_size(log.engine, 33)
    report = await log.verify()
    assert report.chain_ok and report.checkpoints_failed == 0
    assert (report.first_bad_seq, report.reason) == (33, "witness_truncated")
    assert {p.witnessed_size for p in report.problems if p.reason == "witness_truncated"} == {
        35,
        36,
        40,
    }
    with pytest.raises(AuditCorrupt, match=r"holds checkpoint .* at size 40.* ends at size 32"):
        await log.writer().start()


async def test_a_reset_database_does_not_start_and_fails_verification(
    log: Log, tmp_path: Path
) -> None:
    """Attack 3: the database is replaced by an empty one."""
    async with fresh_database("sqlite", tmp_path / "reset") as url:
        (tmp_path / "reset").mkdir(exist_ok=True)
        await upgrade(url)
        empty = Log(create_db_engine(url), log.witness)
        try:
            with pytest.raises(AuditCorrupt, match="empty, but witness"):
                await empty.writer().start()
            report = await empty.verify()
            assert not report.ok
            assert {"no_checkpoint", "witness_truncated"} <= {p.reason for p in report.problems}
            # a data directory that has its keys refuses an empty log even without a witness
            with pytest.raises(AuditCorrupt, match="has written it before"):
                await AuditWriter(empty.engine, signer=KEY, log_id=LOG_ID).start(genesis=False)
        finally:
            await empty.engine.dispose()


async def test_a_forged_append_is_an_unsigned_row_and_blocks_the_restart(log: Log) -> None:
    """Attack 4: INSERT a well-formed `keys.revoke` event after the last checkpoint."""
    seq = await forge_append(log.engine)
    report = await log.verify()
    assert (report.first_bad_seq, report.reason) == (seq, "unsigned_row")
    assert report.chain_ok and (report.chain_only_from, report.chain_only_rows) == (seq, 1)
    with pytest.raises(AuditCorrupt, match=r"ends at seq 41 .* covers 40"):
        await log.writer().start()


async def test_an_empty_log_and_missing_keys_never_verify(intact: Log, tmp_path: Path) -> None:
    """Attack 5, and verification with nothing pinned."""
    nothing = await verify(intact.engine, [])
    assert not nothing.ok and (0, "no_trusted_key") in reasons(nothing)
    assert nothing.trusted_keys == [] and nothing.checkpoints_untrusted == 44
    async with fresh_database("sqlite", tmp_path / "empty") as url:
        (tmp_path / "empty").mkdir(exist_ok=True)
        await upgrade(url)
        engine = create_db_engine(url)
        try:
            report = await verify(engine, TRUSTED)
            assert not report.ok and report.reason == "no_checkpoint"
        finally:
            await engine.dispose()


async def test_dropped_triggers_are_reported(log: Log) -> None:
    report = await log.verify()
    assert not report.ok
    assert (report.first_bad_seq, report.reason) == (0, "append_only_missing")


async def test_sqlite_refuses_an_insert_out_of_order(tmp_path: Path) -> None:
    """SQLite's INSERT trigger (defence in depth; PostgreSQL relies on its grants)."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'audit.db'}"
    await upgrade(url)
    engine = create_db_engine(url)
    try:
        async with AuditWriter(engine, signer=KEY, log_id=LOG_ID) as writer:
            await writer.append(make_event(1))
        last = (await rows(engine))[-1]
        for seq in (last["seq"] + 2, last["seq"]):
            forged = link(last["row_hash"], seq, make_event(7), log_id=LOG_ID)
            with pytest.raises(IntegrityError):
                async with engine.begin() as conn:
                    await conn.execute(insert(audit_events).values(**forged))
    finally:
        await engine.dispose()


async def test_a_declared_new_epoch_resumes_and_stays_evident(log: Log) -> None:
    """After the truncation, `airgate audit init --new-epoch` (its core): the log starts
    again, verifies, and names what the previous epoch's witness held that is gone."""
    await delete_rows(log.engine, 33, 40)
    await delete_checkpoints_from_size(log.engine, 33)
    writer = log.writer()
    await writer.start(check=False)
    await writer.mark("epoch", epoch=2)
    await writer.append(make_event(33, kind="audit.epoch", detail={"epoch": 2}))
    await writer.stop()
    async with log.writer() as resumed:  # the opening check passes in the new epoch
        await resumed.append(make_event(34))
    report = await log.verify()
    assert report.epoch == 2 and report.rows == 34
    assert [(x.epoch, x.witnessed_size, x.resumed_at) for x in report.epoch_losses] == [(1, 40, 32)]
    assert {p.reason for p in report.problems} == {"append_only_missing"}


async def test_checkpoints_are_chained_and_signed_by_the_pinned_key(intact: Log) -> None:
    async with intact.engine.connect() as conn:
        cps = [
            checkpoint_from_row(r)
            for r in (await conn.execute(select(audit_checkpoints).order_by("id"))).all()
        ]
    kinds = [cp.kind for cp in cps]
    assert kinds[0] == "open" and kinds.count("open") == 2 and kinds.count("close") == 2
    assert {cp.key_id for cp in cps} == {KEY.verify_key.key_id}
    assert cps[-1].size == 40
    assert all(b.prev_hash != a.prev_hash for a, b in itertools.pairwise(cps))
