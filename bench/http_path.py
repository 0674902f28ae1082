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
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec

from bench import peers_litellm
from bench._client import BenchError, wait_ready
from bench._report import (
    Spread,
    collect_environment,
    cpu_sample,
    foreign_cpu_share,
    markdown_table,
    say,
)
from bench._serve import create_api_key, free_port, serve_command, spawned, tail
from bench._wrk import (
    WRK_SCRIPT,
    Pinning,
    group_cpu_s,
    pinning,
    run_wrk,
    wait_idle,
    wrk_command,
    wrk_version,
)

NAME = "http"

SERVERS = ("bare", "airgate", "litellm")
LABELS = {"bare": "bare Litestar route", "airgate": "airgate", "litellm": "LiteLLM"}
CONNECTIONS = (1, 8, 64)
SHORT, LONG = 16, 256  # max_tokens of the measured points; LONG only streamed, at CPU_CONNS
CPU_CONNS = 8
MODES = {"json": "non-streaming", "stream": "streaming"}
MESSAGE = "Say hello to the benchmark in one short sentence."
MAX_FOREIGN_LOAD = 0.05
_DISTRIBUTIONS = ("airgate", "litestar", "uvicorn", "uvloop", "httptools", "msgspec")
_TOKENS = tuple(f" tok{i}" for i in range(16))  # backends/echo.py's pattern


# --- request bodies -------------------------------------------------------------------


def request_body(stream: bool, max_tokens: int) -> str:
    body: dict[str, Any] = {
        "model": "echo",
        "messages": [{"role": "user", "content": MESSAGE}],
        "max_tokens": max_tokens,
    }
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return json.dumps(body, separators=(",", ":"))


# --- servers under test -------------------------------------------------------------------


class Point(msgspec.Struct, frozen=True, kw_only=True):
    """One measured load on one server."""

    server: str
    mode: str
    connections: int
    max_tokens: int
    requests: int
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    cpu_s: float  # the server's CPU time during the measured load

    @property
    def cpu_per_request_us(self) -> float:
        return self.cpu_s / self.requests * 1e6


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    url: str
    token: str
    pgid: int


@dataclass(frozen=True, slots=True)
class Setup:
    """What every run shares: CPUs, files, the airgate key, the LiteLLM virtualenv."""

    pin: Pinning
    work: Path
    logs: Path
    airgate_config: Path
    airgate_data: Path
    airgate_key: str
    litellm_venv: Path
    ready_timeout: float
    redis_url: str
    duration_s: int
    warmup_s: int


def bare_command(port: int) -> list[str]:
    return [sys.executable, "-m", "uvicorn", "bench.bare_app:app", "--host", "127.0.0.1",
            "--port", str(port), "--loop", "uvloop", "--http", "httptools", "--no-access-log",
            "--log-level", "warning"]  # fmt: skip


def airgate_command(setup: Setup, port: int) -> list[str]:
    return [*serve_command(), "serve", "--config", str(setup.airgate_config),
            "--port", str(port), "--data-dir", str(setup.airgate_data)]  # fmt: skip


def _server_env() -> dict[str, str]:
    # airgate rejects unknown AIRGATE_* variables, and none may change the configuration
    return {k: v for k, v in os.environ.items() if not k.startswith("AIRGATE_")}


def expected_text(max_tokens: int) -> str:
    return "".join(_TOKENS[i % len(_TOKENS)] for i in range(max_tokens))


