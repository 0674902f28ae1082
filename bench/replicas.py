"""Scenario "replicas": requests/s of one and of two airgate replicas behind HAProxy, and the
latency HAProxy and the PostgreSQL audit log add.

Four configurations, each with everything on (an app key, a policy whose caps and limits are
checked on every request and never reached, limits in Redis, the strict hash-chained audit log,
metrics, the request log) and the echo engine, so that only the work around the model counts:

- ``sqlite``: one replica, audit on SQLite in its data dir, wrk straight to it (the ``http``
  scenario's airgate);
- ``pg``: one replica, audit on a shared PostgreSQL database (``[audit] database_url``, its own
  chain), wrk straight to it;
- ``pg-haproxy``: the same replica behind HAProxy (``bench/haproxy.py``);
- ``pg-haproxy-2``: two replicas behind HAProxy (``balance leastconn``), each its own chain.

Replica i is pinned to the i-th usable CPU (``taskset -c``); wrk (one thread), HAProxy,
PostgreSQL and Redis are not pinned: on a machine with as many CPUs as replicas they share the
replicas' CPUs, which caps what the second replica can add. ``wrk`` holds 1, 8 and 64
connections for ``--replicas-duration`` seconds after a warm-up and a wait until the replicas
are idle; any error invalidates the run. The CPU time of the replicas, of HAProxy, of
PostgreSQL + Redis and of wrk is read around every measured load (/proc), so the report shows
where the machine's time went.

Every run starts the configurations in turn (the order rotates); a run during which other
processes used more than ``--max-foreign-load`` of the CPUs is discarded and repeated
(PostgreSQL and Redis count as the run's own). Modules: ``replica_servers`` (the replicas),
``haproxy`` (the load balancer), ``replicas_report`` (the section).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec

from bench._check import airgate_args, importable, policy_dir, shown, tools
from bench._client import BenchError
from bench._report import cpu_sample, foreign_cpu_share, say
from bench._runs import add_run_options, quiet_runs
from bench._wrk import WRK_SCRIPT, Pinning, group_cpu_s, run_wrk, wait_idle, wrk_command
from bench.haproxy import HAProxy
from bench.http_path import redis_cpu_s
from bench.http_servers import SHORT, Target, check_answers, request_body
from bench.replica_servers import (
    PG_ADMIN,
    Replica,
    Shared,
    chains_supported,
    create_keys,
    migrate,
    postgres_database,
    prepare_replicas,
    write_pepper,
)
from bench.replicas_report import CONFIGS, CONNECTIONS, Point, ReplicasRun, render

NAME = "replicas"
_POLICY = """\
name = "bench-replicas"
description = "The replicas benchmark: model echo; every cap and limit is checked, none reached."

[[rules]]
name = "bench"
teams = ["*"]
roles = ["app"]
models = ["echo"]
max_tokens = 4096
max_n = 1
max_prompt_bytes = 1048576
requests_per_minute = 10000000
tokens_per_minute = 10000000000
concurrent_streams = 10000
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("replicas scenario")
    group.add_argument(
        "--replicas-duration", type=int, metavar="S", help="seconds per load point (10; --quick 4)"
    )
    group.add_argument(
        "--replicas-warmup", type=int, metavar="S", help="warm-up seconds per point (2; --quick 1)"
    )
    group.add_argument(
        "--replicas-redis-url",
        default="redis://127.0.0.1:6379/0",
        help="Redis the replicas' limits use (default redis://127.0.0.1:6379/0)",
    )
    group.add_argument(
        "--replicas-pg-admin-url",
        default=PG_ADMIN,
        help=f"PostgreSQL where a throwaway audit database is made (default {PG_ADMIN})",
    )
    add_run_options(group)


@dataclass(frozen=True, slots=True)
class Setup:
    """What every run shares: the replicas (files only), their keys, the load's settings."""

    work: Path
    logs: Path
    solo: Replica  # SQLite
    replicas: list[Replica]  # PostgreSQL: r1, r2
    sqlite_key: str
    pg_key: str
    duration_s: int
    warmup_s: int
    ready_timeout: float


def _cpus() -> list[str]:
    """One CPU per replica: the first two usable ones (none without taskset or two CPUs)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < 2 or shutil.which("taskset") is None:
        return []
    return [str(c) for c in cpus[:2]]


def _files(args: argparse.Namespace, database_url: str) -> tuple[Path, Replica, list[Replica]]:
    """A fresh work dir: the policy, the peppers, the replicas' data dirs, keys and configs."""
    work = args.cache_dir / "replicas"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    policy = work / "policy"
    policy.mkdir()
    (policy / "bench.toml").write_text(_POLICY)
    cpus = _cpus()
    redis = args.replicas_redis_url
    local = Shared("", redis, write_pepper(work / "solo-pepper"), policy)
    (solo,) = prepare_replicas(work, ["solo"], local, cpus[:1])
    shared = Shared(database_url, redis, write_pepper(work / "pepper"), policy)
    return work, solo, prepare_replicas(work, ["r1", "r2"], shared, cpus)


