"""The soak's report: the record of the run and the ``soak`` section of BENCHMARKS.md.

The run is cut into ``WINDOWS`` windows (5 minutes each in 30); the first is the warm-up.
Checks: 0 errors; resident memory at the end at most ``RSS_GROWTH_TARGET`` above the sample at
the end of the warm-up; nothing in flight after the load; ready. The p99 drift (last window's p99
/ the first window after the warm-up's) is reported without a target.
"""

from __future__ import annotations

import argparse
import shlex
from collections import Counter
from collections.abc import Callable, Sequence

import msgspec

from bench._report import collect_environment, markdown_table, percentile
from bench.edge_servers import server_env
from bench.edge_workload import BANNED_TOKENS
from bench.soak_probes import IDLE_GAUGES, SAMPLE_EVERY_S, SETTLE_S, AfterLoad, ProcSample
from bench.soak_requests import (
    ABANDON_AFTER,
    ABANDON_SHARE,
    MAX_TOKENS,
    PROMPT_WORDS,
    STREAM_SHARE,
    TEMPERATURES,
    Abandoned,
    Done,
    Failure,
    Outcome,
)

__all__ = ["FULL_MINUTES", "WINDOWS", "SoakResult", "clock", "render"]

FULL_MINUTES = 30.0
WINDOWS = 6  # the first is the warm-up
RSS_GROWTH_TARGET = 0.05


class SoakResult(msgspec.Struct, frozen=True, kw_only=True):
    planned_s: float
    load_s: float  # load start -> the last request ended
    ready_s: float
    concurrency: int
    outcomes: list[Outcome]
    samples: list[ProcSample]  # every SAMPLE_EVERY_S, and one when the last request ended
    peak_rss_kib: int  # the server process's VmHWM after the load
    after: AfterLoad
    foreign_share: float = 0.0  # of all CPUs, used by other processes during the run


def clock(seconds: float) -> str:
    """``m:ss``."""
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}:{rest:02d}"


def _pct(values: Sequence[float], q: float) -> str:
    return f"{percentile(values, q):.2f}" if values else "-"


def _check(label: str, figure: str, target: str = "-", ok: bool | None = None) -> list[str]:
    """A row of the checks table; without ``ok``, a figure reported without a target."""
    return [label, figure, target, "-" if ok is None else "PASS" if ok else "FAIL"]


def _windows(done: Sequence[Done], planned_s: float) -> list[list[Done]]:
    """The requests that ended in each window (those that ended after the deadline in none)."""
    width = planned_s / WINDOWS
    return [[d for d in done if i * width <= d.end_s < (i + 1) * width] for i in range(WINDOWS)]


def _e2e(done: Sequence[Done]) -> list[float]:
    return [d.e2e_s for d in done]


def _ttft(done: Sequence[Done]) -> list[float]:
    return [d.ttft_s for d in done if d.ttft_s is not None]


def _drift(first: Sequence[float], last: Sequence[float]) -> str:
    """p99 of ``last`` / p99 of ``first``."""
    return f"{percentile(last, 99) / percentile(first, 99):.2f}" if first and last else "-"


def _window_table(windows: Sequence[Sequence[Done]], width: float) -> str:
    rows = []
    for i, w in enumerate(windows):
        label = f"{clock(i * width)}–{clock((i + 1) * width)}" + (" (warm-up)" if i == 0 else "")
        tokens_per_s = sum(d.completion_tokens for d in w) / width
        rows.append(
            [
                label,
                str(len(w)),
                f"{tokens_per_s:.1f}",
                _pct(_e2e(w), 50),
                _pct(_e2e(w), 99),
                _pct(_ttft(w), 50),
                _pct(_ttft(w), 99),
            ]
        )
    headers = ["Window (m:ss)", "Requests", "Tokens/s", "E2E p50 (s)", "E2E p99 (s)"]
    return markdown_table([*headers, "TTFT p50 (s)", "TTFT p99 (s)"], rows)


def _process_table(samples: Sequence[ProcSample], warm: ProcSample) -> str:
    first, end = samples[0], samples[-1]

    def row(label: str, read: Callable[[ProcSample], float], spec: str) -> list[str]:
        figures = [read(s) for s in (first, warm, end)] + [max(read(s) for s in samples)]
        return [label, *(format(f, spec) for f in figures)]

    return markdown_table(
        ["Server process tree", "Start", f"End of warm-up ({clock(warm.at_s)})", "End", "Max"],
        [
            row("resident memory (MiB)", lambda s: s.rss_kib / 1024, ".1f"),
            row("open file descriptors", lambda s: s.fds, "d"),
            row("threads", lambda s: s.threads, "d"),
        ],
    )


def _error_table(failures: Sequence[Failure]) -> str:
    """Errors by kind and request kind, with the first one's time and message."""
    first: dict[tuple[str, str], Failure] = {}
    for f in failures:
        first.setdefault((f.error, f.kind), f)
    rows = []
    for (error, kind), n in Counter((f.error, f.kind) for f in failures).most_common():
        one = first[error, kind]
        message = one.detail.replace("|", "/").replace("\n", " ")
        rows.append([error, kind, message, str(n), clock(one.end_s)])
    return markdown_table(["Error", "Request", "First message", "Count", "First at"], rows, 3)