def check_answers(target: Target) -> None:
    """One non-streaming and one streaming request: the echo text, usage and [DONE]."""
    headers = {"Authorization": f"Bearer {target.token}"} if target.token else {}
    url = f"{target.url}/v1/chat/completions"
    want = expected_text(SHORT)
    with httpx.Client(headers=headers, timeout=60.0) as client:
        response = client.post(url, content=request_body(False, SHORT))
        if response.status_code != 200:
            raise BenchError(f"HTTP {response.status_code}: {response.text[:300]}")
        data = response.json()
        text = data["choices"][0]["message"]["content"]
        if text != want or data["usage"]["completion_tokens"] != SHORT:
            raise BenchError(f"unexpected answer: {text!r}, usage {data.get('usage')}")
        pieces, usage, done = [], None, False
        with client.stream("POST", url, content=request_body(True, SHORT)) as stream:
            if stream.status_code != 200:
                raise BenchError(f"HTTP {stream.status_code} on a stream")
            for line in stream.iter_lines():
                payload = line.removeprefix("data: ")
                if not line.startswith("data: "):
                    continue
                if payload == "[DONE]":
                    done = True
                    break
                chunk = json.loads(payload)
                pieces += [c["delta"].get("content") or "" for c in chunk.get("choices", [])]
                usage = chunk.get("usage") or usage
    if "".join(pieces) != want or not done or not usage or usage["completion_tokens"] != SHORT:
        raise BenchError(f"unexpected stream: {''.join(pieces)!r}, usage {usage}, [DONE] {done}")


async def _ready(url: str, path: str, alive: Callable[[], bool], deadline_s: float) -> float:
    async with httpx.AsyncClient(base_url=url) as client:
        return await wait_ready(client, path, deadline_s, alive)


@contextlib.contextmanager
def _serving(
    name: str, command: Sequence[str], env: dict[str, str], port: int, path: str, setup: Setup,
    cpus: str, token: str = "",
) -> Iterator[Target]:  # fmt: skip
    """Start a server pinned to ``cpus``, wait for ``path``, check its answers, stop it after."""
    log = setup.logs / f"http-{name}.log"
    url = f"http://127.0.0.1:{port}"
    with spawned([*setup.pin.prefix(cpus), *command], env, log) as proc:
        try:
            asyncio.run(_ready(url, path, lambda: proc.poll() is None, setup.ready_timeout))
            target = Target(name, url, token, proc.pid)
            check_answers(target)
        except (BenchError, httpx.HTTPError, KeyError, ValueError) as exc:
            raise BenchError(f"{name}: {exc}\n--- last lines of {log} ---\n{tail(log)}") from exc
        yield target


@contextlib.contextmanager
def server(name: str, setup: Setup) -> Iterator[Target]:
    """The server ``name`` of SERVERS, started and ready (LiteLLM with its upstream)."""
    port = free_port()
    if name == "bare":
        with _serving(name, bare_command(port), _server_env(), port, "/health", setup,
                      setup.pin.server) as target:  # fmt: skip
            yield target
    elif name == "airgate":
        command = airgate_command(setup, port)
        with _serving(name, command, _server_env(), port, "/ready", setup, setup.pin.server,
                      setup.airgate_key) as target:  # fmt: skip
            yield target
    else:
        up_port = free_port()
        with _serving("upstream", bare_command(up_port), _server_env(), up_port, "/health",
                      setup, setup.pin.load) as upstream:  # fmt: skip
            config = setup.work / "litellm.yaml"
            peers_litellm.write_config(config, upstream.url)
            key = peers_litellm.master_key()
            command = peers_litellm.command(setup.litellm_venv, config, port)
            env = peers_litellm.environment(key)
            with _serving(name, command, env, port, peers_litellm.READY_PATH, setup,
                          setup.pin.server, key) as target:  # fmt: skip
                yield target


