"""The replicas scenario's report: its configurations, the record of one run, the section.

Checks, per run against the same run's figures, then summarised: two replicas behind HAProxy
serve at least 1.8x the requests/s of one behind HAProxy at 64 connections; no request fails
(any error invalidates a run, so a kept run has none). Reported, with no target: the p50 and
p99 that the PostgreSQL audit log and HAProxy add over one replica on SQLite without HAProxy,
at 1 and 8 connections, each one's share apart.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from bench._report import Spread, collect_environment, markdown_table
from bench._wrk import WRK_SCRIPT, wrk_command, wrk_version
from bench.haproxy import CHECK_INTER_MS
from bench.http_servers import SHORT, request_body
from bench.replica_servers import Replica

__all__ = ["CONFIGS", "CONNECTIONS", "Config", "Point", "ReplicasRun", "render"]

_DISTRIBUTIONS = ("airgate", "litestar", "uvicorn", "asyncpg", "sqlalchemy", "redis")
CONNECTIONS = (1, 8, 64)
LATENCY_CONNS = (1, 8)
SCALE_TARGET = 1.8


@dataclass(frozen=True, slots=True)
class Config:
    label: str
    shape: tuple[int, bool, bool]  # replicas, audit on PostgreSQL, behind HAProxy


CONFIGS = {
    "sqlite": Config("1 replica, SQLite audit, no HAProxy", (1, False, False)),
    "pg": Config("1 replica, PostgreSQL audit, no HAProxy", (1, True, False)),
    "pg-haproxy": Config("1 replica, PostgreSQL audit, HAProxy", (1, True, True)),
    "pg-haproxy-2": Config("2 replicas, PostgreSQL audit, HAProxy", (2, True, True)),
}


class Point(msgspec.Struct, frozen=True, kw_only=True):
    """One measured load on one configuration."""

    config: str
    connections: int
    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    replica_cpu_s: float  # every replica's process group, during the measured load
    haproxy_cpu_s: float
    services_cpu_s: float  # PostgreSQL and Redis
    wrk_cpu_s: float

    def per_request_us(self, cpu_s: float) -> float:
        return cpu_s / self.requests * 1e6


class ReplicasRun(msgspec.Struct, frozen=True, kw_only=True):
    points: list[Point]
    order: list[str]
    foreign_share: float
    services_cpu_s: float  # PostgreSQL's and Redis's CPU time during the run


Key = tuple[str, int]  # config, connections


def _by_point(kept: Sequence[ReplicasRun]) -> dict[Key, list[Point]]:
    out: dict[Key, list[Point]] = {}
    for run_ in kept:
        for p in run_.points:
            out.setdefault((p.config, p.connections), []).append(p)
    return out


def _load_table(points: dict[Key, list[Point]]) -> str:
    rows = []
    for c in CONNECTIONS:
        for name, config in CONFIGS.items():
            ps = points[(name, c)]
            cpu = [
                Spread.of(p.per_request_us(getattr(p, f)) for p in ps).format(",.0f")
                for f in ("replica_cpu_s", "haproxy_cpu_s", "services_cpu_s", "wrk_cpu_s")
            ]
            rows.append([
                str(c), config.label,
                Spread.of(p.rps for p in ps).format(",.0f"),
                Spread.of(p.p50_ms for p in ps).format(".2f"),
                Spread.of(p.p99_ms for p in ps).format(".2f"),
                *cpu,
            ])  # fmt: skip
    headers = ["Connections", "Configuration", "Req/s", "p50 (ms)", "p99 (ms)",
               "CPU/request (µs): replicas", "HAProxy", "PostgreSQL + Redis", "wrk"]  # fmt: skip
    return markdown_table(headers, rows, right=2)


def _added(points: dict[Key, list[Point]], a: str, b: str, c: int, field: str) -> Spread:
    """Per run: ``field`` of config ``a`` minus config ``b``'s at ``c`` connections."""
    pairs = zip(points[(a, c)], points[(b, c)], strict=True)
    return Spread.of(getattr(x, field) - getattr(y, field) for x, y in pairs)


