"""Scenario "vllm": tokens/s and TTFT through airgate vs ``vllm serve``, same engine and model.

airgate runs vLLM in-process (``AsyncLLM``) behind its gateway; ``vllm serve`` (vLLM's own
OpenAI server) is the same engine behind nothing. Both load the same generated Llama
(``bench.llama_model``, random weights, ~26 M parameters) with the same engine arguments, in the
same virtualenv, and get the same request bodies. Each run (repeated ``--runs`` times, figures
are the median with min and max; the server that goes first alternates between runs):

- airgate: a fresh data dir; the model sealed with airgate's own CLI (``kms init``,
  ``signing-key create``, ``bundle create``) into a signed, encrypted bundle; an airgate.toml with
  that one vLLM model, the publisher key pinned and a policy without rate or token limits; an app
  key; ``airgate serve``. Everything else (API-key auth, policy decision, strict audit log in
  SQLite) is at its production default.
- ``vllm serve`` (``python -m vllm.entrypoints.openai.api_server``) on the plain model directory.

Only one server runs at a time. After each start: one warm-up request, then ``/v1/completions``
streamed at concurrency 1, 8 and 32 (``max_num_seqs`` 32: all run at once). Every request
generates exactly ``MAX_TOKENS`` tokens at temperature 0 (the end token and the other special
tokens are banned with a logit bias of -100; usage is checked) from a distinct ~100-token prompt,
so no prefix-cache hit. A run during which other processes used more than
``--max-foreign-load`` of the CPUs is discarded and repeated. Targets from the issue, per level:
airgate tokens/s >= 0.95x ``vllm serve``'s, and TTFT p50 at most 5 ms above it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import httpx
import msgspec

from bench._client import (
    BenchError,
    LoadResult,
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
from bench.edge import requests_at
from bench.llama_model import (
    BENCH_SHAPE,
    CONTROL_TOKENS,
    SPECIAL_TOKENS,
    WORDS,
    LlamaShape,
    bench_model,
)

NAME = "vllm"

MODEL_ID = "bench-llama"
MAX_TOKENS = 64
LEVELS = (1, 8, 32)
PROMPT_WORDS = 96  # ~100 tokens with the model's tokenizer, BOS included
TARGET_RATIO = 0.95  # airgate tokens/s / vllm serve tokens/s, per level
TARGET_TTFT_MS = 5.0  # airgate TTFT p50 - vllm serve TTFT p50, per level
MAX_FOREIGN_LOAD = 0.05

Server = Literal["airgate", "vllm serve"]
SERVERS: tuple[Server, Server] = ("airgate", "vllm serve")

# Air-gap settings for both servers (airgate sets the same ones itself if they are missing).
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}

# No rate, token or concurrency limits: the benchmark measures the gateway, not the limiter.
# The request caps (max_tokens, n, prompt size) stay: they are checks, not counters.
BENCH_POLICY = """\
name = "bench"
description = "The vllm benchmark: every app may use every model, without rate or token limits."