def measure(target: Target, mode: str, connections: int, max_tokens: int, setup: Setup) -> Point:
    """A warm-up, then one measured load with the server's CPU time read around it."""
    body = request_body(mode == "stream", max_tokens)
    pin = setup.pin
    where = f"{target.name}, {MODES[mode]} {max_tokens} tokens at {connections} connections"
    try:
        run_wrk(target.url, target.token, body, connections, setup.warmup_s, pin, warm_up=True)
        wait_idle(target.pgid)
        before = group_cpu_s(target.pgid)
        result = run_wrk(target.url, target.token, body, connections, setup.duration_s, pin)
        cpu = group_cpu_s(target.pgid) - before
    except BenchError as exc:
        raise BenchError(f"{where}: {exc}") from exc
    lat = result.latency_us
    point = Point(
        server=target.name,
        mode=mode,
        connections=connections,
        max_tokens=max_tokens,
        requests=result.requests,
        rps=result.requests / (result.duration_us / 1e6),
        p50_ms=lat.p50 / 1e3,
        p90_ms=lat.p90 / 1e3,
        p99_ms=lat.p99 / 1e3,
        max_ms=lat.max / 1e3,
        cpu_s=cpu,
    )
    say(f"    {where}: {point.rps:,.0f} req/s, p50 {point.p50_ms:.2f} ms, "
        f"p99 {point.p99_ms:.2f} ms, {point.cpu_per_request_us:,.0f} µs CPU/request")  # fmt: skip
    return point


# --- the scenario -------------------------------------------------------------------------


def _shared_option(group: argparse._ArgumentGroup, *names: str, **kwargs: Any) -> None:
    """An option other scenarios may declare too: the first declaration stands."""
    with contextlib.suppress(argparse.ArgumentError):
        group.add_argument(*names, **kwargs)


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
    _shared_option(
        group,
        "--max-foreign-load",
        type=float,
        default=MAX_FOREIGN_LOAD,
        metavar="SHARE",
        help="repeat a run in which other processes used more than this share of the CPUs "
        f"(default {MAX_FOREIGN_LOAD}; 1 disables)",
    )
    _shared_option(
        group, "--ready-timeout", type=float, default=300.0, help="seconds to wait for /ready"
    )


_POLICY = """\
name = "bench-http"
description = "The http benchmark: model echo; every cap and limit is checked, none is reached."

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
audit_level = "metadata"
"""


def _airgate_config(work: Path, redis_url: str) -> Path:
    policy = work / "policy"
    policy.mkdir(parents=True)
    (policy / "bench.toml").write_text(_POLICY)
    config = work / "airgate.toml"
    config.write_text(
        f"[policy]\npath = {json.dumps(str(policy))}\n\n"
        f'[limits]\nredis_url = {json.dumps(redis_url)}\nfail_mode = "open"\n\n'
        "[audit]\nstrict = true\n\n"
        '[[models]]\nid = "echo"\nengine = "echo"\n'
    )
    return config


def prepare(args: argparse.Namespace) -> tuple[Setup, float | None]:
    """Check the tools, install LiteLLM if needed, write airgate's files and create its key."""
    if shutil.which("wrk") is None:
        raise BenchError("wrk is not installed: run `bash scripts/bench-tools.sh` (as root)")
    redis_cpu_s(args.http_redis_url)  # reachable?
    work = args.cache_dir / "http"
    shutil.rmtree(work, ignore_errors=True)  # a fresh audit database and key every invocation
    work.mkdir(parents=True)
    logs = args.cache_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for name in (*SERVERS, "upstream"):
        (logs / f"http-{name}.log").write_bytes(b"")
    say(f"checking {peers_litellm.REQUIREMENT} (installed once into the cache)")
    venv, install_s = peers_litellm.ensure_litellm(args.cache_dir, logs / "http-install.log")
    if install_s is not None:
        say(f"  installed in {install_s:.0f} s")
    config = _airgate_config(work, args.http_redis_url)
    data = work / "airgate-data"
    key = create_api_key(data, _server_env(), ["--config", str(config)], name="bench-http")
    setup = Setup(
        pin=pinning(),
        work=work,
        logs=logs,
        airgate_config=config,
        airgate_data=data,
        airgate_key=key,
        litellm_venv=venv,
        ready_timeout=args.ready_timeout,
        redis_url=args.http_redis_url,
        duration_s=args.http_duration or (4 if args.quick else 10),
        warmup_s=args.http_warmup or (1 if args.quick else 2),
    )
    return setup, install_s


