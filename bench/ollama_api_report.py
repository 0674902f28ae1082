"""The ollama_api scenario's record and its BENCHMARKS.md section.

Target: through Ollama's API, aggregate tokens/s at least 0.97x OpenAI's on the same server at
each concurrency: the ratio is taken per pair of batches (the same prompts through each API,
back to back), then its median over every pair of every run. The TTFT ratio is reported beside
it, with no target.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Sequence

import msgspec

from bench._report import Spread, collect_environment, markdown_table, percentile
from bench.edge_servers import server_env
from bench.ollama_api_stream import APIS, PATHS, Api, Batch

__all__ = ["TARGET", "Results", "Round", "pairs", "render", "same_counts", "tokens_per_s"]

TARGET = 0.97
_DISTRIBUTIONS = ("airgate", "llama-cpp-python", "httpx", "ollama")
_LABEL: dict[Api, str] = {"ollama": "Ollama API", "openai": "OpenAI API"}


class Round(msgspec.Struct, frozen=True, kw_only=True):
    """One server start: the warm-up, then the batches in the order they ran."""

    ready_s: float
    warmup_tokens: int  # the warm-up prompt's tokens, equal through all three clients
    batches: list[Batch]
    foreign_share: float


class Results(msgspec.Struct, kw_only=True):
    max_tokens: int
    levels: list[int]
    pairs: int  # pairs of batches (one per API) per level and round
    requests: dict[int, int]  # requests per batch at each level
    rounds: list[Round] = []
    discarded: int = 0


def _of(r: Round, api: Api, level: int) -> list[Batch]:
    return [b for b in r.batches if b.api == api and b.concurrency == level]


def tokens_per_s(batches: Sequence[Batch]) -> float:
    """Aggregate over several batches: their tokens over their summed wall time."""
    return sum(b.tokens for b in batches) / sum(b.wall_s for b in batches)


def _ttft(batches: Sequence[Batch], q: float) -> float:
    return percentile([t for b in batches for t in b.ttfts], q)


def same_counts(r: Round, level: int) -> tuple[int, int]:
    """Prompts (of ``r`` at ``level``) whose token count was the same through both APIs, and
    all prompts: the pairs' batches hold the same prompts, in the same order."""
    same = total = 0
    for a, b in pairs(r, level):
        for x, y in zip(a.requests, b.requests, strict=True):
            total += 1
            same += x.tally.tokens == y.tally.tokens
    return same, total


def pairs(r: Round, level: int) -> list[tuple[Batch, Batch]]:
    """The (Ollama, OpenAI) batches of each pair ``r`` ran at ``level``: back to back, on the
    same prompts."""
    ran = [b for b in r.batches if b.concurrency == level]
    two = zip(ran[0::2], ran[1::2], strict=True)
    return [(x, y) if x.api == "ollama" else (y, x) for x, y in two]


def _ratio(rounds: Sequence[Round], level: int, figure: str) -> Spread:
    """Ollama / OpenAI per pair (two batches back to back: the closest in time, so the least
    disturbed by other processes), over every pair of every run."""

    def one(o: Batch, a: Batch) -> float:
        if figure == "tps":
            return o.tokens_per_s / a.tokens_per_s
        return _ttft([o], 50) / _ttft([a], 50)

    return Spread.of(one(o, a) for r in rounds for o, a in pairs(r, level))


def _second_over_first(rounds: Sequence[Round], level: int) -> Spread:
    """Tokens/s of the batch that ran second in a pair over the first's, whatever the APIs."""
    ran = [[b for b in r.batches if b.concurrency == level] for r in rounds]
    return Spread.of(
        y.tokens_per_s / x.tokens_per_s for b in ran for x, y in zip(b[0::2], b[1::2], strict=True)
    )


