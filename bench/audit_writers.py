"""Many replicas, one PostgreSQL audit log: a chain per writer against one serialised chain.

Three writer processes (three replicas' audit writers, each with its own signing key) append
to one PostgreSQL database for a fixed time, each from 32 concurrent strict appenders, in two
designs:

- `chains` (what airgate does): each writer appends to its own chain (`log_id`), with its own
  sequence, checkpoints and key; the writers never wait for each other.
- `serialised`: one chain for all; every group commit takes a transaction-scoped advisory lock,
  re-reads the head (the last checkpoint and its tree frontier) inside the transaction, extends
  it, signs and inserts, so the chain's writers take turns.  This is the other design the issue
  names, built here only to be measured (`SerialisedWriter`).

Both logs are verified afterwards with the three public keys (a figure never comes from a log
that does not verify).  Reports events/s, append latency (p50, p99: what a strict request
waits for its event) and failures.

    python -m bench.audit_writers [--seconds S] [--runs R] [--quick] [--output FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import insert, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from bench._report import (
    Spread,
    collect_environment,
    markdown_table,
    publish,
    redacted_argv,
    say,
)
from bench.audit_throughput import _database, sample_event
from bundles.kms.signer import LocalSigner
from gateway.audit import AuditUnavailable, AuditWriter, verify_log
from gateway.audit._head import Head, extend, parse_frontier
from gateway.audit.checkpoint import Checkpoint, CheckpointKind, checkpoint_from_row
from gateway.audit.merkle import CompactTree
from gateway.audit.schema import audit_checkpoints, audit_events

__all__ = ["SerialisedWriter"]

NAME = "audit-writers"
WRITERS = 3
CONCURRENCY = 32
SHARED = "5e71a11sed0chain"  # the serialised design's one chain
_LOCK = 0x41_75_64_69_74  # the serialised design's advisory lock key
_DISTRIBUTIONS = ("airgate", "sqlalchemy", "asyncpg", "cryptography")


class _NoLease:
    """The serialised design shares its chain between processes: no per-chain lease."""

    async def acquire(self, wait_s: float = 0.0) -> None:
        return None

    async def release(self) -> None:
        return None


class SerialisedWriter(AuditWriter):
    """One chain shared by several processes, serialised by an advisory lock per commit."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lease = _NoLease()  # type: ignore[assignment]

    async def mark(self, kind: CheckpointKind, *, epoch: int | None = None) -> Checkpoint:
        raise AuditUnavailable("the serialised bench writer signs no open/close marks")

    async def stop(self) -> None:
        self._head = None  # no close mark either
        await super().stop()

    async def _reload(self) -> Head | None:
        return None

    async def _load_head(self) -> Head:
        # every commit reads the head inside its lock; outside it the head is always moving
        return Head(seq=0, row_hash="0" * 64, checkpoint=None, tree=CompactTree())

    async def _commit(self, batch: list[Any]) -> None:
        try:
            async with self._engine.begin() as conn:
                await conn.execute(text("SELECT pg_advisory_xact_lock(:k)").bindparams(k=_LOCK))
                head = await _head_in(conn, self.signing.log_id)
                rows, unsigned, new_head = extend(
                    head,
                    [event for event, _ in batch],
                    every=self._every,
                    ts_us=self._ts_us(),
                    signing=self.signing,
                )
                checkpoints = await self._sign([c for c, _ in unsigned])
                cp_rows = [
                    c.row(frontier) for c, (_, frontier) in zip(checkpoints, unsigned, strict=True)
                ]
                await conn.execute(insert(audit_events), rows)
                await conn.execute(insert(audit_checkpoints), cp_rows)
        except Exception as exc:
            self._fail(batch, exc)
            return
        new_head = msgspec.structs.replace(new_head, checkpoint=checkpoints[-1])
        self._committed(head, new_head, batch, len(checkpoints))


async def _head_in(conn: AsyncConnection, log_id: str) -> Head:
    cps, ev = audit_checkpoints.c, audit_events.c
    row = (
        await conn.execute(
            select(audit_checkpoints).where(cps.log_id == log_id).order_by(cps.id.desc()).limit(1)
        )
    ).first()
    if row is None:
        return Head(seq=0, row_hash="0" * 64, checkpoint=None, tree=CompactTree())
    checkpoint = checkpoint_from_row(row)
    last = (
        await conn.execute(
            select(ev.row_hash).where(ev.log_id == log_id, ev.seq == checkpoint.size)
        )
    ).scalar()
    return Head(
        seq=checkpoint.size,
        row_hash=str(last or "0" * 64),
        checkpoint=checkpoint,
        tree=CompactTree(checkpoint.size, parse_frontier(str(row.frontier))),
    )


@dataclass(frozen=True, slots=True)
class WriterRun:
    appended: int
    failed: int
    latencies_ms: list[float]
    key: str  # the writer's public key text


async def _write(url: str, design: str, index: int, seconds: float, key: bytes) -> WriterRun:
    from gateway.db import create_db_engine

    signer = LocalSigner(Ed25519PrivateKey.from_private_bytes(key))
    engine = create_db_engine(url)
    cls = SerialisedWriter if design == "serialised" else AuditWriter
    log_id = SHARED if design == "serialised" else f"{index + 1:016x}"
    writer = cls(engine, signer=signer, log_id=log_id)
    latencies: list[float] = []
    failed = 0
    try:
        await writer.start(check=design != "serialised")
        deadline = time.perf_counter() + seconds

        async def appender(k: int) -> None:
            nonlocal failed
            i = k
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                try:
                    await writer.append(sample_event(i))
                except AuditUnavailable:
                    failed += 1
                else:
                    latencies.append((time.perf_counter() - started) * 1000)
                i += CONCURRENCY

        await asyncio.gather(*(appender(k) for k in range(CONCURRENCY)))
    finally:
        await writer.stop()
        await engine.dispose()
    return WriterRun(len(latencies), failed, latencies, signer.verify_key.text)


