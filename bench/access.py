"""Access stack: audit-log throughput, and the latency auth + policy + limits + audit add.

1. Audit events/s: the hash-chained writer (strict appends from 256 concurrent tasks, group
   commit, checkpoints) to SQLite (WAL, synchronous=FULL) and to PostgreSQL, against the same
   rows written by plain batched INSERTs without the chain (the peer: what the database itself
   sustains), in the same run.
2. Added latency: what one inference request pays for access control, measured directly on the
   code the request runs (the same functions the HTTP handlers call, nothing mocked): API-key
   authentication, the policy decision, the limiter admission, the durable `inference.admitted`
   event, the durable `inference.completed` event and the limiter refund, at a paced 200
   requests/s; the route with all of them off does none of this work.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from bench._check import importable, policy_dir
from bench._client import BenchError
from bench._report import Spread, collect_environment, markdown_table, percentile, say

if TYPE_CHECKING:
    from gateway.access.auth.principal import Principal
    from gateway.access.stack import Security
    from gateway.config import Settings

NAME = "access"
_DISTRIBUTIONS = ("airgate", "sqlalchemy", "aiosqlite", "asyncpg")
EVENTS_TARGET = 5000.0
LATENCY_TARGET_MS = 1.0
RATE = 200.0
PG_ADMIN = "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
T = TypeVar("T")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("access scenario")
    group.add_argument("--events", type=int, default=20000, help="audit events per run")
    group.add_argument("--requests", type=int, default=2000, help="paced requests per run")


async def _plain_inserts(url: str, n: int) -> float:
    """Peer: the same event bodies as plain batched INSERTs (no chain, no hashing)."""
    from sqlalchemy import insert

    from bench.audit_throughput import sample_event
    from gateway.audit.event import encode_event, ts_us
    from gateway.audit.schema import audit_events
    from gateway.db import create_db_engine

    engine = create_db_engine(url)
    events = [sample_event(i) for i in range(n)]
    rows = [
        {
            "log_id": "peer",  # a chain of its own, in order (SQLite's trigger)
            "seq": 1 + i,
            "event_id": e.event_id,
            "ts_us": ts_us(e.ts),
            "kind": e.kind,
            "outcome": e.outcome,
            "body": encode_event(e).decode(),
            "prev_hash": "0" * 64,
            "row_hash": "0" * 64,
        }
        for i, e in enumerate(events)
    ]
    start = time.perf_counter()
    async with engine.begin() as conn:
        for k in range(0, n, 512):
            await conn.execute(insert(audit_events), rows[k : k + 512])
    elapsed = time.perf_counter() - start
    await engine.dispose()
    return n / elapsed


async def _throughput(url: str, n: int) -> tuple[float, float]:
    from bench.audit_throughput import measure_throughput
    from gateway.db import create_db_engine
    from gateway.db.migrate import upgrade

    await upgrade(url)
    engine = create_db_engine(url)
    try:
        chained = await measure_throughput(engine, n)
    finally:
        await engine.dispose()
    return chained, await _plain_inserts(url, n)


async def _with_pg_database(n: int, body: Callable[[str, int], Awaitable[T]]) -> T:
    from sqlalchemy import text

    from gateway.db import create_db_engine

    name = f"airgate_bench_{uuid.uuid4().hex[:8]}"
    admin = create_db_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    async with admin.connect() as conn:
        await conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        return await body(PG_ADMIN.rsplit("/", 1)[0] + f"/{name}", n)
    finally:
        async with admin.connect() as conn:
            await conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        await admin.dispose()


# One key at 200 requests/s: a policy whose limits a busy service account would have (the
# limiter still runs its full GCRA admission and refund for every request).
_POLICY = (
    'name = "bench"\n[[rules]]\nname = "all"\nroles = ["app"]\nmodels = ["*"]\n'
    "requests_per_minute = 60000\ntokens_per_minute = 100000000\n"
)


def _settings(data_dir: Path, strict: bool, synchronous: str, database_url: str = "") -> Settings:
    """The gateway's settings for one latency configuration, its policy written beside them."""
    from gateway.config import load_settings

    policy = data_dir / "bench-policy.toml"
    policy.write_text(_POLICY)
    return load_settings(
        None,
        environ={},
        overrides={
            "data_dir": str(data_dir),
            "audit.strict": strict,
            "audit.sqlite_synchronous": synchronous,
            "audit.database_url": database_url,
            "audit.migrate": True,
            "policy.path": str(policy),
        },
    )


