"""Scenario "http": requests/s and latency of airgate's HTTP path, beside a bare route and LiteLLM.

Three servers answer the same ``POST /v1/chat/completions`` with the same text (the echo
engine's ``" tok0"`` .. ``" tok15"``), so what differs is only the work around the model:

- bare: ``bench/bare_app.py``, one Litestar route under uvicorn (uvloop, httptools, no access
  log); no auth, policy, limits, audit or metrics;
- airgate: ``airgate serve`` with the echo engine and everything on: an app key (Bearer), a
  policy directory whose rule allows model ``echo`` with caps, rate, token and stream limits set
  far above the load but checked on every request through Redis (``[limits] redis_url``, the
  default ``fail_mode = "open"``: a Redis call that times out after 250 ms switches to limits
  kept in the process until Redis answers again; the report counts these failovers), the
  hash-chained audit log in strict mode on SQLite in the data dir (synchronous=FULL, the
  default), Prometheus metrics, and the request log at the default level (one line per request,
  to the log file).  Tracing stays off: there is no collector;
- LiteLLM: ``litellm[proxy]`` (``bench/peers_litellm.py``) forwarding model ``echo`` to a second
  bare route, its master key as Bearer.

``wrk`` (one thread, ``bench/wrk/post.lua``) holds 1, 8 and 64 connections for
``--http-duration`` seconds after a ``--http-warmup`` at the same count and a wait until the
server is idle (requests wrk abandoned at the end of the warm-up finish): non-streaming with
max_tokens 16, and streaming with max_tokens 16 (usage included); then streaming at 8
connections with max_tokens 256.  Any error (connect, read, write, timeout, status > 399) makes
a point invalid.  Each server runs pinned to one CPU and wrk to another (``taskset``); the bare
upstream LiteLLM forwards to shares wrk's CPU (it does ~1% of LiteLLM's work).  The server's CPU
time (utime + stime of its process group, from /proc) is read around every measured load:
CPU per streamed token = (CPU/request at 256 tokens - CPU/request at 16) / 240.

Every run starts the three servers in turn (the order rotates from run to run); a run during
which other processes used more than ``--max-foreign-load`` of the CPUs (Redis, which serves
airgate's limits, counts as part of the run) is discarded and repeated.  Figures are the median
(min–max) over runs; checks are taken per run, then summarised.

Modules: ``http_servers`` (bodies, commands, one server, one load point), ``http_report`` (the
section), ``bench._wrk`` (the load generator).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import msgspec

from bench import peers_litellm
from bench._check import airgate_args, importable, policy_dir, shown, tools
from bench._client import BenchError
from bench._report import cpu_sample, foreign_cpu_share, say
from bench._runs import add_run_options, quiet_runs
from bench._serve import create_api_key, free_port
from bench._wrk import WRK_SCRIPT, pinning, wrk_command
from bench.http_report import HttpRun, render
from bench.http_servers import (
    CONNECTIONS,
    CPU_CONNS,
    LABELS,
    LONG,
    MODES,
    SERVERS,
    SHORT,
    Point,
    Setup,
    airgate_command,
    airgate_config,
    bare_command,
    measure,
    request_body,
    server,
    server_env,
)

NAME = "http"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("http scenario")
    group.add_argument(
        "--http-duration", type=int, metavar="S", help="seconds per load point (10; --quick 4)"
    )
    group.add_argument(
        "--http-warmup",
        type=int,
        metavar="S",
        help="warm-up seconds before each point (2; --quick 1)",
    )
    group.add_argument(
        "--http-redis-url",
        default="redis://127.0.0.1:6379/0",
        help="Redis airgate's limits use (default redis://127.0.0.1:6379/0)",
    )
    add_run_options(group)


def _setup(args: argparse.Namespace, litellm_venv: Path) -> Setup:
    """A fresh work dir (a fresh audit database and key every invocation): airgate's
    configuration and policy written, its app key created."""
    work = args.cache_dir / "http"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    logs = args.cache_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    config = airgate_config(work, args.http_redis_url)
    data = work / "airgate-data"
    key = create_api_key(data, server_env(), ["--config", str(config)], name="bench-http")
    return Setup(
        pin=pinning(),
        work=work,
        logs=logs,
        airgate_config=config,
        airgate_data=data,
        airgate_key=key,
        litellm_venv=litellm_venv,
        ready_timeout=args.ready_timeout,
        redis_url=args.http_redis_url,
        duration_s=args.http_duration or (4 if args.quick else 10),
        warmup_s=args.http_warmup or (1 if args.quick else 2),
    )


def prepare(args: argparse.Namespace) -> tuple[Setup, float | None]:
    """Check the tools, install LiteLLM if needed, write airgate's files and create its key."""
    if shutil.which("wrk") is None:
        raise BenchError("wrk is not installed: run `bash scripts/bench-tools.sh` (as root)")
    redis_cpu_s(args.http_redis_url)  # reachable?
    logs = args.cache_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for name in (*SERVERS, "upstream"):
        (logs / f"http-{name}.log").write_bytes(b"")
    say(f"checking {peers_litellm.REQUIREMENT} (installed once into the cache)")
    venv, install_s = peers_litellm.ensure_litellm(args.cache_dir, logs / "http-install.log")
    if install_s is not None:
        say(f"  installed in {install_s:.0f} s")
    return _setup(args, venv), install_s