def _process(args: tuple[str, str, int, float, bytes]) -> WriterRun:
    return asyncio.run(_write(*args))


@dataclass(frozen=True, slots=True)
class DesignRun:
    rate: float
    p50_ms: float
    p99_ms: float
    failed: int
    chains: int


async def _verify(url: str, keys: list[str]) -> tuple[bool, int, int]:
    from bundles.kms.signer import parse_verify_key
    from gateway.db import create_db_engine

    engine = create_db_engine(url)
    try:
        report = await verify_log(engine, [parse_verify_key(k) for k in keys])
    finally:
        await engine.dispose()
    return report.ok, len(report.chains), sum(c.rows for c in report.chains)


async def _one_run(design: str, seconds: float) -> DesignRun:
    from gateway.db.migrate import upgrade

    async with _database("postgresql") as url:
        await upgrade(url)
        keys = [Ed25519PrivateKey.generate().private_bytes_raw() for _ in range(WRITERS)]
        jobs = [(url, design, i, seconds, keys[i]) for i in range(WRITERS)]
        context = multiprocessing.get_context("spawn")
        loop = asyncio.get_running_loop()
        with context.Pool(WRITERS) as pool:
            runs = await loop.run_in_executor(None, pool.map, _process, jobs)
        ok, chains, rows = await _verify(url, [r.key for r in runs])
    appended = sum(r.appended for r in runs)
    if not ok or rows != appended:
        raise RuntimeError(f"{design}: the log did not verify ({rows} rows, {appended} appended)")
    latencies = sorted(x for r in runs for x in r.latencies_ms)
    return DesignRun(
        rate=appended / seconds,
        p50_ms=statistics.median(latencies),
        p99_ms=latencies[int(len(latencies) * 0.99) - 1],
        failed=sum(r.failed for r in runs),
        chains=chains,
    )


def render(command: str, seconds: float, results: dict[str, list[DesignRun]]) -> str:
    env = collect_environment(command, _DISTRIBUTIONS)
    labels = {
        "chains": "a chain per writer (airgate)",
        "serialised": "one chain, serialised (advisory lock per commit)",
    }
    rows = []
    for design, runs in results.items():
        rows.append(
            [
                labels[design],
                Spread.of([r.rate for r in runs]).format(",.0f"),
                Spread.of([r.p50_ms for r in runs]).format(".2f"),
                Spread.of([r.p99_ms for r in runs]).format(".2f"),
                str(sum(r.failed for r in runs)),
                str(runs[0].chains),
            ]
        )
    ratio = statistics.median(r.rate for r in results["chains"]) / statistics.median(
        r.rate for r in results["serialised"]
    )
    count = len(results["chains"])
    return "\n".join(
        [
            "## Audit log with several writers: a chain per writer against one serialised chain",
            "",
            env.markdown(),
            f"- {WRITERS} writer processes (as {WRITERS} replicas), each with its own Ed25519 "
            f"key and {CONCURRENCY} concurrent strict appenders, for {seconds:g} s on one "
            "PostgreSQL database (127.0.0.1:5432, a new database per run). Latency: from "
            "`append` to its group commit (rows and signed checkpoint) being durable, what a "
            "strict-mode request waits for. Each log is verified afterwards with the three "
            "public keys.",
            "- The serialised design holds a transaction-scoped advisory lock while it reads "
            "the head, extends, signs and inserts; with a local signer that is its best case "
            "(a KMS signature inside the lock would add its round trip to every writer's turn).",
            f"- {count} run(s) per design; figures: median (min–max). "
            f"Events/s, chain per writer / serialised: **{ratio:.2f}x**.",
            "",
            markdown_table(
                ["Design", "Events/s", "p50 ms", "p99 ms", "Failed appends", "Chains"], rows
            ),
        ]
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.audit_writers",
        description="3 audit writers on one PostgreSQL log: a chain each vs one serialised",
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="per writer and run")
    parser.add_argument("--runs", type=int, default=3, help="runs per design (default 3)")
    parser.add_argument("--quick", action="store_true", help="1 run of 3 s; print only")
    parser.add_argument("--output", type=Path, help="default BENCHMARKS.md (--quick: print only)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    seconds = 3.0 if args.quick else args.seconds
    runs = 1 if args.quick else args.runs
    if seconds <= 0 or runs < 1:
        print("bench.audit_writers: --seconds and --runs must be positive", file=sys.stderr)
        return 2
    results: dict[str, list[DesignRun]] = {}
    for attempt in range(runs):
        for design in ("chains", "serialised"):
            say(f"bench: audit writers, {design}, run {attempt + 1}/{runs}")
            results.setdefault(design, []).append(asyncio.run(_one_run(design, seconds)))
    command = shlex.join(["python", "-m", "bench.audit_writers", *redacted_argv(argv)])
    body = render(command, seconds, results)
    publish("bench.audit_writers", NAME, body, args.output, full=not args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