def _latency_table(points: dict[Key, list[Point]]) -> str:
    rows = []
    for c in LATENCY_CONNS:
        for field, label in (("p50_ms", "p50"), ("p99_ms", "p99")):
            rows.append([
                f"{label} at {c} connection{'s' if c > 1 else ''}",
                Spread.of(getattr(p, field) for p in points[("sqlite", c)]).format(".2f"),
                _added(points, "pg", "sqlite", c, field).format("+.2f"),
                _added(points, "pg-haproxy", "pg", c, field).format("+.2f"),
                _added(points, "pg-haproxy", "sqlite", c, field).format("+.2f"),
            ])  # fmt: skip
    headers = ["Latency", "1 replica, SQLite, no HAProxy (ms)", "+ PostgreSQL audit (ms)",
               "+ HAProxy (ms)", "+ both (ms)"]  # fmt: skip
    return markdown_table(headers, rows)


def _scale(points: dict[Key, list[Point]]) -> list[float]:
    pairs = zip(points[("pg-haproxy-2", 64)], points[("pg-haproxy", 64)], strict=True)
    return [two.rps / one.rps for two, one in pairs]


def _per_cpu(points: dict[Key, list[Point]]) -> list[float]:
    """Per run: requests per second of replica CPU, 2 replicas over 1 (1.0: they scale)."""
    pairs = zip(points[("pg-haproxy-2", 64)], points[("pg-haproxy", 64)], strict=True)
    return [
        one.per_request_us(one.replica_cpu_s) / two.per_request_us(two.replica_cpu_s)
        for two, one in pairs
    ]


def _checks_table(points: dict[Key, list[Point]], runs: int) -> str:
    scale = Spread.of(_scale(points))
    rows = [
        ["2 replicas / 1 replica behind HAProxy, req/s at 64 connections", scale.format(".2f"),
         f">= {SCALE_TARGET:g}", "PASS" if scale.median >= SCALE_TARGET else "MISS"],
        ["failed requests (any invalidates a run)", "0", "0", f"PASS ({runs} run(s) kept)"],
        ["2 replicas / 1, requests per second of replica CPU at 64 connections",
         Spread.of(_per_cpu(points)).format(".2f"), "-", "for reading"],
    ]  # fmt: skip
    return markdown_table(["Check (per run, same run)", "Value", "Target", "Result"], rows)


def _budget(points: dict[Key, list[Point]]) -> str:
    """Where the CPUs went with two replicas at 64 connections (medians over runs)."""
    ps = points[("pg-haproxy-2", 64)]

    def cpus(field: str) -> float:
        return Spread.of(getattr(p, field) / p.requests * p.rps for p in ps).median

    used = {f: cpus(f) for f in ("replica_cpu_s", "haproxy_cpu_s", "services_cpu_s", "wrk_cpu_s")}
    return (
        f"With two replicas at 64 connections the replicas used {used['replica_cpu_s']:.2f} CPUs, "
        f"HAProxy {used['haproxy_cpu_s']:.2f}, PostgreSQL and Redis {used['services_cpu_s']:.2f} "
        f"and wrk {used['wrk_cpu_s']:.2f}, of the machine's {os.cpu_count()}: what is not "
        "pinned shares the replicas' CPUs, so the second replica adds what those leave it."
    )


def _pinning(replicas: Sequence[Replica]) -> str:
    pinned = [r for r in replicas if r.cpus]
    if not pinned:
        return "none (fewer than 2 usable CPUs, or no `taskset`)"
    cpus = ", ".join(f"{r.name} `taskset -c {r.cpus}`" for r in pinned)
    return (
        f"{cpus} (the SQLite replica on the first's CPU); wrk, HAProxy, PostgreSQL and Redis "
        "are not pinned"
    )