async def _admit_and_complete(security: Security, principal: Principal, request_id: str) -> None:
    """One request through the gateway's admission API, as a handler drives it: admitted (the
    policy decision, the limiter, the durable `inference.admitted` event), completed (the
    `inference.completed` event), closed (the limiter's refund).

    The only code in bench that uses ``gateway.pipeline.admission``: adapt it here when that
    API changes.
    """
    from backends.echo import EchoEngine
    from gateway.engines.registry import ServedModel
    from gateway.pipeline import Generation, InferenceRequest, Progress
    from gateway.pipeline.admission import admit

    request = InferenceRequest(
        request_id=request_id,
        principal=principal,
        action="chat.completions",
        route="/v1/chat/completions",
        model="echo",
        prompt_bytes=120,
        stream=False,
        generation=Generation(max_tokens=16),
        sampling={"temperature": 0.0, "max_tokens": 16, "stream": False},
        prompt_param="messages",
    )
    model = _ECHO.get("model")
    if model is None:
        model = _ECHO["model"] = ServedModel("echo", EchoEngine(context_length=512))
    progress = Progress(model.id, stream=False)
    admitted = await admit(security, request, model, progress)
    progress.prompt_tokens, progress.completion_tokens = 30, 16
    await admitted.complete(response_bytes=400)
    await admitted.close()


_ECHO: dict[str, Any] = {}  # one served model for every call (built on first use)


async def _latency(
    data_dir: Path, requests: int, strict: bool, synchronous: str, database_url: str = ""
) -> list[float]:
    from gateway.access.stack import open_security

    settings = _settings(data_dir, strict, synchronous, database_url)
    samples: list[float] = []
    async with open_security(settings) as security:
        key, _ = await security.keys.create("app", name="bench")
        interval = 1.0 / RATE
        next_at = time.perf_counter()
        for i in range(requests):
            next_at += interval
            delay = next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            start = time.perf_counter()
            principal = await security.keys.authenticate(key)
            await _admit_and_complete(security, principal, f"bench-{i}")
            samples.append((time.perf_counter() - start) * 1000)
    return samples


def check(args: argparse.Namespace) -> str:
    """Set-up only (``--check``): every gateway name the scenario uses imported (the admission
    API's included; ``_admit_and_complete`` is not called), each latency configuration's
    settings loaded and the policy linted; no database written, PostgreSQL not contacted."""
    names = [
        "bench.audit_throughput:measure_throughput",
        "bench.audit_throughput:sample_event",
        "gateway.audit.event:encode_event",
        "gateway.audit.event:ts_us",
        "gateway.audit.schema:audit_events",
        "gateway.db:create_db_engine",
        "gateway.db.migrate:upgrade",
        "gateway.access.stack:open_security",
        "gateway.http.request_log:RequestInfo",
        "gateway.pipeline.admission:admit",
    ]
    lines = [importable(names)]
    from gateway.config import ConfigError

    data_dir = args.cache_dir / "access"
    data_dir.mkdir(parents=True)
    for strict, synchronous in ((True, "full"), (True, "normal"), (False, "full")):
        try:
            _settings(data_dir, strict, synchronous)
        except ConfigError as exc:
            raise BenchError(f"the gateway refuses the settings: {exc}") from exc
    version = policy_dir(data_dir / "bench-policy.toml")
    lines.append(f"settings of every latency configuration loaded; policy version {version}")
    return "\n".join([f"## {NAME}: set-up checked, nothing started", *(f"- {x}" for x in lines)])


