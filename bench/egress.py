"""Scenario ``egress``: the http scenario's airgate with the egress guard on and off, same run.

The guard is a Python audit hook: it runs on every audit event of the process (each file
open, import, socket call ...), and uvloop's connects go through a wrapper.  This measures
what that costs on the request path: airgate serving the echo engine (the http scenario's
configuration: Redis limits, the strict audit log, a policy checked on every request) at
``CONNECTIONS`` connections, non-streaming and streaming, once with the default configuration
(guard on) and once with ``AIRGATE_EGRESS__ENABLED=false``; the order alternates from run to
run.  Reported: requests/s of each, and the on/off ratio per run and its median.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass

from bench import http_path, peers_litellm
from bench._report import say
from bench._serve import free_port
from bench.http_servers import (
    MODES,
    SHORT,
    Point,
    Setup,
    _serving,
    airgate_command,
    measure,
    server_env,
)

__all__ = ["NAME", "add_arguments", "check", "run"]

NAME = "egress"
CONNECTIONS = 8
GUARD = {"on": {}, "off": {"AIRGATE_EGRESS__ENABLED": "false"}}


@dataclass(frozen=True, slots=True)
class _Run:
    order: tuple[str, ...]
    points: dict[tuple[str, str], Point]  # (guard, mode) -> point


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Uses the http scenario's options (--http-duration, --http-warmup, --http-redis-url)."""


def _one_run(setup: Setup, attempt: int) -> _Run:
    order = ("on", "off") if attempt % 2 == 0 else ("off", "on")
    points: dict[tuple[str, str], Point] = {}
    for guard in order:
        say(f"  guard {guard}:")
        port = free_port()
        env = {**server_env(), **GUARD[guard]}
        command = airgate_command(setup, port)
        with _serving(f"egress-{guard}", command, env, port, "/ready", setup, setup.pin.server,
                      setup.airgate_key) as target:  # fmt: skip
            for mode in MODES:
                points[(guard, mode)] = measure(target, mode, CONNECTIONS, SHORT, setup)
    return _Run(order, points)


def run(args: argparse.Namespace) -> str:
    """Run the scenario; returns the markdown body of its BENCHMARKS.md section."""
    runs = 1 if args.quick else args.runs
    http_path.redis_cpu_s(args.http_redis_url)  # reachable?
    setup = http_path._setup(args, peers_litellm.venv_path(args.cache_dir))
    results = []
    for attempt in range(runs):
        say(f"run {attempt + 1}/{runs}:")
        results.append(_one_run(setup, attempt))
    lines = [
        f"airgate (echo engine), {CONNECTIONS} connections, {SHORT} tokens, "
        f"{setup.duration_s} s per point after {setup.warmup_s} s of warm-up; "
        "guard on = the default, off = `AIRGATE_EGRESS__ENABLED=false`.",
        "",
        "| run | order | mode | guard on (req/s) | guard off (req/s) | on/off |",
        "|---|---|---|---|---|---|",
    ]
    ratios: dict[str, list[float]] = {mode: [] for mode in MODES}
    for i, result in enumerate(results, 1):
        for mode in MODES:
            on, off = result.points[("on", mode)].rps, result.points[("off", mode)].rps
            ratios[mode].append(on / off)
            lines.append(
                f"| {i} | {' then '.join(result.order)} | {MODES[mode]} | {on:,.0f} | "
                f"{off:,.0f} | {on / off:.3f} |"
            )
    lines.append("")
    for mode in MODES:
        values = ratios[mode]
        lines.append(
            f"- {MODES[mode]}: median on/off {statistics.median(values):.3f} "
            f"(range {min(values):.3f}-{max(values):.3f}, {len(values)} runs)"
        )
    return "\n".join(lines)


def check(args: argparse.Namespace) -> str:
    """Set-up only: airgate's configuration and key (the http scenario's), both command lines."""
    setup = http_path._setup(args, peers_litellm.venv_path(args.cache_dir))
    command = airgate_command(setup, free_port())
    return "\n".join(
        [
            f"## {NAME}: set-up checked, nothing started",
            f"- airgate: {' '.join(command)}; guard off with AIRGATE_EGRESS__ENABLED=false",
        ]
    )