def render(
    args: argparse.Namespace,
    duration_s: int,
    warmup_s: int,
    replicas: Sequence[Replica],
    kept: Sequence[ReplicasRun],
    discarded: int,
) -> str:
    """The scenario's BENCHMARKS.md section."""
    env = collect_environment(args.command, _DISTRIBUTIONS)
    points = _by_point(kept)
    runs = len(kept)
    wrk = wrk_command("http://127.0.0.1:PORT", 64, duration_s)
    wrk[wrk.index(str(WRK_SCRIPT))] = "bench/wrk/post.lua"
    figures = f"median (min–max) of {runs} runs" if runs > 1 else "one run"
    orders = "; ".join(" → ".join(r.order) for r in kept)
    foreign = max(r.foreign_share for r in kept)
    services = max(r.services_cpu_s for r in kept)
    labels = "; ".join(f"`{name}`: {config.label}" for name, config in CONFIGS.items())
    bullets = [
        env.markdown(),
        f"- Load generator: {wrk_version()}, one thread: `WRK_BODY=<body> WRK_TOKEN=<key> "
        f"{' '.join(wrk)}` (1, 8 and 64 connections) for {duration_s} s after a {warmup_s} s "
        "warm-up and a wait until the replicas are idle. Body: "
        f"`{request_body(False, SHORT)}`. Latency is wrk's (request sent → response complete). "
        "Any error (connect, read, write, timeout, HTTP status > 399) invalidates the run; "
        "each configuration's answer (text, usage, `[DONE]`) is checked once per replica first.",
        f"- Configurations: {labels}.",
        "- Every replica: `airgate serve --config <cache>/replicas/<name>/airgate.toml --port "
        "PORT --data-dir <cache>/replicas/<name>/data`, the echo engine, an app key, a policy "
        "whose caps and limits (10,000,000 requests/min, 10,000,000,000 tokens/min, 10,000 "
        "streams) are checked on every request and never reached, limits in Redis (`fail_mode "
        '= "open"`), the strict hash-chained audit log, metrics, the request log at info (to a '
        "file). PostgreSQL replicas share a fresh database (`[audit] database_url`, migrated "
        "once before they start), one pepper file (`[auth] pepper_file`) and one app key; each "
        "has its own audit chain (`[audit] chain` = its name) and signing key, every public key "
        "pinned in every replica's `[audit] trusted_keys`. The SQLite replica has its own data "
        "dir, database and pepper.",
        f"- HAProxy (`haproxy -f <cache>/replicas/haproxy-N/haproxy.cfg -db`, "
        "`bench/haproxy.py`): `balance leastconn`, `option httpchk GET /ready` every "
        f"{CHECK_INTER_MS} ms (fall 2, rise 2), `retries 2`, `option redispatch 1`, `retry-on "
        "conn-failure 503`, HTTP keep-alive to the replicas (`http-reuse safe`, the default), "
        "the request log (`option httplog`) to a file.",
        f"- CPU pinning: {_pinning(replicas)}. CPU per request = utime + stime (/proc) during "
        "the measured load of: the replicas' process groups; HAProxy; every `postgres` and "
        "`redis-server` process (other clients of the same servers count too); wrk.",
        "- `<cache>` is `--cache-dir`; every server binds 127.0.0.1 on a free port.",
        f"- Figures: {figures}; configuration order per run: {orders}. Other processes used at "
        f"most {foreign:.0%} of the CPUs during a run (PostgreSQL and Redis, used {services:.1f} "
        f"s of CPU at most, count as the run's own); {discarded} "
        f"run{'s' if discarded != 1 else ''} discarded and repeated for exceeding "
        f"{args.max_foreign_load:.0%}.",
    ]
    title = "## Replicas: one vs two airgate replicas behind HAProxy (echo engine)"
    quick = "**Smoke run (`--quick`): one run, short loads; not a result.**"
    parts = [
        title,
        *([quick] if args.quick else []),
        "\n".join(bullets),
        f"### Requests/s, latency and CPU (non-streaming, {SHORT} tokens)",
        _load_table(points),
        "### What the PostgreSQL audit log and HAProxy add to one replica's latency",
        _latency_table(points),
        "### Checks",
        _checks_table(points, runs),
        _budget(points),
    ]
    return "\n\n".join(parts) + "\n"