class HttpRun(msgspec.Struct, frozen=True, kw_only=True):
    points: list[Point]
    order: list[str]
    foreign_share: float
    redis_cpu_s: float  # Redis's CPU time during the run (airgate's limits)


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
    kept: list[HttpRun] = []
    discarded = attempt = 0
    while len(kept) < runs:
        if discarded > runs:
            raise BenchError(
                f"{discarded} runs discarded: other processes kept more than "
                f"{args.max_foreign_load:.0%} of the CPUs busy; run on a quiet machine"
            )
        say(f"run {len(kept) + 1}/{runs}:")
        result = one_run(setup, attempt)
        attempt += 1
        if result.foreign_share > args.max_foreign_load:
            discarded += 1
            say(f"  discarded: other processes used {result.foreign_share:.0%} of the CPUs")
            continue
        kept.append(result)
    dump = setup.logs / "http-results.json"
    dump.write_bytes(msgspec.json.encode(kept))
    say(f"per-point results: {dump}")
    return render(args, setup, kept, discarded, install_s)


# --- the report ---------------------------------------------------------------------------

Key = tuple[str, str, int, int]  # server, mode, connections, max_tokens


def _by_point(kept: Sequence[HttpRun]) -> dict[Key, list[Point]]:
    """Each point's results, one per run, in run order."""
    out: dict[Key, list[Point]] = {}
    for run_ in kept:
        for p in run_.points:
            out.setdefault((p.server, p.mode, p.connections, p.max_tokens), []).append(p)
    return out


def _load_table(points: dict[Key, list[Point]], mode: str) -> str:
    rows = []
    for c in CONNECTIONS:
        for s in SERVERS:
            ps = points[(s, mode, c, SHORT)]
            rows.append([
                str(c), LABELS[s],
                Spread.of(p.rps for p in ps).format(",.0f"),
                Spread.of(p.p50_ms for p in ps).format(".2f"),
                Spread.of(p.p99_ms for p in ps).format(".2f"),
                Spread.of(p.cpu_per_request_us for p in ps).format(",.0f"),
            ])  # fmt: skip
    headers = ["Connections", "Server", "Req/s", "p50 (ms)", "p99 (ms)", "Server CPU/request (µs)"]
    return markdown_table(headers, rows, right=2)


def _token_cpu(points: dict[Key, list[Point]], server_: str) -> list[float]:
    """Per run: the server's CPU per streamed token, in µs."""
    short = points[(server_, "stream", CPU_CONNS, SHORT)]
    long = points[(server_, "stream", CPU_CONNS, LONG)]
    return [
        (b.cpu_per_request_us - a.cpu_per_request_us) / (LONG - SHORT)
        for a, b in zip(short, long, strict=True)
    ]


def _token_table(points: dict[Key, list[Point]]) -> str:
    rows = []
    for s in SERVERS:
        short = points[(s, "stream", CPU_CONNS, SHORT)]
        long = points[(s, "stream", CPU_CONNS, LONG)]
        rows.append([
            LABELS[s],
            Spread.of(p.rps for p in long).format(",.0f"),
            Spread.of(p.cpu_per_request_us for p in short).format(",.0f"),
            Spread.of(p.cpu_per_request_us for p in long).format(",.0f"),
            Spread.of(_token_cpu(points, s)).format(".1f"),
        ])  # fmt: skip
    headers = [
        "Server", f"Req/s at {LONG} tokens", f"CPU/request, {SHORT} tokens (µs)",
        f"CPU/request, {LONG} tokens (µs)", "CPU per streamed token (µs)",
    ]  # fmt: skip
    return markdown_table(headers, rows)


def _check(label: str, values: Sequence[float], op: str, target: float, spec: str) -> list[str]:
    spread = Spread.of(values)
    met = spread.median >= target if op == ">=" else spread.median <= target
    return [label, spread.format(spec), f"{op} {target:g}", "PASS" if met else "MISS"]