def _setup(args: argparse.Namespace, database_url: str) -> Setup:
    work, solo, replicas = _files(args, database_url)
    logs = args.cache_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    migrate(database_url)
    return Setup(
        work=work,
        logs=logs,
        solo=solo,
        replicas=replicas,
        sqlite_key=create_keys(solo, {"bench": ("app", None)})["bench"],
        pg_key=create_keys(replicas[0], {"bench": ("app", None)})["bench"],
        duration_s=args.replicas_duration or (4 if args.quick else 10),
        warmup_s=args.replicas_warmup or (1 if args.quick else 2),
        ready_timeout=args.ready_timeout,
    )


def _proc_cpu_s(comms: tuple[str, ...]) -> float:
    """CPU seconds (user + system) of every process whose name is one of ``comms``: the
    database and Redis serve the replicas, so their work is part of the run."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue  # exited meanwhile
        comm = text[text.index("(") + 1 : text.rindex(")")]
        if comm in comms:
            fields = text[text.rindex(")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])  # utime stime
    return total / ticks


def services_cpu_s() -> float:
    return _proc_cpu_s(("postgres", "redis-server"))


def _children_cpu_s() -> float:
    times = os.times()
    return times.children_user + times.children_system


@dataclass
class _Running:
    config: str
    url: str
    token: str
    replicas: list[Replica]
    haproxy: HAProxy | None


@contextlib.contextmanager
def deployment(config: str, setup: Setup) -> Iterator[_Running]:
    """The configuration's replicas (and HAProxy) started, ready, answering; stopped after."""
    count, postgres, balanced = CONFIGS[config].shape
    replicas = setup.replicas[:count] if postgres else [setup.solo]
    haproxy = HAProxy(setup.work / f"haproxy-{count}", replicas) if balanced else None
    try:
        for replica in replicas:
            replica.start()
        for replica in replicas:
            replica.wait_ready(setup.ready_timeout)
        url = replicas[0].url
        if haproxy is not None:
            haproxy.start()
            haproxy.wait_serving()
            url = haproxy.url
        token = setup.pg_key if postgres else setup.sqlite_key
        running = _Running(config, url, token, replicas, haproxy)
        for _ in replicas:  # leastconn at rest alternates: each replica answers once
            check_answers(Target(config, url, token, 0))
        yield running
    finally:
        for replica in replicas:
            replica.stop()
        if haproxy is not None:
            haproxy.stop()


def measure(target: _Running, connections: int, setup: Setup) -> Point:
    """A warm-up, then one measured load, the CPU of every party read around it."""
    body = request_body(False, SHORT)
    groups = [r.process.pid for r in target.replicas if r.process is not None]
    balancer = target.haproxy.process.pid if target.haproxy and target.haproxy.process else None
    where = f"{target.config} at {connections} connections"
    unpinned = Pinning()
    try:
        run_wrk(target.url, target.token, body, connections, setup.warmup_s, unpinned, warm_up=True)
        for pgid in groups:
            wait_idle(pgid)
        before = [group_cpu_s(g) for g in groups]
        lb0, svc0, wrk0 = (
            group_cpu_s(balancer) if balancer else 0.0,
            services_cpu_s(),
            _children_cpu_s(),
        )
        result = run_wrk(target.url, target.token, body, connections, setup.duration_s, unpinned)
        wrk_cpu = _children_cpu_s() - wrk0
        replica_cpu = sum(group_cpu_s(g) for g in groups) - sum(before)
        lb_cpu = (group_cpu_s(balancer) if balancer else 0.0) - lb0
        svc_cpu = services_cpu_s() - svc0
    except BenchError as exc:
        raise BenchError(f"{where}: {exc}") from exc
    lat = result.latency_us
    point = Point(
        config=target.config,
        connections=connections,
        requests=result.requests,
        rps=result.requests / (result.duration_us / 1e6),
        p50_ms=lat.p50 / 1e3,
        p99_ms=lat.p99 / 1e3,
        replica_cpu_s=replica_cpu,
        haproxy_cpu_s=lb_cpu,
        services_cpu_s=svc_cpu,
        wrk_cpu_s=wrk_cpu,
    )
    say(f"    {where}: {point.rps:,.0f} req/s, p50 {point.p50_ms:.2f} ms, "
        f"p99 {point.p99_ms:.2f} ms")  # fmt: skip
    return point