[[rules]]
name = "inference"
teams = ["*"]
roles = ["app", "admin"]
models = ["*"]
max_tokens = 4096
max_n = 1
max_prompt_bytes = 1048576
engine_classes = ["gpu", "edge"]
audit_level = "metadata"
"""


class EngineArgs(msgspec.Struct, frozen=True, kw_only=True):
    """The engine arguments both servers get: rendered once as TOML, once as CLI flags."""

    dtype: str
    max_model_len: int
    max_num_seqs: int
    seed: int
    enable_prefix_caching: bool
    kv_cache_gib: int  # whole GiB: VLLM_CPU_KVCACHE_SPACE takes no fraction
    gpu_memory_utilization: float  # on CPUs: the share of RAM; unused with an explicit KV size
    enforce_eager: bool

    def toml(self) -> str:
        """airgate's ``[models.vllm]`` table (its engine always runs scheduling_policy=priority
        with request logging and stat logging off)."""
        return "\n".join(
            [
                "[models.vllm]",
                f"dtype = {json.dumps(self.dtype)}",
                f"max_model_len = {self.max_model_len}",
                f"max_num_seqs = {self.max_num_seqs}",
                f"seed = {self.seed}",
                f"enable_prefix_caching = {json.dumps(self.enable_prefix_caching)}",
                f"kv_cache_space_gib = {self.kv_cache_gib}",
                f"gpu_memory_utilization = {self.gpu_memory_utilization}",
                f"enforce_eager = {json.dumps(self.enforce_eager)}",
            ]
        )

    def flags(self) -> list[str]:
        """``vllm serve`` flags for the same engine, airgate's fixed choices included."""
        return [
            "--dtype", self.dtype,
            "--max-model-len", str(self.max_model_len),
            "--max-num-seqs", str(self.max_num_seqs),
            "--seed", str(self.seed),
            "--enable-prefix-caching" if self.enable_prefix_caching
            else "--no-enable-prefix-caching",
            "--kv-cache-memory-bytes", str(self.kv_cache_gib * 2**30),
            "--gpu-memory-utilization", str(self.gpu_memory_utilization),
            "--enforce-eager" if self.enforce_eager else "--no-enforce-eager",
            "--scheduling-policy", "priority",
            "--no-enable-log-requests",
            "--disable-log-stats",
        ]  # fmt: skip

    def env(self) -> dict[str, str]:
        return {"VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib)}


# --- prompts and request bodies ------------------------------------------------------------


def make_prompts(run: int, phase: int, count: int) -> list[str]:
    """Deterministic prompts from the tokenizer's own words (about one token each), distinct
    across runs, phases and requests."""
    return synthetic_prompts(f"vllm/{run}/{phase}", WORDS, PROMPT_WORDS, count)


def banned_tokens(model_dir: Path) -> list[int]:
    """Ids of the end token and every other special token of the model's tokenizer: banned,
    every request runs to MAX_TOKENS and every generated token has text (TTFT is the first)."""
    data = json.loads((model_dir / "tokenizer.json").read_text())
    names = set(SPECIAL_TOKENS + CONTROL_TOKENS)
    ids = sorted(t["id"] for t in data.get("added_tokens", []) if t["content"] in names)
    config = json.loads((model_dir / "config.json").read_text())
    if config.get("eos_token_id") not in ids:
        raise BenchError(f"{model_dir}: the end token is not among the special tokens")
    return ids


def _body(prompt: str, banned: Sequence[int]) -> dict[str, Any]:
    return completion_body(MODEL_ID, prompt, MAX_TOKENS, banned)


# --- one server, driven -------------------------------------------------------------------


class ServerOutcome(msgspec.Struct, frozen=True, kw_only=True):
    ready_s: float  # process start -> ready and a first completion answered
    levels: list[LoadResult]


async def _drive(
    base_url: str,
    headers: Mapping[str, str],
    ready_path: str,
    bodies: Mapping[int, list[dict[str, Any]]],
    proc: subprocess.Popen[bytes],
    ready_timeout_s: float,
    label: str,
) -> ServerOutcome:
    timeout = httpx.Timeout(900.0, connect=10.0)
    limits = httpx.Limits(max_connections=max(LEVELS) + 4, max_keepalive_connections=max(LEVELS))
    async with httpx.AsyncClient(
        base_url=base_url, headers=dict(headers), timeout=timeout, limits=limits
    ) as client:
        ready_s = await wait_ready(client, ready_path, ready_timeout_s, lambda: proc.poll() is None)
        warmup = await run_load(client, "/v1/completions", bodies[0], 1)
        check_lengths(f"{label} warm-up", warmup.requests, MAX_TOKENS)
        ready_s += warmup.wall_s
        levels = []
        for level in LEVELS:
            result = await run_load(client, "/v1/completions", bodies[level], level)
            check_lengths(f"{label} at concurrency {level}", result.requests, MAX_TOKENS)
            say(
                f"  {label} at concurrency {level}: {result.tokens_per_s:.1f} tok/s, "
                f"TTFT p50 {percentile(result.ttfts, 50) * 1000:.1f} ms"
            )
            levels.append(result)
    return ServerOutcome(ready_s=ready_s, levels=levels)


def _serve_and_drive(
    command: Sequence[str],
    env: dict[str, str],
    log_path: Path,
    port: int,
    headers: Mapping[str, str],
    ready_path: str,
    bodies: Mapping[int, list[dict[str, Any]]],
    args: argparse.Namespace,
    label: str,
) -> ServerOutcome:
    with log_path.open("ab") as log:
        log.write(f"\n=== {label}: {' '.join(command)}\n".encode())
    with spawned(command, env, log_path) as proc:
        try:
            return asyncio.run(
                _drive(
                    f"http://127.0.0.1:{port}",
                    headers,
                    ready_path,
                    bodies,
                    proc,
                    args.ready_timeout,
                    label,
                )
            )
        except BenchError as exc:
            raise BenchError(
                f"{label}: {exc}\n--- last lines of {log_path} ---\n{tail(log_path, 30)}"
            ) from exc


def _server_env(engine: EngineArgs) -> dict[str, str]:
    """The same environment for both servers: ours without AIRGATE_* (airgate rejects unknown
    ones; its settings come from the generated config), offline, the KV-cache size."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("AIRGATE_")}
    return {**inherited, **OFFLINE_ENV, **engine.env()}


def _cli(args: Sequence[str | Path], env: dict[str, str], log_path: Path) -> None:
    """``airgate ARGS``, which must succeed (output appended to the log)."""
    command = [*serve_command(), *map(str, args)]
    with log_path.open("ab") as log:
        log.write(f"\n=== {' '.join(command)}\n".encode())
        log.flush()
        done = subprocess.run(
            command, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            timeout=600, check=False,
        )  # fmt: skip
    if done.returncode != 0:
        raise BenchError(
            f"`airgate {' '.join(map(str, args[:2]))}` failed (exit {done.returncode}):\n"
            f"{tail(log_path)}"
        )


def _airgate_config(run_dir: Path, bundle: Path, publisher_pub: Path, engine: EngineArgs) -> Path:
    policy_dir = run_dir / "policy"
    policy_dir.mkdir()
    (policy_dir / "bench.toml").write_text(BENCH_POLICY)
    config = run_dir / "airgate.toml"
    config.write_text(
        f"""\
[bundles]
trusted_keys = [{json.dumps(str(publisher_pub))}]

[policy]
path = {json.dumps(str(policy_dir))}

[[models]]
id = "{MODEL_ID}"
engine = "vllm"
bundle = {json.dumps(str(bundle))}

{engine.toml()}
"""
    )
    return config


def run_airgate(
    args: argparse.Namespace,
    model_dir: Path,
    engine: EngineArgs,
    bodies: Mapping[int, list[dict[str, Any]]],
    run_dir: Path,
    log_path: Path,
) -> ServerOutcome:
    """Seal the model, configure and start ``airgate serve``, drive every level, stop it."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    data = run_dir / "data"
    env = _server_env(engine)
    publisher = run_dir / "publisher.key"
    bundle = run_dir / f"{MODEL_ID}.bundle"
    _cli(["kms", "init", "--data-dir", data], env, log_path)
    _cli(["signing-key", "create", publisher], env, log_path)
    _cli(
        [
            "bundle", "create", model_dir,
            "--name", MODEL_ID, "--version", "1", "--architecture", "llama",
            "--recipient", "local:default",
            "--signing-key", publisher,
            "--out", bundle,
            "--data-dir", data,
        ],
        env,
        log_path,
    )  # fmt: skip
    config = _airgate_config(run_dir, bundle, publisher.with_name(publisher.name + ".pub"), engine)
    key = create_api_key(data, env, ["--config", str(config)], name="bench-vllm")
    port = free_port()
    command = [
        *serve_command(), "serve",
        "--port", str(port), "--data-dir", str(data), "--config", str(config),
    ]  # fmt: skip
    headers = {"Authorization": f"Bearer {key}"}
    return _serve_and_drive(
        command, env, log_path, port, headers, "/ready", bodies, args, "airgate"
    )


def run_vllm_serve(
    args: argparse.Namespace,
    model_dir: Path,
    engine: EngineArgs,
    bodies: Mapping[int, list[dict[str, Any]]],
    log_path: Path,
) -> ServerOutcome:
    """``vllm serve`` on the plain model directory with the same engine arguments."""
    port = free_port()
    # `python -m`: the `vllm` script of vllm-cpu 0.32.0 fails (it asks for the version of a
    # distribution named "vllm"); this module is the same server, with a deprecation warning.
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", MODEL_ID,
        "--host", "127.0.0.1", "--port", str(port),
        *engine.flags(),
    ]  # fmt: skip
    return _serve_and_drive(
        command, _server_env(engine), log_path, port, {}, "/health", bodies, args, "vllm serve"
    )


