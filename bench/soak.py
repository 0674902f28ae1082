"""Soak: mixed streaming load at the saturation point for 30 minutes (``python -m bench.soak``).

``airgate serve`` is started on the llama.cpp engine exactly as the edge scenario starts it
(its options, ``server_env`` and app key; Gemma 3 270M, 8 slots, 2 threads by default). Then
``--concurrency`` client workers (default: one per slot, so every slot is always busy) each loop
until the deadline, sending a seeded random mix of ``/v1/chat/completions`` and
``/v1/completions``, streamed or not, ``max_tokens`` from ``MAX_TOKENS``, temperature 0 or 0.8,
and a distinct prompt of ``PROMPT_WORDS`` words. About ``ABANDON_SHARE`` of the streams are hung
up on by the client after a few chunks: the gateway must cancel them cleanly; they are counted
apart, not as errors. Every other request must answer 200 with usage and exactly ``max_tokens``
completion tokens (the end tokens are banned); anything else is an error, counted by kind (a
worker pauses a second after one, so a broken server is not hammered).

Every ``SAMPLE_EVERY_S`` seconds the server's process tree is sampled from /proc: resident
memory (VmRSS), open file descriptors and threads. The run is cut into ``WINDOWS`` windows
(5 minutes each in 30); the first is the warm-up. After the load: the gateway's /metrics must
show nothing in flight (router, engine, queue) within ``SETTLE_S`` and /ready must answer 200.

Checks: 0 errors; resident memory at the end at most ``RSS_GROWTH_TARGET`` above the sample at
the end of the warm-up; nothing in flight; ready. The p99 drift (last window's p99 / the first
window after the warm-up's) is reported without a target. The exit status is 1 when a check
fails. Not a scenario of ``python -m bench``: a full run (30 minutes or more, or any run with
``--output``) writes the ``soak`` section of BENCHMARKS.md; shorter runs only print.
``--check`` only sets up (airgate's launch as a run builds it, in a temporary directory, and a
sample of the request mix), starts nothing and exits 0 when the set-up holds.

Modules: ``soak_requests`` (the mix, the outcomes), ``soak_probes`` (/proc, /metrics, /ready),
``soak_report`` (the section).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import httpx
import msgspec

from bench import edge
from bench._check import airgate_args, shown
from bench._client import BenchError, wait_ready
from bench._report import (
    cpu_sample,
    default_cache_dir,
    foreign_cpu_share,
    publish,
    redacted_argv,
    say,
)
from bench._serve import run_served
from bench.edge_servers import Launch, gateway_launch
from bench.soak_probes import SAMPLE_EVERY_S, ProcSample, after_load, peak_rss_kib, sample_tree
from bench.soak_report import FULL_MINUTES, WINDOWS, SoakResult, clock, render
from bench.soak_requests import Failure, Outcome, plan, send

NAME = "soak"

ERROR_PAUSE_S = 1.0


# --- the run ------------------------------------------------------------------------------


async def _drive(
    args: argparse.Namespace, launch: Launch, proc: subprocess.Popen[bytes]
) -> SoakResult:
    pid = proc.pid

    def alive() -> bool:
        return proc.poll() is None

    timeout = httpx.Timeout(300.0, connect=10.0)
    async with httpx.AsyncClient(
        base_url=launch.base_url, headers=launch.headers, timeout=timeout
    ) as client:
        ready_s = await wait_ready(client, "/ready", args.ready_timeout, alive)
        planned_s = args.duration * 60
        outcomes: list[Outcome] = []
        samples: list[ProcSample] = []
        stop = asyncio.Event()
        t0 = time.monotonic()

        async def worker(n: int) -> None:
            rng = random.Random(f"soak/{args.seed}/{n}")
            i = 0
            while time.monotonic() - t0 < planned_s and alive():
                outcome = await send(client, plan(rng, args.model, f"soak/{args.seed}/{n}/{i}"), t0)
                outcomes.append(outcome)
                if isinstance(outcome, Failure):
                    await asyncio.sleep(ERROR_PAUSE_S)
                i += 1

        async def sampler() -> None:
            window, announced = planned_s / WINDOWS, 0
            while not stop.is_set():
                samples.append(sample_tree(pid, time.monotonic() - t0))
                if samples[-1].at_s >= (announced + 1) * window - 1e-3 and announced + 1 < WINDOWS:
                    announced += 1
                    errors = sum(isinstance(o, Failure) for o in outcomes)
                    say(
                        f"  {clock(samples[-1].at_s)}: {len(outcomes)} requests, {errors} errors,"
                        f" RSS {samples[-1].rss_kib / 1024:.0f} MiB"
                    )
                next_at = t0 + len(samples) * SAMPLE_EVERY_S
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(0.0, next_at - time.monotonic()))

        say(f"ready after {ready_s:.1f} s; {args.concurrency} workers for {clock(planned_s)}")
        async with asyncio.TaskGroup() as group:
            group.create_task(sampler())
            await asyncio.gather(*(worker(n) for n in range(args.concurrency)))
            load_s = time.monotonic() - t0
            stop.set()
        samples.append(sample_tree(pid, load_s))
        after = await after_load(client)
    if not alive():
        raise BenchError("the server exited during the soak")
    return SoakResult(
        planned_s=planned_s,
        load_s=load_s,
        ready_s=ready_s,
        concurrency=args.concurrency,
        outcomes=outcomes,
        samples=samples,
        peak_rss_kib=peak_rss_kib(pid),
        after=after,
    )


def run(args: argparse.Namespace) -> SoakResult:
    """Start the server, soak it, stop it; per-request results go to the logs directory."""
    logs = args.cache_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / "soak-server.log"
    log.write_bytes(b"")  # this invocation's output only
    before = cpu_sample()
    launch = gateway_launch(args, key_name="bench-soak")  # as the edge scenario starts it
    result = run_served(
        launch.name, launch.command, launch.env, log, lambda proc: _drive(args, launch, proc)
    )
    # The server has exited and been reaped: its CPU time now counts as ours.
    result = msgspec.structs.replace(result, foreign_share=foreign_cpu_share(before, cpu_sample()))
    dump = logs / "soak-results.json"
    dump.write_bytes(msgspec.json.encode(result))
    say(f"per-request results and samples: {dump}")
    return result


def check(args: argparse.Namespace) -> str:
    """Set-up only (``--check``): airgate's launch as a run builds it (settings loaded, an app
    key created, its command line parsed by airgate's CLI), this process's tree sampled as the
    server's will be, and the first requests of every worker's mix planned; nothing started."""
    launch = gateway_launch(args, key_name="bench-soak")
    lines = [
        f"airgate: {shown(launch.command)} parsed as `airgate {airgate_args(launch.command)}`; "
        "settings loaded, " + ("the --api-key given" if args.api_key else "an app key created")
    ]
    sample = sample_tree(os.getpid(), 0.0)
    if sample.processes < 1 or sample.rss_kib <= 0:
        raise BenchError(f"/proc gave no usable sample of this process: {sample}")
    lines.append(f"process tree sampled: {sample.processes} process(es), {sample.fds} fds")
    planned = [
        plan(random.Random(f"soak/{args.seed}/{n}"), args.model, f"soak/{args.seed}/{n}/{i}")
        for n in range(args.concurrency)
        for i in range(8)
    ]
    for req in planned:
        if not req.body["stream"] and "stream_options" in req.body:
            raise BenchError(f"a plain {req.kind} request carries stream_options")
    kinds = Counter(req.kind for req in planned)
    lines.append(
        f"{len(planned)} requests planned: " + ", ".join(f"{n} {k}" for k, n in kinds.items())
    )
    return "\n".join([f"## {NAME}: set-up checked, nothing started", *(f"- {x}" for x in lines)])


# --- command line -------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description="mixed streaming load at saturation against airgate serve (llama.cpp)",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=FULL_MINUTES,
        metavar="MIN",
        help=f"minutes of load (default {FULL_MINUTES:g}; shorter runs only print)",
    )
    parser.add_argument(
        "--concurrency", type=int, help="client workers (default: --slots, every slot busy)"
    )
    parser.add_argument("--seed", default="0", help="seed of the request mix (default 0)")
    parser.add_argument(
        "--output",
        type=Path,
        help=f"file to write the {NAME} section into (default BENCHMARKS.md at the repo root "
        f"after a run of {FULL_MINUTES:g} minutes or more; shorter: print only)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=default_cache_dir(),
        help="server data dir and logs (default ~/.cache/airgate/bench)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="set-up only: build airgate's launch and the request mix in a temporary directory, "
        "start nothing",
    )
    edge.add_arguments(parser)  # the server's options: --slots, --threads, --api-key, ...
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    args.concurrency = args.concurrency or args.slots
    if args.duration <= 0 or args.concurrency < 1:
        print("bench.soak: --duration and --concurrency must be positive", file=sys.stderr)
        return 2
    args.command = shlex.join(["python", "-m", "bench.soak", *redacted_argv(argv)])
    try:
        if args.check:
            with tempfile.TemporaryDirectory(prefix="airgate-bench-check-") as tmp:
                args.cache_dir = Path(tmp)
                print(check(args))
            return 0
        result = run(args)
    except BenchError as exc:
        print(f"bench.soak: {exc}", file=sys.stderr)
        return 1
    body, passed = render(args, result)
    publish("bench.soak", NAME, body, args.output, full=args.duration >= FULL_MINUTES)
    if not passed:
        say("bench.soak: a check failed (see the table)")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
