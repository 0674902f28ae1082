"""The choices scenario's record and its BENCHMARKS.md section.

Target: the aggregate completion tokens/s of one ``n=4`` request at least 1.2x that of four
concurrent ``n=1`` requests of the same prompt (per pair of back-to-back runs, then the median
over pairs): the ``n=4`` request prefills its prompt once, the four requests four times. Times to
the first token are reported beside it, with no target.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Sequence

import msgspec

from bench._report import Spread, collect_environment, markdown_table
from bench.choices_stream import ModeResult
from bench.edge_servers import server_env
from bench.edge_workload import BANNED_TOKENS

__all__ = ["Results", "Round", "render"]

TARGET = 1.2
_DISTRIBUTIONS = ("airgate", "llama-cpp-python", "httpx")


class Round(msgspec.Struct, frozen=True, kw_only=True):
    """One server start: a warm-up, then pairs of runs (``n`` and ``separate``), the one that
    goes first alternating."""

    ready_s: float
    pairs: list[tuple[ModeResult, ModeResult]]  # (n, separate), whichever ran first
    firsts: list[str]  # the mode that ran first in each pair
    foreign_share: float


class Results(msgspec.Struct, kw_only=True):
    choices: int
    max_tokens: int
    prompt_words: int
    rounds: list[Round] = []
    discarded: int = 0


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def _runs(rounds: Sequence[Round], n: bool) -> list[ModeResult]:
    return [pair[0 if n else 1] for r in rounds for pair in r.pairs]


def _row(label: str, runs: Sequence[ModeResult]) -> list[str]:
    return [
        label, str(len(runs)), str(runs[0].completion_tokens),
        Spread.of(r.tokens_per_s for r in runs).format(".1f"),
        Spread.of(min(r.ttfts_s) for r in runs).format(".2f"),
        Spread.of(max(r.ttfts_s) for r in runs).format(".2f"),
        Spread.of(r.wall_s for r in runs).format(".2f"),
    ]  # fmt: skip


def _bullets(args: argparse.Namespace, results: Results) -> list[str]:
    env = collect_environment(args.command, _DISTRIBUTIONS)
    rounds = results.rounds
    k, m = results.choices, results.max_tokens
    prompts = sorted({r.prompt_tokens for r in _runs(rounds, True)})
    prompt_tokens = "-".join(map(str, sorted({prompts[0], prompts[-1]})))
    engine_env = " ".join(f"{key}={value}" for key, value in server_env(args).items())
    orders = "; ".join(", ".join(f"{first} first" for first in r.firsts) for r in rounds)
    shares = [r.foreign_share for r in rounds]
    pairs = sum(len(r.pairs) for r in rounds)
    return [
        env.markdown(),
        f"- airgate: `airgate serve` with {engine_env or 'its defaults'} (Gemma 3 270M Q4_K_M "
        "on its in-process llama.cpp engine), an app key on every request; started afresh "
        f"for each round (start to ready {Spread.of(r.ready_s for r in rounds).format('.1f')} "
        "s), then one warm-up request of each shape.",
        f"- Workload: streamed `/v1/chat/completions` of one prompt ({results.prompt_words} "
        f"random common words, {prompt_tokens} prompt tokens with the chat template), "
        f"temperature 1, {m} completion tokens per choice (end tokens "
        f"{', '.join(map(str, BANNED_TOKENS))} banned with logit_bias -100; the usage is "
        f"checked to be {k} x {m}). `n={k}`: one request, `seed` s. Separate: {k} requests "
        f"with `n=1` sent at once, seeds s to s+{k - 1}. A fresh prompt for every pair, the "
        "same for both shapes of the pair.",
        f"- Tokens/s = completion tokens of all {k} choices / wall time from the first request "
        "sent to the last stream ended. TTFT = time to a choice's first non-empty content "
        "delta: of the first choice to get one, and of the last.",
        f"- {_count(len(rounds), 'round')} of {_count(len(rounds[0].pairs), 'pair')} "
        f"({orders}); {_count(pairs, 'pair')} in all. Figures: median (min–max) over the runs; the "
        "ratio is taken per pair.",
        f"- The machine's {os.cpu_count()} cores are shared by the engine and the load "
        f"generator. Other processes used at most {max(shares, default=0):.0%} of the CPUs "
        f"during a round (median {statistics.median(shares):.0%}); "
        f"{_count(results.discarded, 'round')} discarded and repeated for exceeding "
        f"{args.max_foreign_load:.0%}.",
    ]


def render(args: argparse.Namespace, results: Results) -> str:
    """The scenario's BENCHMARKS.md section."""
    k = results.choices
    n_runs, sep_runs = _runs(results.rounds, True), _runs(results.rounds, False)
    ratio = Spread.of(
        n.tokens_per_s / s.tokens_per_s for n, s in zip(n_runs, sep_runs, strict=True)
    )
    ttft = Spread.of(max(n.ttfts_s) / max(s.ttfts_s) for n, s in zip(n_runs, sep_runs, strict=True))
    rows = [
        _row(f"one request, n={k}", n_runs),
        _row(f"{k} requests at once, n=1 each", sep_runs),
        [f"n={k} / {k} requests", "", "", ratio.format(".2f"), "", ttft.format(".2f"), ""],
    ]
    table = markdown_table(
        ["Shape", "Runs", "Completion tokens", "Tokens/s", "TTFT first choice (s)",
         "TTFT last choice (s)", "Wall (s)"],
        rows,
    )  # fmt: skip
    checks = [
        [f"aggregate tokens/s, one n={k} request / {k} concurrent requests", ratio.format(".2f"),
         f">= {TARGET}", "PASS" if ratio.median >= TARGET else "MISS"],
        [f"TTFT of the last choice, n={k} / {k} requests", ttft.format(".2f"), "—",
         "(context)"],
    ]  # fmt: skip
    parts = [f"## Choices: one n={k} request against {k} concurrent requests (llama.cpp)"]
    if args.quick:
        parts.append("**Smoke run (`--quick`): one round of one pair; not a result.**")
    parts.append("\n".join(_bullets(args, results)))
    parts.append(table)
    parts.append(markdown_table(["Check", "Figure", "Target", "Result"], checks))
    if ratio.median < TARGET:
        parts.append(f"Target missed: {checks[0][0]}.")
    return "\n\n".join(parts) + "\n"