def _checks_table(points: dict[Key, list[Point]]) -> str:
    def at(s: str, mode: str, c: int) -> list[Point]:
        return points[(s, mode, c, SHORT)]

    rows = []
    for mode, title in MODES.items():
        a64, l64, b64 = (at(s, mode, 64) for s in ("airgate", "litellm", "bare"))
        a8, b8 = at("airgate", mode, 8), at("bare", mode, 8)
        pairs = [(a64, l64), (a64, b64), (a64, l64), (a8, b8)]
        rps_l, rps_b, p99_l, p50_b = (list(zip(x, y, strict=True)) for x, y in pairs)
        rows += [
            _check(f"{title}: airgate / LiteLLM req/s at 64 connections",
                   [a.rps / b.rps for a, b in rps_l], ">=", 25, ".1f"),
            _check(f"{title}: airgate / bare req/s at 64 connections",
                   [a.rps / b.rps for a, b in rps_b], ">=", 0.5, ".2f"),
            _check(f"{title}: airgate / LiteLLM p99 at 64 connections",
                   [a.p99_ms / b.p99_ms for a, b in p99_l], "<=", 0.1, ".3f"),
            _check(f"{title}: airgate p50 - bare p50 at 8 connections (ms)",
                   [a.p50_ms - b.p50_ms for a, b in p50_b], "<=", 1, ".2f"),
        ]  # fmt: skip
    rows.append(
        _check("airgate CPU per streamed token (µs)", _token_cpu(points, "airgate"), "<=", 20,
               ".1f")
    )  # fmt: skip
    return markdown_table(["Check (per run, same run)", "Value", "Target", "Result"], rows)


def _failovers(log: Path) -> str:
    """How often airgate's limiter lost Redis during this invocation (from its log)."""
    try:
        n = log.read_text(errors="replace").count("rate limit store unavailable")
    except OSError:
        return "failovers unknown"
    return "Redis never failed over" if not n else f"{n} failover(s) to in-process limits"


def _code(command: Sequence[str]) -> str:
    """A display command (placeholders such as ``<cache>`` left unquoted)."""
    return f"`{' '.join(command)}`"