# --- the scenario -------------------------------------------------------------------------


def _shared_option(group: argparse._ArgumentGroup, *names: str, **kwargs: Any) -> None:
    """An option other scenarios may declare too (edge: --max-foreign-load, --ready-timeout):
    the first declaration stands, with the same meaning for every scenario."""
    with contextlib.suppress(argparse.ArgumentError):
        group.add_argument(*names, **kwargs)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("vllm scenario")
    group.add_argument(
        "--vllm-dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16"],
        help="engine dtype for both servers (default float32)",
    )
    group.add_argument(
        "--vllm-kv-cache-gib",
        type=int,
        default=1,
        metavar="GIB",
        help="KV-cache size for both servers, whole GiB (default 1)",
    )
    group.add_argument(
        "--vllm-enforce-eager",
        action="store_true",
        help="no torch.compile in either server (faster start, slower steps)",
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


def engine_args(args: argparse.Namespace) -> EngineArgs:
    return EngineArgs(
        dtype=args.vllm_dtype,
        max_model_len=512,
        max_num_seqs=max(LEVELS),
        seed=0,
        enable_prefix_caching=True,  # airgate's default; distinct prompts never hit it
        kv_cache_gib=args.vllm_kv_cache_gib,
        gpu_memory_utilization=0.9,
        enforce_eager=args.vllm_enforce_eager,
    )


class PeerRun(msgspec.Struct, frozen=True, kw_only=True):
    first: str  # the server that ran first
    airgate: ServerOutcome
    vllm: ServerOutcome
    foreign_share: float  # of all CPUs, used by other processes during the run


def run(args: argparse.Namespace) -> str:
    """Run the scenario; returns the markdown body of its BENCHMARKS.md section."""
    runs = 1 if args.quick else args.runs
    logs = args.cache_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    airgate_log, vllm_log = logs / "vllm-airgate.log", logs / "vllm-serve.log"
    for log in (airgate_log, vllm_log):
        log.write_bytes(b"")  # this invocation's output only
    # airgate's data dirs (bundle, keys, audit database) of this invocation's runs only
    shutil.rmtree(args.cache_dir / "vllm-airgate", ignore_errors=True)
    say("vllm: generating the benchmark model (cached after the first time)")
    model_dir = bench_model(args.cache_dir)
    engine = engine_args(args)
    banned = banned_tokens(model_dir)
    kept: list[PeerRun] = []
    discarded = 0
    attempt = 0
    while len(kept) < runs:
        if discarded > runs:
            raise BenchError(
                f"{discarded} runs discarded: other processes kept more than "
                f"{args.max_foreign_load:.0%} of the CPUs busy; run on a quiet machine"
            )
        first: Server = SERVERS[len(kept) % 2]
        say(f"run {len(kept) + 1}/{runs} ({first} first):")
        prompts = {
            level: make_prompts(attempt, level, requests_at(level, args.quick)) for level in LEVELS
        }
        prompts[0] = make_prompts(attempt, 0, 1)  # the warm-up, the same for both
        bodies = {level: [_body(p, banned) for p in ps] for level, ps in prompts.items()}
        before = cpu_sample()
        outcomes: dict[Server, ServerOutcome] = {}
        for server in (first, SERVERS[1 - SERVERS.index(first)]):
            if server == "airgate":
                run_dir = args.cache_dir / "vllm-airgate" / f"run-{attempt}"
                outcomes[server] = run_airgate(
                    args, model_dir, engine, bodies, run_dir, airgate_log
                )
            else:
                outcomes[server] = run_vllm_serve(args, model_dir, engine, bodies, vllm_log)
        # Both servers have exited and been reaped: their CPU time now counts as ours.
        share = foreign_cpu_share(before, cpu_sample())
        attempt += 1
        if share > args.max_foreign_load:
            discarded += 1
            say(f"  discarded: other processes used {share:.0%} of the CPUs")
            continue
        kept.append(
            PeerRun(
                first=first,
                airgate=outcomes["airgate"],
                vllm=outcomes["vllm serve"],
                foreign_share=share,
            )
        )
    dump = logs / "vllm-results.json"
    dump.write_bytes(msgspec.json.encode(kept))
    say(f"per-request results: {dump}")
    return render(args, kept, discarded, engine, BENCH_SHAPE, model_dir, banned)


# --- rendering ----------------------------------------------------------------------------


def _row(label: str, results: Sequence[LoadResult]) -> list[str]:
    return [
        label,
        str(len(results[0].requests)),
        Spread.of(r.tokens_per_s for r in results).format(".1f"),
        Spread.of(percentile(r.ttfts, 50) * 1000 for r in results).format(".1f"),
        Spread.of(percentile(r.ttfts, 95) * 1000 for r in results).format(".1f"),
    ]


def _check_row(label: str, values: Sequence[float], spec: str, target: str, ok: bool) -> list[str]:
    return [label, Spread.of(values).format(spec), target, "PASS" if ok else "MISS"]


def _level_results(kept: Sequence[PeerRun], i: int) -> tuple[list[LoadResult], list[LoadResult]]:
    return [r.airgate.levels[i] for r in kept], [r.vllm.levels[i] for r in kept]


def _prompt_tokens(outcomes: Sequence[ServerOutcome]) -> list[int]:
    return sorted(q.prompt_tokens for o in outcomes for level in o.levels for q in level.requests)


def render(
    args: argparse.Namespace,
    kept: Sequence[PeerRun],
    discarded: int,
    engine: EngineArgs,
    shape: LlamaShape,
    model_dir: Path,
    banned: Sequence[int],
) -> str:
    """The scenario's BENCHMARKS.md section."""
    env = collect_environment(args.command, ["airgate", "vllm-cpu", "torch", "httpx"])
    runs = len(kept)
    tables = []
    checks = []
    for i, level in enumerate(LEVELS):
        ours, theirs = _level_results(kept, i)
        tables.append(
            f"Concurrency {level}:\n\n"
            + markdown_table(
                ["Server", "Requests", "Tokens/s", "TTFT p50 (ms)", "TTFT p95 (ms)"],
                [_row("airgate", ours), _row("vllm serve", theirs)],
            )
        )
        ratios = [a.tokens_per_s / v.tokens_per_s for a, v in zip(ours, theirs, strict=True)]
        diffs = [
            (percentile(a.ttfts, 50) - percentile(v.ttfts, 50)) * 1000
            for a, v in zip(ours, theirs, strict=True)
        ]
        ratio, diff = Spread.of(ratios), Spread.of(diffs)
        checks.append(
            _check_row(
                f"concurrency {level}: tokens/s, airgate / vllm serve",
                ratios,
                ".3f",
                f">= {TARGET_RATIO}",
                ratio.median >= TARGET_RATIO,
            )
        )
        checks.append(
            _check_row(
                f"concurrency {level}: TTFT p50, airgate - vllm serve (ms)",
                diffs,
                "+.1f",
                f"<= +{TARGET_TTFT_MS:.0f}",
                diff.median <= TARGET_TTFT_MS,
            )
        )
    check_table = markdown_table(
        ["Check (per run, against the same run's vllm serve)", "Figure", "Target", "Result"],
        checks,
    )
    ours_tokens = _prompt_tokens([r.airgate for r in kept])
    theirs_tokens = _prompt_tokens([r.vllm for r in kept])
    same = "identical on both servers" if ours_tokens == theirs_tokens else "DIFFERENT per server"
    low, high = min(ours_tokens + theirs_tokens), max(ours_tokens + theirs_tokens)
    figures = f"median of {runs} runs (min–max)" if runs > 1 else "one run"
    firsts = ", ".join(r.first for r in kept)
    foreign = max(r.foreign_share for r in kept)
    ready_a = Spread.of(r.airgate.ready_s for r in kept).format(".0f")
    ready_v = Spread.of(r.vllm.ready_s for r in kept).format(".0f")
    flags = " ".join(engine.flags())
    bullets = [
        env.markdown(),
        f"- Model: a generated Llama (`bench/llama_model.py`, random weights, seed 0): "
        f"{shape.describe()}, {engine.dtype}, its own BPE tokenizer; `{model_dir.name}`.",
        f"- Engine arguments, the same for both: `{flags}` with "
        f"`VLLM_CPU_KVCACHE_SPACE={engine.kv_cache_gib}` and the offline variables "
        f"({', '.join(OFFLINE_ENV)}); airgate's `[models.vllm]` sets the same values and its "
        "engine always runs the priority scheduler with request and stat logging off.",
        "- airgate: `airgate serve --config airgate.toml` on a fresh data dir per run; the model "
        "sealed with `airgate bundle create` (signed, encrypted under the local KMS key) and "
        "decrypted at start; an app key sent on every request; a policy without rate, token or "
        "concurrency limits (`max_tokens`/`n`/prompt-size caps kept); everything else at its "
        "production default: API-key auth, the policy decision, the strict audit log in SQLite "
        "(two rows committed per request, `synchronous = full`), the request log line. "
        f"Start to first answer: {ready_a} s.",
        "- vllm serve: `python -m vllm.entrypoints.openai.api_server --model DIR` on the plain "
        "model directory (benchmark only), no API key, its default uvicorn access log. "
        f"Start to first answer: {ready_v} s. Both compile the model (torch.compile) at every "
        "start: vllm serve fails to load its own compile cache with vllm-cpu 0.32.0, and "
        "airgate's model directory is a new private tmpfs path each start.",
        f"- Workload: `/v1/completions`, `stream=true`, `stream_options.include_usage`, "
        f"temperature 0, {MAX_TOKENS} generated tokens per request (special tokens "
        f"{', '.join(map(str, banned))} banned with logit_bias -100; every request checked to "
        f"return exactly {MAX_TOKENS}); distinct prompts of "
        f"{low if low == high else f'{low}-{high}'} tokens ({same}); identical bodies for both "
        f"servers; one warm-up request after each start; concurrency "
        f"{', '.join(map(str, LEVELS))} held constant by that many client workers; only one "
        "server running at a time.",
        "- Tokens/s = generated tokens / wall time of the batch; TTFT = time to the first text "
        f"chunk. Figures: {figures}; first server per run: {firsts}. Other processes used at "
        f"most {foreign:.0%} of the CPUs during a run; {discarded} "
        f"run{'s' if discarded != 1 else ''} discarded and repeated for exceeding "
        f"{args.max_foreign_load:.0%}.",
    ]
    meaning = (
        "Both servers run vLLM's engine core (scheduler and model) in a separate process and "
        "stream its outputs from a Python front end, so the ratios compare front ends: airgate's "
        "adds API-key auth, the policy decision, the limiter and the router, and two durable "
        "audit commits per request in strict mode (`inference.admitted` before generation "
        "starts, so inside TTFT; `inference.completed` before the stream's last bytes); "
        "`vllm serve` does none of that. Both tokenise the prompt in the front-end process. "
        "On a 2-core machine the front end competes with the engine core for the CPUs, so every "
        "millisecond of gateway work per request or per token shows up in both figures; on a "
        "GPU host the same work is hidden behind the GPU's step time."
    )
    title = "## vLLM: airgate vs `vllm serve`, same vllm-cpu, same model"
    quick = "**Smoke run (`--quick`): one run, few requests; not a result.**"
    parts = [
        title,
        *([quick] if args.quick else []),
        "\n".join(bullets),
        *tables,
        check_table,
        meaning,
    ]
    return "\n\n".join(parts) + "\n"
