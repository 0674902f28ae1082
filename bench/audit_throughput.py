"""How many events per second the audit writer commits with many concurrent appenders.

Every group commit writes its rows and a checkpoint signed over the whole log's Merkle tree head
in one transaction (`gateway.audit.writer`), so this measures the hash chain, the tree and one
Ed25519 signature per batch (the local signer), plus the open and close checkpoints.  The log is
verified after each run with the signer's public key, so a figure never comes from a log that
would not verify.

    python -m bench.audit_throughput [--events N] [--runs R] [--quick] [--output FILE]

runs it on SQLite (a file in a temporary directory: WAL, synchronous=FULL, the gateway's
default) and on PostgreSQL (a throwaway database on 127.0.0.1:5432, trust auth, dropped after),
prints the `audit` section and writes it into BENCHMARKS.md (not with `--quick`, unless
`--output` is given).  `measure_throughput` is also what the `access` scenario calls.  The
figure depends on the disk (SQLite fsyncs every group commit) and on the database server.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from bench._report import (
    Spread,
    collect_environment,
    markdown_table,
    publish,
    redacted_argv,
    say,
)
from bundles.kms.signer import LocalSigner, Signer
from gateway.audit import AuditEvent, AuditPrincipal, AuditWriter, new_event_id, verify
from gateway.audit.schema import audit_checkpoints

__all__ = ["Throughput", "measure", "measure_throughput", "sample_event"]

NAME = "audit"
LOG_ID = "bench0audit0log0"
SQLITE_TARGET = 10_000.0  # events/s (issue 15)
POSTGRES_TARGET = 5_000.0
PG_ADMIN = "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
_DISTRIBUTIONS = ("airgate", "sqlalchemy", "aiosqlite", "asyncpg", "cryptography")


def sample_event(i: int) -> AuditEvent:
    """A typical completed-inference event (metadata only)."""
    return AuditEvent(
        event_id=new_event_id(),
        ts=datetime.now(UTC),
        kind="inference.completed",
        outcome="success",
        request_id=f"req-{i}",
        principal=AuditPrincipal(key_id=f"key{i % 17}", team=f"team{i % 5}", method="api_key"),
        action="chat.completions",
        model="gemma-3-270m",
        deployment="llamacpp-0",
        route="/v1/chat/completions",
        http_status=200,
        prompt_tokens=42,
        completion_tokens=128,
        latency_ms=812.5,
        ttft_ms=35.25,
        finish_reason="stop",
        sampling={"temperature": 0.7, "top_p": 0.95, "max_tokens": 256, "stream": True},
        request_bytes=1234,
        response_bytes=5678,
        policy_version="0123456789abcdef",
        decision="allowed",
    )


@dataclass(frozen=True, slots=True)
class Throughput:
    """One measured run: `events` strict appends in `seconds` (start and stop not included)."""

    events: int
    seconds: float
    batches: int  # group commits, each with its signed checkpoint
    checkpoints: int  # signed by the writer: one or more per batch, plus open and close

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else float("inf")


async def measure(
    engine: AsyncEngine,
    n: int,
    *,
    concurrency: int = 256,
    signer: Signer | None = None,
    checkpoint_every: int = 1000,
) -> Throughput:
    """`n` strict appends from `concurrency` tasks to the log `engine` points at (migrated);
    each returns once its group commit, rows and signed checkpoint, is durable."""
    events = [sample_event(i) for i in range(n)]
    writer = AuditWriter(
        engine,
        signer=signer or LocalSigner(Ed25519PrivateKey.generate()),
        log_id=LOG_ID,
        checkpoint_every=checkpoint_every,
    )
    async with writer:

        async def appender(k: int) -> None:
            for event in events[k::concurrency]:
                await writer.append(event)

        started = time.perf_counter()
        await asyncio.gather(*(appender(k) for k in range(concurrency)))
        elapsed = time.perf_counter() - started
    stats = writer.stats
    return Throughput(n, elapsed, stats.batches, stats.checkpoints)


async def measure_throughput(
    engine: AsyncEngine, n: int, *, concurrency: int = 256, signer: Signer | None = None
) -> float:
    """Events per second of `measure` (checkpoints included)."""
    return (await measure(engine, n, concurrency=concurrency, signer=signer)).rate


# -- the scenario --------------------------------------------------------------------------------


@asynccontextmanager
async def _database(kind: str) -> AsyncIterator[str]:
    """The URL of a new, empty database of `kind`, removed afterwards."""
    from gateway.db import create_db_engine

    if kind == "sqlite":
        with tempfile.TemporaryDirectory(prefix="airgate-bench-audit-") as tmp:
            yield f"sqlite+aiosqlite:///{tmp}/audit.db"
        return
    name = f"airgate_bench_{uuid.uuid4().hex[:8]}"
    admin = create_db_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as conn:
            await conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
        finally:
            async with admin.connect() as conn:
                await conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    finally:
        await admin.dispose()


async def _one_run(kind: str, n: int) -> Throughput:
    """A fresh database, `n` events, then the whole log verified with the signer's key."""
    from gateway.db import create_db_engine
    from gateway.db.migrate import upgrade

    async with _database(kind) as url:
        await upgrade(url)
        engine = create_db_engine(url)
        try:
            signer = LocalSigner(Ed25519PrivateKey.generate())
            result = await measure(engine, n, signer=signer)
            report = await verify(engine, [signer.verify_key])
            async with engine.connect() as conn:
                stored = (
                    await conn.execute(select(func.count()).select_from(audit_checkpoints))
                ).scalar_one()
        finally:
            await engine.dispose()
    if not report.ok or report.rows != n or not report.tree_checked:
        raise RuntimeError(f"the {kind} log did not verify: {report.reason} ({report.rows} rows)")
    if stored != result.checkpoints or result.checkpoints < result.batches + 2:
        raise RuntimeError(f"{kind}: {stored} checkpoints stored, {result.batches} batches")
    return result