def one_run(setup: Setup, attempt: int) -> ReplicasRun:
    """Every configuration in turn (the order rotates with ``attempt``), every point on each."""
    names = list(CONFIGS)
    order = [names[(attempt + i) % len(names)] for i in range(len(names))]
    before, services_before = cpu_sample(), services_cpu_s()
    points: list[Point] = []
    for config in order:
        say(f"  {CONFIGS[config].label}:")
        with deployment(config, setup) as target:
            points += [measure(target, c, setup) for c in CONNECTIONS]
    # every replica, HAProxy and wrk has exited and been reaped: their CPU time is ours now
    after, services = cpu_sample(), services_cpu_s() - services_before
    share = foreign_cpu_share(before, after)
    if before is not None and after is not None and after.wall_s > before.wall_s:
        capacity = (after.wall_s - before.wall_s) * (os.cpu_count() or 1)
        share = max(0.0, share - services / capacity)
    say(f"  PostgreSQL and Redis used {services:.1f} s of CPU; others {share:.0%} of the CPUs")
    return ReplicasRun(points=points, order=order, foreign_share=share, services_cpu_s=services)


def _preflight(args: argparse.Namespace) -> None:
    missing = [t for t in ("wrk", "haproxy") if shutil.which(t) is None]
    if missing:
        raise BenchError(
            f"{' and '.join(missing)} not installed: run `bash scripts/bench-tools.sh` (wrk) "
            "and `bash scripts/test-services.sh` (haproxy), as root"
        )
    if not chains_supported():
        raise BenchError("this airgate has no [audit] chain: two replicas cannot share a log")
    redis_cpu_s(args.replicas_redis_url)  # reachable? (BenchError naming the URL)


def run(args: argparse.Namespace) -> str:
    """Run the scenario; returns the markdown body of its BENCHMARKS.md section."""
    _preflight(args)
    runs = 1 if args.quick else args.runs
    with postgres_database(args.replicas_pg_admin_url, prefix="airgate_bench_replicas") as url:
        setup = _setup(args, url)

        def attempt_run(done: int, attempt: int) -> ReplicasRun:
            say(f"run {done + 1}/{runs}:")
            return one_run(setup, attempt)

        kept, discarded = quiet_runs(runs, args.max_foreign_load, attempt_run)
    dump = setup.logs / "replicas-results.json"
    dump.write_bytes(msgspec.json.encode(kept))
    say(f"per-point results: {dump}")
    return render(args, setup.duration_s, setup.warmup_s, setup.replicas, kept, discarded)


def check(args: argparse.Namespace) -> str:
    """Set-up only (``--check``): the replicas' configurations (PostgreSQL's URL as airgate's
    settings read it; nothing contacts it) and the policy written and loaded, an app key made
    in the SQLite replica's data dir, every ``airgate serve`` command line parsed by airgate's
    CLI, HAProxy's configuration checked by ``haproxy -c`` where it is installed, wrk's command
    line. Nothing started."""
    lines = [importable(["asyncpg", "redis", "bench.http_servers:check_answers"])]
    lines.append(tools(["wrk", "haproxy", "taskset"], "`bash scripts/bench-tools.sh` (wrk), "
                       "`bash scripts/test-services.sh` (haproxy), as root"))  # fmt: skip
    if not WRK_SCRIPT.is_file():
        raise BenchError(f"{WRK_SCRIPT} is missing")
    url = args.replicas_pg_admin_url.rsplit("/", 1)[0] + "/airgate_bench_replicas_check"
    work, solo, replicas = _files(args, url)
    version = policy_dir(work / "policy")
    create_keys(solo, {"bench": ("app", None)})
    chains = "one chain each" if chains_supported() else "NO [audit] chain in this airgate"
    for replica in [solo, *replicas]:
        settings = replica.settings()
        command = replica.command()
        unpinned = command[3:] if command[0] == "taskset" else command
        lines.append(
            f"{replica.name}: {shown(command)} parsed as `airgate {airgate_args(unpinned)}`"
            f"; audit on {'PostgreSQL' if settings.audit.database_url else 'SQLite'}, "
            f"{len(settings.audit.trusted_keys)} pinned key(s)"
        )
    lines.append(f"policy version {version}; an app key created; audit chains: {chains}")
    for count in (1, 2):
        haproxy = HAProxy(work / f"haproxy-{count}", replicas[:count])
        if shutil.which("haproxy"):
            haproxy.check_config()
        lines.append(f"HAProxy, {count} replica(s): {shown(haproxy.command())}")
    lines.append(f"wrk: {shown(wrk_command('http://127.0.0.1:PORT', 64, 10))}")
    return "\n".join([f"## {NAME}: set-up checked, nothing started", *(f"- {x}" for x in lines)])