def _checks(
    failures: int, growth: float, after: AfterLoad, windows: Sequence[Sequence[Done]]
) -> list[list[str]]:
    gauges = " / ".join(
        f"{after.gauges[name]:g}" if name in after.gauges else "absent" for name in IDLE_GAUGES
    )
    in_flight = f"{gauges} after {after.settle_s:.1f} s"
    if after.metrics_status != 200:
        in_flight = f"/metrics answered {after.metrics_status or 'nothing'}"
    after_warm_up, last = windows[1], windows[-1]
    growth_target = f"< {RSS_GROWTH_TARGET:.0%}"
    return [
        _check(
            "errors (every request but the abandoned streams)", str(failures), "0", not failures
        ),
        _check(
            "resident memory, end of warm-up -> end",
            f"{growth:+.1%}",
            growth_target,
            growth < RSS_GROWTH_TARGET,
        ),
        _check(
            f"in flight after the load ({' / '.join(IDLE_GAUGES.values())})",
            in_flight,
            f"0 within {SETTLE_S:.0f} s",
            after.idle,
        ),
        _check(
            "/ready after the load",
            str(after.ready_status or "no answer"),
            "200",
            after.ready_status == 200,
        ),
        _check(
            "E2E p99 drift, last window / first after the warm-up",
            _drift(_e2e(after_warm_up), _e2e(last)),
        ),
        _check(
            "TTFT p99 drift, last window / first after the warm-up",
            _drift(_ttft(after_warm_up), _ttft(last)),
        ),
    ]


def _bullets(args: argparse.Namespace, result: SoakResult, done: Sequence[Done]) -> list[str]:
    planned, width = result.planned_s, result.planned_s / WINDOWS
    tokens = sum(d.completion_tokens for d in done)
    prompts = [d.prompt_tokens for d in done] or [0]
    engine_env = " ".join(f"{k}={shlex.quote(v)}" for k, v in server_env(args).items())
    extra_args = f" {shlex.join(args.server_arg)}" if args.server_arg else ""
    env = collect_environment(args.command, ["airgate", "llama-cpp-python", "httpx"])
    max_tokens, temperatures = "/".join(map(str, MAX_TOKENS)), "/".join(map(str, TEMPERATURES))
    return [
        env.markdown(),
        f"- Workload: {result.concurrency} client workers, each looping until the deadline "
        f"(every engine slot busy); a seeded (`--seed {args.seed}`) mix of "
        f"`/v1/chat/completions` and `/v1/completions` (half each), {STREAM_SHARE:.0%} "
        f"streamed, max_tokens {max_tokens}, temperature {temperatures}, end tokens "
        f"{', '.join(map(str, BANNED_TOKENS))} banned (every answer is checked to carry "
        f"exactly max_tokens); distinct prompts of {min(PROMPT_WORDS)}-"
        f"{max(PROMPT_WORDS)} words ({min(prompts)}-{max(prompts)} prompt tokens); "
        f"{ABANDON_SHARE:.0%} of the streams hung up on by the client after "
        f"{ABANDON_AFTER[0]}-{ABANDON_AFTER[1]} chunks.",
        f"- Gateway: Gemma 3 270M Q4_K_M GGUF on `airgate serve{extra_args}` with "
        f"{engine_env or 'its default settings'}; time to `/ready`: {result.ready_s:.1f} s.",
        f"- Load for {clock(planned)} (m:ss) in {WINDOWS} windows of {clock(width)}, the first "
        f"the warm-up: {tokens} tokens, {tokens / result.load_s:.1f} tokens/s overall. A request "
        "counts in the window in which it ended, with all its tokens; "
        f"{sum(d.end_s >= planned for d in done)} ended after the deadline (in the totals only); "
        "abandoned streams count no tokens.",
        f"- Server process tree ({result.samples[0].processes} process(es)) sampled from /proc "
        f"every {SAMPLE_EVERY_S:.0f} s; its peak resident memory (VmHWM): "
        f"{result.peak_rss_kib / 1024:.1f} MiB. Other processes used {result.foreign_share:.0%} "
        "of the CPUs during the run"
        + (
            f" (more than {args.max_foreign_load:.0%}: the latencies suffered from it)."
            if result.foreign_share > args.max_foreign_load
            else "."
        ),
    ]


def render(args: argparse.Namespace, result: SoakResult) -> tuple[str, bool]:
    """The ``soak`` section of BENCHMARKS.md, and whether every check passed."""
    done = [o for o in result.outcomes if isinstance(o, Done)]
    abandoned = [o for o in result.outcomes if isinstance(o, Abandoned)]
    failures = [o for o in result.outcomes if isinstance(o, Failure)]
    planned, width = result.planned_s, result.planned_s / WINDOWS
    counts = [Counter(o.kind for o in group) for group in (done, abandoned, failures)]
    kinds = ["chat stream", "chat", "completion stream", "completion"]
    by_kind = markdown_table(
        ["Request", "Completed", "Abandoned by the client", "Errors"],
        [[k, *(str(c[k]) for c in counts)] for k in kinds]
        + [["all", *(str(c.total()) for c in counts)]],
    )
    windows = _windows(done, planned)
    warm = min(result.samples, key=lambda s: (abs(s.at_s - width), -s.at_s))
    end_kib = result.samples[-1].rss_kib
    growth = end_kib / warm.rss_kib - 1 if warm.rss_kib else float("inf")
    checks = _checks(len(failures), growth, result.after, windows)
    parts = [f"## Soak: {clock(planned)} of mixed streaming load at saturation (llama.cpp)"]
    if planned < FULL_MINUTES * 60:
        parts.append(f"**Shortened run (`--duration {args.duration:g}`): not a result.**")
    parts += ["\n".join(_bullets(args, result, done)), by_kind]
    parts += [_window_table(windows, width), _process_table(result.samples, warm)]
    if failures:
        parts.append(_error_table(failures))
    parts.append(markdown_table(["Check", "Figure", "Target", "Result"], checks))
    return "\n\n".join(parts) + "\n", all(row[3] != "FAIL" for row in checks)