def _row(rounds: Sequence[Round], api: Api, level: int) -> list[str]:
    per_run = [_of(r, api, level) for r in rounds]
    tokens = sum(b.tokens for batches in per_run for b in batches)
    chunks = sum(b.chunks for batches in per_run for b in batches)
    return [
        _LABEL[api], str(level), str(sum(len(b.requests) for b in per_run[0])),
        Spread.of(tokens_per_s(b) for b in per_run).format(".1f"),
        Spread.of(_ttft(b, 50) for b in per_run).format(".3f"),
        Spread.of(_ttft(b, 95) for b in per_run).format(".3f"),
        f"{chunks:,} / {tokens:,}",
    ]  # fmt: skip


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def _bullets(args: argparse.Namespace, results: Results) -> list[str]:
    env = collect_environment(args.command, _DISTRIBUTIONS)
    rounds, n = results.rounds, results.max_tokens
    engine_env = " ".join(f"{key}={value}" for key, value in server_env(args).items())
    prompts = sorted({q.tally.prompt_tokens for r in rounds for b in r.batches for q in b.requests})
    shares = [r.foreign_share for r in rounds]
    orders = "; ".join(
        " ".join("O" if b.api == "ollama" else "A" for b in r.batches) for r in rounds
    )
    per_level = ", ".join(f"{results.requests[c]} at concurrency {c}" for c in results.levels)
    same = [same_counts(r, c) for r in rounds for c in results.levels]
    agree, total = sum(s for s, _ in same), sum(t for _, t in same)
    return [
        env.markdown(),
        f"- airgate: `airgate serve` with {engine_env or 'its defaults'} and otherwise its "
        "default configuration (Gemma 3 270M Q4_K_M sealed into a bundle on first start, its "
        "in-process llama.cpp engine, SQLite audit), an app key on every request; started "
        f"afresh for each run (start to ready {Spread.of(r.ready_s for r in rounds).format('.1f')}"
        " s). Warm-up: one prompt through the official `ollama` AsyncClient, then through each "
        "API with httpx; its token count is checked to be the same all three ways "
        f"({', '.join(sorted({str(r.warmup_tokens) for r in rounds}))} tokens).",
        f"- Workload: streamed chat, one user message per request, `{PATHS['ollama']}` (NDJSON, "
        f"`options.num_predict` {n}) and `{PATHS['openai']}` (SSE, `max_tokens` {n}, "
        "`stream_options.include_usage`), both temperature 0 and the same seed; distinct "
        f"prompts of {prompts[0]}-{prompts[-1]} tokens (chat template included), the same for "
        "both APIs. Ollama has no `logit_bias`, so the end tokens cannot be banned: a request "
        f"stops at {n} tokens or where the model ends its turn. The same prompt gave the same "
        f"token count through both APIs for {agree} of {total} prompts.",
        f"- Client: httpx {env.packages[2][1]} async streaming for both APIs, the same read "
        "loop (`bench.ollama_api_stream`), line by line, msgspec decoding; the official "
        "`ollama` client (pydantic models per line) only in the warm-up, so neither API pays "
        "for a heavier client. Tokens = Ollama's `eval_count` on the final line, OpenAI's "
        "`usage.completion_tokens`; cross-checked against the content chunks received "
        "(shown as chunks / tokens: a chunk per token, less a token whose text is held back).",
        f"- Per run and concurrency: {_count(results.pairs, 'pair')} of batches, one per API, "
        f"the API that goes first alternating (O = Ollama, A = OpenAI; per run: {orders}); "
        f"requests per batch: {per_level}, held at that concurrency by as many client workers. "
        "Tokens/s = tokens of an API's batches / their summed wall time; TTFT = time to the "
        "first non-empty content, p50 and p95 over an API's requests in the run. Figures: "
        f"median (min–max) over {_count(len(rounds), 'run')}; the Ollama / OpenAI ratios are "
        "taken per pair (two batches back to back, the closest in time) and summarised over "
        f"all {_count(len(rounds) * results.pairs, 'pair')} at each concurrency.",
        f"- The machine's {os.cpu_count()} cores are shared by the engine ({args.threads} "
        "threads), the load generator and other processes: these used at most "
        f"{max(shares, default=0):.0%} of the CPUs during a run (median "
        f"{statistics.median(shares):.0%}); {_count(results.discarded, 'run')} discarded "
        f"and repeated for exceeding {args.max_foreign_load:.0%}. Absolute figures are noisy; "
        "the interleaved ratio is the result.",
    ]


def _reading(results: Results) -> str:
    """One paragraph: what the ratios say, from the figures alone."""
    rounds = results.rounds
    tps = {c: _ratio(rounds, c, "tps") for c in results.levels}
    ttft = {c: _ratio(rounds, c, "ttft") for c in results.levels}
    at = " and ".join(f"{tps[c].format('.3f')} at concurrency {c}" for c in results.levels)
    if any(s.median < TARGET for s in tps.values()):
        verdict = f"the Ollama API misses the {TARGET}x target"
    else:
        verdict = f"the Ollama API meets the {TARGET}x target"
    order = " and ".join(
        f"{_second_over_first(rounds, c).format('.3f')} at {c}" for c in results.levels
    )
    ttfts = " and ".join(f"{ttft[c].format('.2f')}x at {c}" for c in results.levels)
    return (
        "Reading: both APIs run the same pipeline (policy, limits, audit, routing) into the "
        "same engine and differ only in the adapter that decodes the request and encodes each "
        "token (an NDJSON line per token against an SSE chunk). Tokens/s through Ollama's API "
        f"over OpenAI's, per pair of batches: {at}; {verdict}. The time to the first token through "
        f"Ollama's API was {ttfts} OpenAI's (p50). Order matters too: within a pair, the "
        f"batch that ran second had {order} times the tokens/s of the first, whichever API it "
        "was; the first API alternates, so this weighs on both alike in the medians."
    )


def render(args: argparse.Namespace, results: Results) -> str:
    """The scenario's BENCHMARKS.md section."""
    rounds = results.rounds
    rows = [_row(rounds, api, c) for c in results.levels for api in APIS]
    for c in results.levels:
        rows.append([
            "Ollama / OpenAI", str(c), "", _ratio(rounds, c, "tps").format(".3f"),
            _ratio(rounds, c, "ttft").format(".3f"), "", "",
        ])  # fmt: skip
    table = markdown_table(
        ["API", "Concurrency", "Requests per run", "Tokens/s", "TTFT p50 (s)", "TTFT p95 (s)",
         "Chunks / tokens"],
        rows,
    )  # fmt: skip
    checks = []
    for c in results.levels:
        tps, ttft = _ratio(rounds, c, "tps"), _ratio(rounds, c, "ttft")
        checks.append([f"concurrency {c}: tokens/s, Ollama API / OpenAI API", tps.format(".3f"),
                       f">= {TARGET}", "PASS" if tps.median >= TARGET else "MISS"])  # fmt: skip
        checks.append([f"concurrency {c}: TTFT p50, Ollama API / OpenAI API", ttft.format(".3f"),
                       "—", "(context)"])  # fmt: skip
    parts = ["## Ollama API vs OpenAI API on the same server (llama.cpp, Gemma 3 270M)"]
    if args.quick:
        parts.append(
            "**Smoke run (`--quick`): one run of one pair per concurrency; not a result.**"
        )
    parts += [
        "\n".join(_bullets(args, results)),
        table,
        markdown_table(["Check (per pair of batches)", "Figure", "Target", "Result"], checks),
    ]
    missed = [row[0] for row in checks if row[3] == "MISS"]
    if missed:
        parts.append("Target missed: " + "; ".join(missed) + ".")
    parts.append(_reading(results))
    return "\n\n".join(parts) + "\n"
