"""The http scenario's report: the record of one run and the BENCHMARKS.md section.

Checks, per run against the same run's figures, then summarised: at 64 connections airgate's
requests/s at least 25x LiteLLM's and half the bare route's, its p99 at most a tenth of
LiteLLM's; at 8 connections its p50 at most 1 ms above the bare route's; its CPU per streamed
token at most 20 µs.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import msgspec

from bench import peers_litellm
from bench._report import Spread, collect_environment, markdown_table
from bench._wrk import WRK_SCRIPT, wrk_command, wrk_version
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
    bare_command,
    request_body,
)

__all__ = ["HttpRun", "render"]

_DISTRIBUTIONS = ("airgate", "litestar", "uvicorn", "uvloop", "httptools", "msgspec")


class HttpRun(msgspec.Struct, frozen=True, kw_only=True):
    points: list[Point]
    order: list[str]
    foreign_share: float
    redis_cpu_s: float  # Redis's CPU time during the run (airgate's limits)


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