def redis_cpu_s(url: str) -> float:
    """Redis's own CPU seconds so far (``INFO cpu``): it serves airgate's limits, so its work is
    part of the run, not another process's load."""
    import redis  # airgate's dependency; only this scenario needs it here

    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        info = client.info("cpu")
    except redis.RedisError as exc:
        raise BenchError(
            f"Redis at {url}: {exc}; start one (redis-server) or pass --http-redis-url"
        ) from exc
    finally:
        client.close()
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def one_run(setup: Setup, attempt: int) -> HttpRun:
    """Every server in turn (the order rotates with ``attempt``), every point on each."""
    order = [SERVERS[(attempt + i) % len(SERVERS)] for i in range(len(SERVERS))]
    before, redis_before = cpu_sample(), redis_cpu_s(setup.redis_url)
    points: list[Point] = []
    for name in order:
        say(f"  {LABELS[name]}:")
        with server(name, setup) as target:
            for mode in MODES:
                points += [measure(target, mode, c, SHORT, setup) for c in CONNECTIONS]
            points.append(measure(target, "stream", CPU_CONNS, LONG, setup))
    # every server and wrk has exited and been reaped: their CPU time now counts as ours
    after, redis_used = cpu_sample(), redis_cpu_s(setup.redis_url) - redis_before
    share = foreign_cpu_share(before, after)
    if before is not None and after is not None and after.wall_s > before.wall_s:
        capacity = (after.wall_s - before.wall_s) * (os.cpu_count() or 1)
        share = max(0.0, share - redis_used / capacity)
    say(f"  Redis used {redis_used:.1f} s of CPU; other processes {share:.0%} of the CPUs")
    return HttpRun(points=points, order=order, foreign_share=share, redis_cpu_s=redis_used)


def run(args: argparse.Namespace) -> str:
    """Run the scenario; returns the markdown body of its BENCHMARKS.md section."""
    runs = 1 if args.quick else args.runs
    setup, install_s = prepare(args)

    def attempt_run(done: int, attempt: int) -> HttpRun:
        say(f"run {done + 1}/{runs}:")
        return one_run(setup, attempt)

    kept, discarded = quiet_runs(runs, args.max_foreign_load, attempt_run)
    dump = setup.logs / "http-results.json"
    dump.write_bytes(msgspec.json.encode(kept))
    say(f"per-point results: {dump}")
    return render(args, setup, kept, discarded, install_s)


def check(args: argparse.Namespace) -> str:
    """Set-up only (``--check``): airgate's configuration and policy written and loaded (the
    Redis URL as its settings check it; Redis is not contacted), its app key created, its
    command line parsed by airgate's CLI; the bare route's app imported; LiteLLM's config and
    command line, wrk's, the bodies. Nothing installed or started; missing tools reported."""
    lines = [importable(["bench.bare_app", "uvicorn", "uvloop", "httptools", "redis"])]
    lines.append(tools(["wrk", "taskset"], "wrk: `bash scripts/bench-tools.sh`, as root"))
    if not WRK_SCRIPT.is_file():
        raise BenchError(f"{WRK_SCRIPT} is missing")
    setup = _setup(args, peers_litellm.venv_path(args.cache_dir))
    port = free_port()
    command = airgate_command(setup, port)
    version = policy_dir(setup.work / "policy")
    lines.append(
        f"airgate: {shown(command)} parsed as `airgate {airgate_args(command)}`; settings "
        f"loaded, policy version {version}, an app key created"
    )
    lines.append(f"bare route: {shown(bare_command(port))}")
    config = setup.work / "litellm.yaml"
    peers_litellm.write_config(config, f"http://127.0.0.1:{port}")
    json.loads(config.read_text())
    lines.append(f"LiteLLM: {shown(peers_litellm.command(setup.litellm_venv, config, port))}")
    lines.append(f"wrk: {shown(wrk_command(f'http://127.0.0.1:{port}', 64, setup.duration_s))}")
    bodies = [request_body(m == "stream", n) for m in MODES for n in (SHORT, LONG)]
    lines.append(f"{len([json.loads(b) for b in bodies])} request bodies")
    return "\n".join([f"## {NAME}: set-up checked, nothing started", *(f"- {x}" for x in lines)])
