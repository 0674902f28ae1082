"""A throwaway PostgreSQL audit log of realistic events, signed and valid, for the console
benchmark (`bench.console`): a one-off fixture, built on each run and dropped after it.

The log has `CHAINS` chains (as written by that many replicas), each a valid hash chain with a
signed batch checkpoint every `EVERY` rows, built with airgate's own code: `_head.extend` links
the rows (`chain.link`) and builds the tree heads, the local signer signs them.  The events are
spread over `DAYS` days and mix what a gateway logs (mostly completed inferences; some failures,
denials, rate limits, authentication failures, embeddings, audit reads and admin actions) over
`TEAMS` teams with `KEYS_PER_TEAM` keys each, `len(MODELS)` models and their deployments.

Each chain is built in its own process and loaded with COPY; the audit table's secondary indexes
are dropped during the load and rebuilt from their own definitions after it (one sort per index
instead of a million inserts into each), so the database ends exactly as the migrations left it.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from bundles.kms.signer import LocalSigner
from gateway.audit import AuditEvent, AuditPrincipal
from gateway.audit._head import Head, Signing, extend
from gateway.audit.chain import GENESIS
from gateway.audit.checkpoint import signed
from gateway.audit.merkle import CompactTree
from gateway.audit.schema import audit_events

__all__ = ["CHAINS", "Fill", "LogShape", "fill", "shape_event"]

CHAINS = ("b0c0a5e1", "b0c0a5e2", "b0c0a5e3")  # chain ids are hex
EVERY = 1000  # rows per checkpoint (`[audit] checkpoint_every`'s default)
DAYS = 30
TEAMS = 12
KEYS_PER_TEAM = 12
MODELS = {  # model: its deployments
    "gemma-3-27b": ("gemma-27b-h100-a", "gemma-27b-h100-b"),
    "gemma-3-4b": ("gemma-4b-l40s",),
    "qwen3-32b": ("qwen-32b-h100",),
    "minilm-l6": ("minilm-cpu",),
}
_CHAT_MODELS = ("gemma-3-27b", "gemma-3-4b", "qwen3-32b")
# (kind, outcome, http status, share)
_MIX = (
    ("inference.completed", "success", 200, 0.80),
    ("embedding.completed", "success", 200, 0.06),
    ("inference.failed", "failure", 502, 0.02),
    ("inference.cancelled", "cancelled", 499, 0.01),
    ("policy.denied", "denied", 403, 0.03),
    ("rate.limited", "denied", 429, 0.03),
    ("auth.failure", "failure", 401, 0.03),
    ("audit.access", "success", 200, 0.015),
    ("admin.action", "success", 200, 0.005),
)
_KINDS = [m[:3] for m in _MIX]
_CHECKPOINT_COLUMNS = (  # `Checkpoint.row()`'s keys, in its order
    "id", "log_id", "epoch", "kind", "last_seq", "merkle_root", "first_seq", "count",
    "prev_hash", "ts_us", "alg", "key_id", "signature", "frontier",
)  # fmt: skip
_WEIGHTS = [m[3] for m in _MIX]


@dataclass(frozen=True)
class LogShape:
    """What the benchmark's queries look for: names that exist in the log."""

    teams: tuple[str, ...]
    keys: tuple[str, ...]  # key ids, team i's keys at i*KEYS_PER_TEAM...
    models: tuple[str, ...]
    deployments: tuple[str, ...]
    start: datetime
    end: datetime


def log_shape(end: datetime) -> LogShape:
    teams = tuple(f"team-{i:02d}" for i in range(TEAMS))
    keys = tuple(f"k{t:02d}{k:02d}a7f3" for t in range(TEAMS) for k in range(KEYS_PER_TEAM))
    deployments = tuple(d for ds in MODELS.values() for d in ds)
    return LogShape(teams, keys, tuple(MODELS), deployments, end - timedelta(days=DAYS), end)


def shape_event(rng: random.Random, shape: LogShape, ts: datetime, n: int) -> AuditEvent:
    """One event of the mix at `ts` (metadata only, as the gateway writes it)."""
    kind, outcome, status = rng.choices(_KINDS, _WEIGHTS)[0]
    team_i = min(int(rng.paretovariate(1.2)) - 1, TEAMS - 1)  # a few teams do most of it
    key = shape.keys[team_i * KEYS_PER_TEAM + rng.randrange(KEYS_PER_TEAM)]
    principal = AuditPrincipal(key_id=key, team=shape.teams[team_i], method="api_key")
    common: dict[str, Any] = {
        "event_id": f"{n:012x}{rng.getrandbits(80):020x}",
        "ts": ts,
        "kind": kind,
        "outcome": outcome,
        "request_id": f"req-{rng.getrandbits(64):016x}",
        "http_status": status,
    }
    if kind == "auth.failure":
        return AuditEvent(**common, client_address="10.1.2.3", error_class="invalid_api_key")
    if kind in ("audit.access", "admin.action"):
        action = "audit.search" if kind == "audit.access" else "keys.create"
        return AuditEvent(**common, principal=principal, action=action, detail={"count": 50})
    model = "minilm-l6" if kind == "embedding.completed" else rng.choice(_CHAT_MODELS)
    deployment = rng.choice(MODELS[model])
    served = {"principal": principal, "model": model, "deployment": deployment}
    if kind == "embedding.completed":
        return AuditEvent(
            **common, **served, action="embeddings", route="/v1/embeddings", inputs_count=8,
            prompt_tokens=512, latency_ms=12.5,
        )  # fmt: skip
    if kind in ("policy.denied", "rate.limited"):
        return AuditEvent(
            **common, **served, action="chat.completions", route="/v1/chat/completions",
            decision="denied" if kind == "policy.denied" else "rate_limited",
        )  # fmt: skip
    tokens = rng.randrange(20, 2000)
    return AuditEvent(
        **common, **served, action="chat.completions", route="/v1/chat/completions",
        prompt_tokens=tokens, completion_tokens=rng.randrange(1, 800),
        latency_ms=round(rng.uniform(80, 9000), 2), ttft_ms=round(rng.uniform(15, 400), 2),
        finish_reason="stop", policy_version="2026.11.3",
        sampling={"temperature": 0.7, "max_tokens": 1024, "stream": True},
        error_class="EngineUnavailable" if kind == "inference.failed" else None,
    )  # fmt: skip