def render(
    args: argparse.Namespace,
    setup: Setup,
    kept: Sequence[HttpRun],
    discarded: int,
    install_s: float | None,
) -> str:
    """The scenario's BENCHMARKS.md section (paths under the cache dir shown as ``<cache>``)."""
    env = collect_environment(args.command, _DISTRIBUTIONS)
    points = _by_point(kept)
    runs = len(kept)
    litellm_version = peers_litellm.installed_version(setup.litellm_venv)
    installed = (
        f"installed by this invocation in {install_s:.0f} s"
        if install_s is not None
        else "installed by an earlier invocation"
    )
    pin = setup.pin
    pinned = (
        f"`taskset -c {pin.server}` for the server under test, `taskset -c {pin.load}` for wrk "
        "and for the bare upstream LiteLLM forwards to (it does ~1% of LiteLLM's work); the "
        "benchmark's own process is not pinned (it waits while wrk runs)"
        if pin.server
        else "none (fewer than 2 usable CPUs, or no `taskset`)"
    )
    bare = ["python", *bare_command(0)[1:]]
    bare[bare.index("0")] = "PORT"
    airgate = ["airgate", "serve", "--config", "<cache>/http/airgate.toml", "--port", "PORT",
               "--data-dir", "<cache>/http/airgate-data"]  # fmt: skip
    litellm = ["<cache>/peers/litellm/bin/litellm", "--config", "<cache>/http/litellm.yaml",
               "--host", "127.0.0.1", "--port", "PORT", "--num_workers", "1"]  # fmt: skip
    wrk = wrk_command("http://127.0.0.1:PORT", 64, setup.duration_s)
    wrk[wrk.index(str(WRK_SCRIPT))] = "bench/wrk/post.lua"
    foreign = max(r.foreign_share for r in kept)
    failovers = _failovers(setup.logs / "http-airgate.log")
    figures = f"median (min–max) of {runs} runs" if runs > 1 else "one run"
    orders = "; ".join(" → ".join(LABELS[s] for s in r.order) for r in kept)
    bullets = [
        env.markdown(),
        f"- Load generator: {wrk_version()}, one thread. Peer: LiteLLM {litellm_version} "
        f"(`{peers_litellm.REQUIREMENT}` in its own virtualenv, {installed}).",
        f"- Bare route (`bench/bare_app.py`, one process): {_code(bare)}.",
        f'- airgate: {_code(airgate)}; `[[models]] id = "echo", engine = "echo"`; an app key '
        "(Bearer) created in the data dir; a policy directory whose one rule allows model echo "
        "with caps (max_tokens 4096, n 1, 1 MiB prompt) and limits (10,000,000 requests/min, "
        "10,000,000,000 tokens/min, 10,000 streams) checked on every request and never reached; "
        f'limits in Redis (`[limits] redis_url`, `fail_mode = "open"`: {failovers}); the '
        "hash-chained audit log in strict mode on SQLite in the data dir (synchronous=FULL); "
        "metrics on; the request log at the default level (info: one line per request, to a "
        "file). Tracing off (no OTLP collector). A fresh data dir and key every invocation.",
        f"- LiteLLM: `{peers_litellm.shown_environment()} {' '.join(litellm)}`; config: "
        "model_name `echo` → `openai/echo`, `api_base` = a second bare route + `/v1`, a dummy "
        "upstream key; clients send the master key as Bearer.",
        f"- Load: `WRK_BODY=<body> WRK_TOKEN=<key> {' '.join(wrk)}` (1, 8 and 64 connections) "
        f"for {setup.duration_s} s after a {setup.warmup_s} s warm-up at the same count and a "
        "wait until the server is idle (what the warm-up left in flight has finished). Bodies: "
        f'`{request_body(False, SHORT)}`, and with `"stream":true,"stream_options":'
        '{"include_usage":true}`. Latency is wrk\'s: request sent → response complete (a '
        "stream's last chunk). Any error (connect, read, write, timeout, HTTP status > 399) "
        "invalidates a point; each server's answer text, usage and `[DONE]` are checked first.",
        f"- CPU pinning: {pinned}. Server CPU = utime + stime of the server's process group "
        "(/proc) during the measured load; CPU per streamed token = (CPU/request at "
        f"{LONG} tokens - at {SHORT}) / {LONG - SHORT}, streaming at {CPU_CONNS} connections.",
        "- `<cache>` is `--cache-dir`; every server binds 127.0.0.1 on a free port.",
        f"- Figures: {figures}; server order per run: {orders}. Other processes used at most "
        f"{foreign:.0%} of the CPUs during a run (Redis, serving airgate's limits, used "
        f"{max(r.redis_cpu_s for r in kept):.1f} s of CPU at most and counts as the run's own); "
        f"{discarded} run{'s' if discarded != 1 else ''} "
        f"discarded and repeated for exceeding {args.max_foreign_load:.0%}.",
    ]
    title = "## HTTP path: airgate vs a bare Litestar route vs LiteLLM (echo engine)"
    quick = "**Smoke run (`--quick`): one run, short loads; not a result.**"
    parts = [title, *([quick] if args.quick else []), "\n".join(bullets)]
    for mode, name in MODES.items():
        parts += [f"### {name.capitalize()}, {SHORT} tokens", _load_table(points, mode)]
    parts += [
        f"### Server CPU per streamed token (streaming at {CPU_CONNS} connections)",
        _token_table(points),
        "### Checks",
        _checks_table(points),
    ]
    return "\n\n".join(parts) + "\n"