def render(command: str, n: int, results: dict[str, list[Throughput]]) -> tuple[str, bool]:
    """The section's markdown, and whether both targets were met."""
    env = collect_environment(command, _DISTRIBUTIONS)
    labels = {"sqlite": "SQLite (WAL, synchronous=FULL)", "postgresql": "PostgreSQL"}
    targets = {"sqlite": SQLITE_TARGET, "postgresql": POSTGRES_TARGET}
    rows, checks = [], []
    passed = True
    for kind, runs in results.items():
        rate = Spread.of([r.rate for r in runs])
        per_batch = Spread.of([r.events / r.batches for r in runs])
        checkpoints = statistics.median(r.checkpoints for r in runs)
        rows.append(
            [
                labels[kind],
                rate.format(".0f"),
                per_batch.format(".0f"),
                f"{checkpoints:,.0f}",
            ]
        )
        ok = rate.median >= targets[kind]
        passed = passed and ok
        checks.append(
            [
                f"audit events/s, {labels[kind]}",
                rate.format(".0f"),
                f">= {targets[kind]:,.0f}",
                "PASS" if ok else "FAIL",
            ]
        )
    count = len(next(iter(results.values())))
    body = "\n".join(
        [
            "## Audit log: events/s with a signed checkpoint per group commit",
            "",
            env.markdown(),
            f"- {n:,} `inference.completed` events per database per run, appended strictly "
            "(each `append` returns once its group commit is durable) by 256 concurrent tasks. "
            "Every group commit inserts its rows and one checkpoint (the RFC 6962 tree head "
            "over the whole log, chained to the previous checkpoint, signed with Ed25519 by "
            "the local signer) in one transaction, plus one more per 1,000 rows inside a "
            "larger batch; the writer signs an `open` and a `close` checkpoint around the run "
            "(not timed). After each run the whole log is verified with the signer's public "
            "key (chain, every tree head, every signature): a run that does not verify is an "
            "error, not a figure.",
            "- SQLite: a new file in a temporary directory; PostgreSQL: a new database on "
            "127.0.0.1:5432, dropped after the run.",
            f"- {count} run(s); figures: median (min–max). Previous design (a checkpoint every "
            "1,000 rows, committed after its rows): 17,657 events/s on "
            "SQLite and 10,525 on PostgreSQL (the `access` section, 2026-11-29, on the machine "
            "it names).",
            "",
            markdown_table(
                ["Database", "Events/s", "Events per group commit", "Checkpoints signed"],
                rows,
            ),
            "",
            markdown_table(["Check", "Figure", "Target", "Result"], checks),
        ]
    )
    return body, passed


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.audit_throughput",
        description="audit events/s on SQLite and PostgreSQL; results go to BENCHMARKS.md",
    )
    parser.add_argument("--events", type=int, default=20_000, help="events per run")
    parser.add_argument("--runs", type=int, default=3, help="runs per database (default 3)")
    parser.add_argument("--quick", action="store_true", help="1 run of 2,000 events; print only")
    parser.add_argument(
        "--database",
        action="append",
        choices=("sqlite", "postgresql"),
        help="database to measure (repeatable; default both)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        help="file to write the section into (default BENCHMARKS.md; --quick: print only)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    n = 2_000 if args.quick else args.events
    runs = 1 if args.quick else args.runs
    if n < 1 or runs < 1:
        print("bench.audit_throughput: --events and --runs must be positive", file=sys.stderr)
        return 2
    results: dict[str, list[Throughput]] = {}
    for kind in args.database or ("sqlite", "postgresql"):
        for attempt in range(runs):
            say(f"bench: audit throughput, {kind}, run {attempt + 1}/{runs}")
            results.setdefault(kind, []).append(asyncio.run(_one_run(kind, n)))
    command = shlex.join(["python", "-m", "bench.audit_throughput", *redacted_argv(argv)])
    body, passed = render(command, n, results)
    publish(
        "bench.audit_throughput",
        NAME,
        body,
        args.output,
        full=not args.quick and args.database is None,
    )
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