@dataclass(frozen=True)
class Fill:
    rows: int
    checkpoints: int
    build_s: float  # building and hashing rows, signing checkpoints (in parallel processes)
    load_s: float  # COPY and index rebuild
    shape: LogShape


def _chain(job: tuple[str, int, int, bytes, str, datetime]) -> tuple[int, int, float]:
    """Build chain `log_id` of `n` rows and COPY it into `dsn`: (rows, checkpoints, build s)."""
    log_id, index, n, key_pem, dsn, end = job
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    signer = LocalSigner(load_pem_private_key(key_pem, None))  # type: ignore[arg-type]
    shape = log_shape(end)
    rng = random.Random(index)
    span_us = int((shape.end - shape.start) / timedelta(microseconds=1))
    offsets = sorted(rng.randrange(span_us) for _ in range(n))
    signing = Signing(log_id=log_id, alg=signer.alg, key_id=signer.verify_key.key_id)
    head = Head(seq=0, row_hash=GENESIS, checkpoint=None, tree=CompactTree())
    names = [c.name for c in audit_events.columns]
    started = time.perf_counter()
    records: list[tuple[Any, ...]] = []
    checkpoints: list[tuple[Any, ...]] = []
    for first in range(0, n, EVERY):
        batch = [
            shape_event(rng, shape, shape.start + timedelta(microseconds=offsets[i]), index * n + i)
            for i in range(first, min(first + EVERY, n))
        ]
        last_us = offsets[first + len(batch) - 1] + int(shape.start.timestamp() * 1e6)
        rows, unsigned, head = extend(head, batch, every=EVERY, ts_us=last_us + 1, signing=signing)
        records.extend(tuple(row.get(name) for name in names) for row in rows)
        for checkpoint, frontier in unsigned:
            done = signed(checkpoint, signer.sign(checkpoint.message()))
            checkpoints.append(tuple(done.row(frontier).values()))
    build_s = time.perf_counter() - started
    asyncio.run(_copy(dsn, names, records, checkpoints))
    return len(records), len(checkpoints), build_s


async def _copy(
    dsn: str, names: list[str], records: list[tuple[Any, ...]], checkpoints: list[tuple[Any, ...]]
) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        cp_names = list(_CHECKPOINT_COLUMNS)
        async with conn.transaction():
            await conn.copy_records_to_table("audit_events", records=records, columns=names)
            await conn.copy_records_to_table(
                "audit_checkpoints", records=checkpoints, columns=cp_names
            )
    finally:
        await conn.close()


async def fill(dsn: str, signer_pem: bytes, rows: int, end: datetime) -> Fill:
    """Fill the migrated, empty database `dsn` (a libpq URL) with `rows` events over
    `CHAINS`; the secondary indexes are rebuilt after the load."""
    conn = await asyncpg.connect(dsn)
    try:
        indexes = await conn.fetch(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'audit_events' "
            "AND indexname LIKE 'ix_%'"
        )
        for index in indexes:
            await conn.execute(f'DROP INDEX "{index["indexname"]}"')
    finally:
        await conn.close()
    per = [rows // len(CHAINS) + (i < rows % len(CHAINS)) for i in range(len(CHAINS))]
    jobs = [(c, i, per[i], signer_pem, dsn, end) for i, c in enumerate(CHAINS)]
    started = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(len(jobs)) as pool:
        done = pool.map(_chain, jobs)
    conn = await asyncpg.connect(dsn)
    try:
        for index in indexes:
            await conn.execute(index["indexdef"])
        await conn.execute("ANALYZE audit_events")
        await conn.execute("ANALYZE audit_checkpoints")
    finally:
        await conn.close()
    total_s = time.perf_counter() - started
    build_s = max(d[2] for d in done)
    return Fill(
        rows=sum(d[0] for d in done),
        checkpoints=sum(d[1] for d in done),
        build_s=build_s,
        load_s=total_s - build_s,
        shape=log_shape(end),
    )


if __name__ == "__main__":  # a quick look at the events' shape
    rng_ = random.Random(0)
    shape_ = log_shape(datetime.now(UTC))
    for i_ in range(5):
        print(shape_event(rng_, shape_, datetime.now(UTC), i_))
