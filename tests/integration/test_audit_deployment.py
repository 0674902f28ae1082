"""Searching the audit log by deployment (issue 18): the `deployment` column the migration
`20261204_01_deployment` adds and fills from each stored body, on SQLite and on a real
PostgreSQL database; verification holding the copy to the body; the filter in the search, the
compliance API and the console; and the plans PostgreSQL picks for the console's queries on a
log of 20,000 events (which index, not how fast).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from databases import fresh_database
from sqlalchemy import insert, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from bundles.kms.signer import LocalSigner
from gateway.audit import AuditEvent, AuditPrincipal, AuditWriter, search, verify_log
from gateway.audit._head import Head, Signing, extend
from gateway.audit.chain import GENESIS
from gateway.audit.checkpoint import signed
from gateway.audit.merkle import CompactTree
from gateway.audit.query import AuditFilter, rows_query
from gateway.audit.schema import append_only_intact, audit_checkpoints, audit_events
from gateway.db import create_db_engine
from gateway.db.migrate import current_revision, head_revision, upgrade

BEFORE = "20261203_01_chains"
T0 = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)
DEPLOYMENTS = ("gemma-a", "gemma-b", None)  # None: an event that names no deployment
LOG_ID = "0dep10e0"


def event(i: int) -> AuditEvent:
    deployment = DEPLOYMENTS[i % len(DEPLOYMENTS)]
    return AuditEvent(
        event_id=f"dep-{i}",
        ts=T0 + timedelta(seconds=i),
        kind="inference.completed" if deployment else "auth.failure",
        outcome="success" if deployment else "failure",
        principal=AuditPrincipal(key_id=f"key-{i % 4}", team=f"team-{i % 2}"),
        model="gemma" if deployment else None,
        deployment=deployment,
        # an admin event's detail may also say "deployment": never taken for the event's own
        detail={} if deployment else {"deployment": "not-this-one"},
    )


def signed_log(
    events: Sequence[AuditEvent], signer: LocalSigner, every: int = 1000
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rows and signed checkpoints of a valid chain of `events` (airgate's own code)."""
    signing = Signing(log_id=LOG_ID, alg=signer.alg, key_id=signer.verify_key.key_id)
    head = Head(seq=0, row_hash=GENESIS, checkpoint=None, tree=CompactTree())
    rows, unsigned, _ = extend(head, events, every=every, ts_us=0, signing=signing)
    checkpoints = [signed(cp, signer.sign(cp.message())).row(frontier) for cp, frontier in unsigned]
    return rows, checkpoints


async def load(engine: AsyncEngine, rows: list[dict[str, Any]], cps: list[dict[str, Any]]) -> None:
    async with engine.begin() as conn:
        await conn.execute(insert(audit_events), rows)
        await conn.execute(insert(audit_checkpoints), cps)


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
async def test_the_migration_fills_the_column_from_each_body(kind: str, tmp_path: Path) -> None:
    signer = LocalSigner(Ed25519PrivateKey.generate())
    events = [event(i) for i in range(30)]
    rows, cps = signed_log(events, signer, every=10)
    async with fresh_database(kind, tmp_path) as url:
        await upgrade(url, BEFORE)
        engine = create_db_engine(url)
        try:
            old = [{k: v for k, v in row.items() if k != "deployment"} for row in rows]
            async with engine.begin() as conn:  # the schema before: no deployment column
                await conn.execute(text(_insert_sql(old[0])), old)
                await conn.execute(insert(audit_checkpoints), cps)
            await upgrade(url)
            assert await current_revision(url) == head_revision()
            async with engine.connect() as conn:
                query = select(audit_events.c.event_id, audit_events.c.deployment)
                stored = {row[0]: row[1] for row in (await conn.execute(query)).all()}
                assert await append_only_intact(conn)
            assert stored == {e.event_id: e.deployment for e in events}
            report = await verify_log(engine, [signer.verify_key])
            assert report.ok, report.chains[0].problems
            found, _ = await search(engine, deployment="gemma-b")
            assert [r.event.event_id for r in found] == [e.event_id for e in events[1::3]]
            with pytest.raises(DBAPIError):  # still append-only after the migration
                async with engine.begin() as conn:
                    await conn.execute(text("UPDATE audit_events SET deployment = 'x'"))
        finally:
            await engine.dispose()


def _insert_sql(row: dict[str, Any]) -> str:
    names = list(row)
    return (
        f"INSERT INTO audit_events ({', '.join(names)}) "
        f"VALUES ({', '.join(':' + n for n in names)})"
    )


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
async def test_a_body_that_is_not_json_does_not_stop_the_migration(
    kind: str, tmp_path: Path
) -> None:
    signer = LocalSigner(Ed25519PrivateKey.generate())
    rows, cps = signed_log([event(i) for i in range(4)], signer)
    old = [{k: v for k, v in row.items() if k != "deployment"} for row in rows]
    old[1]["body"] = '{"deployment":"gemma-a", truncated'  # tampered before the upgrade
    async with fresh_database(kind, tmp_path) as url:
        await upgrade(url, BEFORE)
        engine = create_db_engine(url)
        try:
            async with engine.begin() as conn:
                await conn.execute(text(_insert_sql(old[0])), old)
                await conn.execute(insert(audit_checkpoints), cps)
            await upgrade(url)
            async with engine.connect() as conn:
                query = select(audit_events.c.deployment).order_by(audit_events.c.seq)
                got = (await conn.execute(query)).scalars().all()
            assert got == ["gemma-a", None, None, "gemma-a"]
            report = await verify_log(engine, [signer.verify_key])
            assert not report.ok and report.chains[0].first_bad_seq == 2
        finally:
            await engine.dispose()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
