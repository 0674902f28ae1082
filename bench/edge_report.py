"""The edge scenario's report: the record of one run and the BENCHMARKS.md section.

Targets from the issues, at concurrency 8: airgate's aggregate at least 2.5x
``llama_cpp.server``'s and 0.9x ``llama-server``'s, its TTFT p50 not above ``llama-server``'s;
against raw single-stream, at least 1.5x at concurrency 8 and 0.9x at 1. Each is checked per run
against the same run's figures, then summarised over runs.
"""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec

from bench._client import LoadResult
from bench._levels import ServerOutcome
from bench._report import Spread, collect_environment, markdown_table, percentile
from bench.edge_raw import RAW_N_CTX, RawOutcome
from bench.edge_servers import AIRGATE, PEER_N_CTX, Peers, server_env
from bench.edge_workload import BANNED_TOKENS, LEVELS, MAX_TOKENS
from bench.peers_llama import (
    LLAMA_CPP_SERVER,
    LLAMA_SERVER,
    llama_cpp_server_command,
    llama_cpp_server_versions,
)
from bench.peers_llama_server import llama_server_build, llama_server_command

__all__ = ["EdgeRun", "render"]

TARGET_AT_8 = 1.5  # gateway aggregate at concurrency 8 / raw single stream
TARGET_AT_1 = 0.9  # gateway at concurrency 1 / raw single stream
COMPARED_AT = 8  # the concurrency of the checks against the peers
TARGET_VS_LLAMA_CPP_SERVER = 2.5  # airgate tokens/s / llama_cpp.server's
TARGET_VS_LLAMA_SERVER = 0.9  # airgate tokens/s / llama-server's
TARGET_TTFT_VS_LLAMA_SERVER = 0.0  # airgate TTFT p50 - llama-server's, seconds


class EdgeRun(msgspec.Struct, frozen=True, kw_only=True):
    raw: RawOutcome
    order: list[str]  # the servers in the order they ran
    servers: dict[str, ServerOutcome]
    foreign_share: float  # of all CPUs, used by other processes during the run


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