def run(args: argparse.Namespace) -> str:
    runs = 1 if args.quick else args.runs
    n = 4000 if args.quick else args.events
    requests = 400 if args.quick else args.requests
    sqlite_chain, sqlite_plain, pg_chain, pg_plain = [], [], [], []
    configs = {
        "strict, SQLite synchronous=FULL (default)": (True, "full", False),
        "strict, SQLite synchronous=NORMAL": (True, "normal", False),
        "strict, PostgreSQL": (True, "full", True),
        "non-strict (events queued), SQLite": (False, "full", False),
    }
    p50: dict[str, list[float]] = {name: [] for name in configs}
    p99: dict[str, list[float]] = {name: [] for name in configs}
    for attempt in range(runs):
        with tempfile.TemporaryDirectory(prefix="airgate-bench-access-") as tmp:
            say(f"bench: access run {attempt + 1}/{runs}: audit throughput, SQLite")
            c, p = asyncio.run(_throughput(f"sqlite+aiosqlite:///{tmp}/audit.db", n))
            sqlite_chain.append(c)
            sqlite_plain.append(p)
        say(f"bench: access run {attempt + 1}/{runs}: audit throughput, PostgreSQL")
        c, p = asyncio.run(_with_pg_database(n, _throughput))
        pg_chain.append(c)
        pg_plain.append(p)
        for name, (strict, synchronous, postgres) in configs.items():
            say(f"bench: access run {attempt + 1}/{runs}: latency at {RATE:.0f}/s, {name}")
            with tempfile.TemporaryDirectory(prefix="airgate-bench-access-") as tmp:
                measure = functools.partial(_latency, Path(tmp), requests, strict, synchronous)
                if postgres:
                    samples = asyncio.run(_with_pg_database(n, lambda url, _n, m=measure: m(url)))
                else:
                    samples = asyncio.run(measure())
            p50[name].append(statistics.median(samples))
            p99[name].append(percentile(samples, 99))
    env = collect_environment(args.command, _DISTRIBUTIONS)

    def ratio(a: list[float], b: list[float]) -> str:
        return Spread.of([x / y for x, y in zip(a, b, strict=True)]).format(".2f")

    s_chain, p_chain = Spread.of(sqlite_chain), Spread.of(pg_chain)
    throughput = markdown_table(
        ["Database", "Chained writer (events/s)", "Plain INSERTs (events/s)", "Ratio"],
        [
            [
                "SQLite (WAL, FULL sync)",
                s_chain.format(".0f"),
                Spread.of(sqlite_plain).format(".0f"),
                ratio(sqlite_chain, sqlite_plain),
            ],
            [
                "PostgreSQL 15",
                p_chain.format(".0f"),
                Spread.of(pg_plain).format(".0f"),
                ratio(pg_chain, pg_plain),
            ],
        ],
    )
    latency = markdown_table(
        ["Access work per request at 200 req/s", "p50 (ms)", "p99 (ms)"],
        [
            [name, Spread.of(p50[name]).format(".3f"), Spread.of(p99[name]).format(".3f")]
            for name in configs
        ],
    )
    default = Spread.of(p50["strict, SQLite synchronous=FULL (default)"])
    relaxed = Spread.of(p50["non-strict (events queued), SQLite"])
    checks = markdown_table(
        ["Check", "Figure", "Target", "Result"],
        [
            [
                "audit events/s, SQLite",
                s_chain.format(".0f"),
                f">= {EVENTS_TARGET:.0f}",
                "PASS" if s_chain.median >= EVENTS_TARGET else "FAIL",
            ],
            [
                "audit events/s, PostgreSQL",
                p_chain.format(".0f"),
                f">= {EVENTS_TARGET:.0f}",
                "PASS" if p_chain.median >= EVENTS_TARGET else "FAIL",
            ],
            [
                "added p50 at 200 req/s, strict (default)",
                default.format(".3f"),
                f"<= {LATENCY_TARGET_MS} ms",
                "PASS" if default.median <= LATENCY_TARGET_MS else "FAIL",
            ],
            [
                "added p50 at 200 req/s, non-strict",
                relaxed.format(".3f"),
                f"<= {LATENCY_TARGET_MS} ms",
                "PASS" if relaxed.median <= LATENCY_TARGET_MS else "FAIL",
            ],
        ],
    )
    return "\n".join(
        [
            "## Access stack: audit throughput and the latency access control adds",
            "",
            env.markdown(),
            f"- Throughput: {n:,} `inference.completed` events per database per run, appended "
            "strictly (each append returns once its group commit is durable) by 256 concurrent "
            "tasks, with the hash chain and a signed tree head per group commit; the peer is "
            "the same rows as plain batched INSERTs in one transaction, no chain.",
            f"- Latency: {requests:,} requests per run paced at 200/s through API-key "
            "authentication (HMAC, constant-time compare), the policy decision, the in-process "
            "GCRA limiter, the `inference.admitted` and `inference.completed` events (strict: "
            "each durable before the request goes on) and the refund: the whole work the "
            "access stack adds to a request.",
            f"- {runs} run(s); figures: median (min–max).",
            "",
            throughput,
            "",
            latency,
            "",
            checks,
        ]
    )