async def test_verify_finds_an_edited_deployment_column(kind: str, tmp_path: Path) -> None:
    signer = LocalSigner(Ed25519PrivateKey.generate())
    rows, cps = signed_log([event(i) for i in range(6)], signer)
    rows[3]["deployment"] = "gemma-b"  # the body says gemma-a: hidden from its own search
    async with fresh_database(kind, tmp_path) as url:
        await upgrade(url)
        engine = create_db_engine(url)
        try:
            await load(engine, rows, cps)
            chain = (await verify_log(engine, [signer.verify_key])).chains[0]
            assert (chain.first_bad_seq, chain.reason) == (4, "column_mismatch")
        finally:
            await engine.dispose()


async def test_the_writer_stores_the_deployment_and_the_api_filters_on_it(
    tmp_path: Path,
) -> None:
    async with fresh_database("sqlite", tmp_path) as url:
        await upgrade(url)
        engine = create_db_engine(url)
        signer = LocalSigner(Ed25519PrivateKey.generate())
        writer = AuditWriter(engine, signer=signer, log_id=LOG_ID)
        await writer.start()
        try:
            for i in range(9):
                await writer.append(event(i))
        finally:
            await writer.stop()
        try:
            found, _ = await search(engine, deployment="gemma-a", team="team-0")
            assert [r.event.event_id for r in found] == ["dep-0", "dep-6"]
            assert (await search(engine, deployment="<none>"))[0] == []
            assert (await verify_log(engine, [signer.verify_key])).ok
        finally:
            await engine.dispose()


# -- plans on PostgreSQL --------------------------------------------------------------------


def _plan_indexes(plan: dict[str, Any]) -> list[str]:
    found = [plan["Index Name"]] if "Index Name" in plan else []
    for child in plan.get("Plans", ()):
        found += _plan_indexes(child)
    return found


async def test_postgresql_plans_use_the_filter_indexes(tmp_path: Path) -> None:
    """20,000 events: each console query reads through its index, and a deep page starts its
    index scan at the cursor's time (it does not read the filter's rows before it)."""
    from sqlalchemy.dialects import postgresql

    signer = LocalSigner(Ed25519PrivateKey.generate())
    n = 20_000
    events = [
        AuditEvent(
            event_id=f"plan-{i}",
            ts=T0 + timedelta(seconds=i),
            kind="inference.completed",
            outcome="success",
            principal=AuditPrincipal(key_id=f"key-{i % 50}", team=f"team-{i % 10}"),
            model=f"model-{i % 4}",
            deployment=f"deploy-{i % 8}",
        )
        for i in range(n)
    ]
    rows, cps = signed_log(events, signer)
    async with fresh_database("postgresql", tmp_path) as url:
        await upgrade(url)
        engine = create_db_engine(url)
        try:
            await load(engine, rows, cps)
            async with engine.connect() as conn:
                await conn.execute(text("ANALYZE audit_events"))
            middle = rows[n // 2]
            after = (middle["ts_us"], LOG_ID, middle["seq"])
            cases = {
                "ix_audit_events_ts_us_log_id_seq": AuditFilter(),
                "ix_audit_events_team_ts_us": AuditFilter(team="team-3"),
                "ix_audit_events_key_id_ts_us": AuditFilter(key_id="key-7"),
                "ix_audit_events_deployment_ts_us": AuditFilter(deployment="deploy-5"),
                "ix_audit_events_kind_outcome_ts_us": AuditFilter(
                    kind="inference.completed", outcome="failure"
                ),
            }
            for index, flt in cases.items():
                for position in (None, after):
                    query = rows_query(flt, after=position, limit=51) if position else rows_query(
                        flt, limit=51
                    )  # fmt: skip
                    sql = str(
                        query.compile(
                            dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}
                        )
                    )
                    async with engine.connect() as conn:
                        await conn.execute(text("SET enable_seqscan = off"))
                        raw = (
                            await conn.execute(text(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}"))
                        ).scalar_one()
                    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
                    assert index in _plan_indexes(plan), (index, position, plan)
                    if position is not None:  # the scan starts at the cursor, not before
                        conditions = _index_conditions(plan)
                        assert any("ts_us" in c for c in conditions), json.dumps(plan)
        finally:
            await engine.dispose()


def _index_conditions(plan: dict[str, Any]) -> list[str]:
    own = [plan["Index Cond"]] if "Index Cond" in plan else []
    return own + [c for child in plan.get("Plans", ()) for c in _index_conditions(child)]
