"""Soak: mixed streaming load at the saturation point for 30 minutes (``python -m bench.soak``).

``airgate serve`` is started on the llama.cpp engine exactly as the edge scenario starts it
(its options, ``server_env`` and app key; Gemma 3 270M, 8 slots, 2 threads by default). Then
``--concurrency`` client workers (default: one per slot, so every slot is always busy) each loop
until the deadline, sending a seeded random mix of ``/v1/chat/completions`` and
``/v1/completions``, streamed or not, ``max_tokens`` from ``MAX_TOKENS``, temperature 0 or 0.8,
and a distinct prompt of ``PROMPT_WORDS`` words. About ``ABANDON_SHARE`` of the streams are hung
up on by the client after a few chunks: the gateway must cancel them cleanly; they are counted
apart, not as errors. Every other request must answer 200 with usage and exactly ``max_tokens``
completion tokens (the end tokens are banned); anything else is an error, counted by kind (a
worker pauses a second after one, so a broken server is not hammered).

Every ``SAMPLE_EVERY_S`` seconds the server's process tree is sampled from /proc: resident
memory (VmRSS), open file descriptors and threads. The run is cut into ``WINDOWS`` windows
(5 minutes each in 30); the first is the warm-up. After the load: the gateway's /metrics must
show nothing in flight (router, engine, queue) within ``SETTLE_S`` and /ready must answer 200.

Checks: 0 errors; resident memory at the end at most ``RSS_GROWTH_TARGET`` above the sample at
the end of the warm-up; nothing in flight; ready. The p99 drift (last window's p99 / the first
window after the warm-up's) is reported without a target. The exit status is 1 when a check
fails. Not a scenario of ``python -m bench``: a full run (30 minutes or more, or any run with
``--output``) writes the ``soak`` section of BENCHMARKS.md; shorter runs only print.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import shlex
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec

from bench import edge
from bench._client import (
    BenchError,
    chunk_decoder,
    completion_body,
    describe_error,
    has_content,
    synthetic_prompts,
    wait_ready,
)
from bench._report import (
    REPO_ROOT,
    collect_environment,
    cpu_sample,
    default_cache_dir,
    foreign_cpu_share,
    markdown_table,
    percentile,
    redacted_argv,
    say,
    write_section,
)
from bench._serve import create_api_key, free_port, serve_command, spawned, tail
from bench.llama_model import WORDS

NAME = "soak"

FULL_MINUTES = 30.0
WINDOWS = 6  # the first is the warm-up
SAMPLE_EVERY_S = 10.0
MAX_TOKENS = (16, 64, 128)
PROMPT_WORDS = (20, 50, 100, 200, 300)
TEMPERATURES = (0.0, 0.8)
STREAM_SHARE = 0.7
ABANDON_SHARE = 0.05  # of the streams
ABANDON_AFTER = (1, 4)  # content chunks read before hanging up, inclusive range
RSS_GROWTH_TARGET = 0.05
SETTLE_S = 30.0  # for the in-flight gauges to reach 0 after the load
ERROR_PAUSE_S = 1.0
# The gauges that must read 0 once the load has stopped (summed over their label sets).
IDLE_GAUGES = {
    "airgate_router_deployment_inflight": "router in flight",
    "airgate_router_queue_depth": "router queue",
    "vllm:num_requests_running": "engine running",
    "vllm:num_requests_waiting": "engine waiting",
}


# --- the workload -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Planned:
    kind: str  # "chat" or "completion", with " stream" when streamed
    path: str
    body: dict[str, Any]
    max_tokens: int
    abandon_after: int | None  # content chunks to read before hanging up; None: read it all


def plan(rng: random.Random, model: str, prompt_seed: str) -> Planned:
    """One request of the mix; the same ``rng`` state and seed give the same request."""
    chat = rng.random() < 0.5
    stream = rng.random() < STREAM_SHARE
    max_tokens = rng.choice(MAX_TOKENS)
    prompt = synthetic_prompts(prompt_seed, WORDS, rng.choice(PROMPT_WORDS), 1)[0]
    body = completion_body(model, prompt, max_tokens, edge.BANNED_TOKENS)
    body["temperature"] = rng.choice(TEMPERATURES)
    if not stream:
        body["stream"] = False
        del body["stream_options"]  # the gateway refuses it on a plain request, as OpenAI does
    if chat:
        body["messages"] = [{"role": "user", "content": body.pop("prompt")}]
    hang_up = stream and rng.random() < ABANDON_SHARE
    return Planned(
        kind=("chat" if chat else "completion") + (" stream" if stream else ""),
        path="/v1/chat/completions" if chat else "/v1/completions",
        body=body,
        max_tokens=max_tokens,
        abandon_after=rng.randint(*ABANDON_AFTER) if hang_up else None,
    )


class Done(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    kind: str
    end_s: float  # load start -> response complete
    e2e_s: float
    ttft_s: float | None  # streams: request sent -> first content chunk
    prompt_tokens: int
    completion_tokens: int


class Abandoned(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    kind: str
    end_s: float


class Failure(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    kind: str
    end_s: float
    error: str  # its kind: "HTTP 503", "wrong length", "ReadTimeout", ...
    detail: str


Outcome = Done | Abandoned | Failure


class _Failed(Exception):
    def __init__(self, error: str, detail: str) -> None:
        super().__init__(error)
        self.error, self.detail = error, detail


async def _stream(
    client: httpx.AsyncClient, req: Planned, start: float
) -> tuple[int, int, float] | None:
    """(prompt tokens, completion tokens, TTFT) of a stream; None once hung up on purpose."""
    ttft: float | None = None
    tokens: tuple[int, int] | None = None
    chunks = 0
    async with client.stream("POST", req.path, json=req.body) as response:
        if response.status_code != 200:
            error = describe_error(response.status_code, await response.aread())
            raise _Failed(f"HTTP {response.status_code}", error)
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = chunk_decoder.decode(data)
            if chunk.error is not None:
                raise _Failed("error event", chunk.error.message[:200])
            if any(has_content(choice) for choice in chunk.choices):
                chunks += 1
                ttft = time.monotonic() - start if ttft is None else ttft
                if req.abandon_after is not None and chunks >= req.abandon_after:
                    return None  # leaving the block closes the connection mid-stream
            if chunk.usage is not None:
                tokens = (chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
    if tokens is None:
        raise _Failed("no usage", "the stream ended without a usage chunk")
    if ttft is None:
        raise _Failed("no content", "the stream ended without any content")
    return (*tokens, ttft)


async def _post(client: httpx.AsyncClient, req: Planned) -> tuple[int, int]:
    """(prompt tokens, completion tokens) of a plain request."""
    response = await client.post(req.path, json=req.body)
    if response.status_code != 200:
        raise _Failed(
            f"HTTP {response.status_code}",
            describe_error(response.status_code, response.content),
        )
    usage = chunk_decoder.decode(response.content).usage
    if usage is None:
        raise _Failed("no usage", "the response carries no usage")
    return usage.prompt_tokens, usage.completion_tokens


async def send(client: httpx.AsyncClient, req: Planned, t0: float) -> Outcome:
    """Send one request; whatever goes wrong becomes a Failure naming its kind."""
    start = time.monotonic()
    ttft: float | None = None
    try:
        if req.body["stream"]:
            streamed = await _stream(client, req, start)
            if streamed is None:
                return Abandoned(kind=req.kind, end_s=time.monotonic() - t0)
            prompt, completion, ttft = streamed
        else:
            prompt, completion = await _post(client, req)
        if completion != req.max_tokens:
            raise _Failed("wrong length", f"{completion} completion tokens, not {req.max_tokens}")
    except _Failed as exc:
        error, detail = exc.error, exc.detail
    except httpx.HTTPError as exc:
        error, detail = type(exc).__name__, str(exc)[:200]
    except msgspec.DecodeError as exc:
        error, detail = "malformed JSON", str(exc)[:200]
    else:
        end = time.monotonic()
        return Done(
            kind=req.kind,
            end_s=end - t0,
            e2e_s=end - start,
            ttft_s=ttft,
            prompt_tokens=prompt,
            completion_tokens=completion,
        )
    return Failure(kind=req.kind, end_s=time.monotonic() - t0, error=error, detail=detail)


# --- the server's process tree and metrics ------------------------------------------------


class ProcSample(msgspec.Struct, frozen=True, kw_only=True):
    at_s: float  # since the load started
    rss_kib: int
    fds: int
    threads: int
    processes: int


def _tree(root: int) -> list[int]:
    """``root`` and every descendant (from /proc/*/stat parent ids)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue  # exited meanwhile
            ppid = int(stat.rpartition(")")[2].split()[1])  # the name may hold spaces
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _status_int(status: str, field: str) -> int:
    match = re.search(rf"^{field}:\s*(\d+)", status, re.MULTILINE)
    return int(match.group(1)) if match else 0


def sample_tree(root: int, at_s: float) -> ProcSample:
    """Resident memory, open fds and threads summed over ``root``'s process tree."""
    rss = fds = threads = processes = 0
    for pid in _tree(root):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            open_fds = len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            continue
        rss += _status_int(status, "VmRSS")
        threads += _status_int(status, "Threads")
        fds += open_fds
        processes += 1
    return ProcSample(at_s=at_s, rss_kib=rss, fds=fds, threads=threads, processes=processes)


def _peak_rss_kib(pid: int) -> int:
    try:
        return _status_int(Path(f"/proc/{pid}/status").read_text(), "VmHWM")
    except OSError:
        return 0


def metric_sums(text: str) -> dict[str, float]:
    """Prometheus text exposition -> each series' value summed over its label sets."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            name = series.partition("{")[0]
            sums[name] = sums.get(name, 0.0) + float(value)
    return sums


class AfterLoad(msgspec.Struct, frozen=True, kw_only=True):
    metrics_status: int | None  # HTTP status of the last /metrics read
    gauges: dict[str, float]  # IDLE_GAUGES as last read (absent: not exported)
    idle: bool
    settle_s: float  # load end -> every gauge at 0 (or gave up)
    ready_status: int | None


async def _get_status(client: httpx.AsyncClient, path: str) -> tuple[int | None, str]:
    try:
        response = await client.get(path, timeout=10.0)
    except httpx.HTTPError:
        return None, ""
    return response.status_code, response.text


async def after_load(client: httpx.AsyncClient) -> AfterLoad:
    """Wait up to SETTLE_S for the in-flight gauges to read 0; then ask /ready."""
    start = time.monotonic()
    while True:
        status, text = await _get_status(client, "/metrics")
        sums = metric_sums(text) if status == 200 else {}
        gauges = {name: sums[name] for name in IDLE_GAUGES if name in sums}
        idle = len(gauges) == len(IDLE_GAUGES) and not any(gauges.values())
        waited = time.monotonic() - start
        if idle or waited > SETTLE_S:
            break
        await asyncio.sleep(0.5)
    ready, _ = await _get_status(client, "/ready")
    return AfterLoad(
        metrics_status=status, gauges=gauges, idle=idle, settle_s=waited, ready_status=ready
    )


# --- the run ------------------------------------------------------------------------------


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


def _clock(seconds: float) -> str:
    """``m:ss``."""
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}:{rest:02d}"


async def _drive(
    args: argparse.Namespace, base_url: str, api_key: str, pid: int, alive: Callable[[], bool]
) -> SoakResult:
    headers = {"Authorization": f"Bearer {api_key}"}
    timeout = httpx.Timeout(300.0, connect=10.0)
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout) as client:
        ready_s = await wait_ready(client, "/ready", args.ready_timeout, alive)
        planned_s = args.duration * 60
        outcomes: list[Outcome] = []
        samples: list[ProcSample] = []
        stop = asyncio.Event()
        t0 = time.monotonic()

        async def worker(n: int) -> None:
            rng = random.Random(f"soak/{args.seed}/{n}")
            i = 0
            while time.monotonic() - t0 < planned_s and alive():
                outcome = await send(client, plan(rng, args.model, f"soak/{args.seed}/{n}/{i}"), t0)
                outcomes.append(outcome)
                if isinstance(outcome, Failure):
                    await asyncio.sleep(ERROR_PAUSE_S)
                i += 1

        async def sampler() -> None:
            window, shown = planned_s / WINDOWS, 0
            while not stop.is_set():
                samples.append(sample_tree(pid, time.monotonic() - t0))
                if samples[-1].at_s >= (shown + 1) * window - 1e-3 and shown + 1 < WINDOWS:
                    shown += 1
                    errors = sum(isinstance(o, Failure) for o in outcomes)
                    say(
                        f"  {_clock(samples[-1].at_s)}: {len(outcomes)} requests, {errors} errors,"
                        f" RSS {samples[-1].rss_kib / 1024:.0f} MiB"
                    )
                next_at = t0 + len(samples) * SAMPLE_EVERY_S
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(0.0, next_at - time.monotonic()))

        say(f"ready after {ready_s:.1f} s; {args.concurrency} workers for {_clock(planned_s)}")
        async with asyncio.TaskGroup() as group:
            group.create_task(sampler())
            await asyncio.gather(*(worker(n) for n in range(args.concurrency)))
            load_s = time.monotonic() - t0
            stop.set()
        samples.append(sample_tree(pid, load_s))
        after = await after_load(client)
    if not alive():
        raise BenchError("the server exited during the soak")
    return SoakResult(
        planned_s=planned_s,
        load_s=load_s,
        ready_s=ready_s,
        concurrency=args.concurrency,
        outcomes=outcomes,
        samples=samples,
        peak_rss_kib=_peak_rss_kib(pid),
        after=after,
    )


@contextlib.contextmanager
def _gateway(
    args: argparse.Namespace, log_path: Path
) -> Iterator[tuple[int, str, str, Callable[[], bool]]]:
    """``airgate serve`` as the edge scenario starts it: (pid, base URL, app key, alive)."""
    port = free_port()
    data_dir = args.cache_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    command = [*serve_command(), "serve", "--port", str(port), "--data-dir", str(data_dir)]
    command += args.server_arg
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(edge.OWN_ENV_PREFIX)}
    env = {**inherited, **edge.server_env(args)}
    api_key = args.api_key or create_api_key(data_dir, env, args.server_arg, name="bench-soak")
    with spawned(command, env, log_path) as proc:
        yield proc.pid, f"http://127.0.0.1:{port}", api_key, lambda: proc.poll() is None


def run(args: argparse.Namespace) -> SoakResult:
    """Start the server, soak it, stop it; per-request results go to the logs directory."""
    logs = args.cache_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / "soak-server.log"
    log.write_bytes(b"")  # this invocation's output only
    before = cpu_sample()
    with _gateway(args, log) as (pid, base_url, api_key, alive):
        try:
            result = asyncio.run(_drive(args, base_url, api_key, pid, alive))
        except BenchError as exc:
            raise BenchError(f"{exc}\n--- last lines of {log} ---\n{tail(log)}") from exc
    # The server has exited and been reaped: its CPU time now counts as ours.
    result = msgspec.structs.replace(result, foreign_share=foreign_cpu_share(before, cpu_sample()))
    dump = logs / "soak-results.json"
    dump.write_bytes(msgspec.json.encode(result))
    say(f"per-request results and samples: {dump}")
    return result


# --- the report ---------------------------------------------------------------------------


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
        label = f"{_clock(i * width)}–{_clock((i + 1) * width)}" + (" (warm-up)" if i == 0 else "")
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
        ["Server process tree", "Start", f"End of warm-up ({_clock(warm.at_s)})", "End", "Max"],
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
        rows.append([error, kind, message, str(n), _clock(one.end_s)])
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
    engine_env = " ".join(f"{k}={shlex.quote(v)}" for k, v in edge.server_env(args).items())
    extra_args = f" {shlex.join(args.server_arg)}" if args.server_arg else ""
    env = collect_environment(args.command, ["airgate", "llama-cpp-python", "httpx"])
    max_tokens, temperatures = "/".join(map(str, MAX_TOKENS)), "/".join(map(str, TEMPERATURES))
    return [
        env.markdown(),
        f"- Workload: {result.concurrency} client workers, each looping until the deadline "
        f"(every engine slot busy); a seeded (`--seed {args.seed}`) mix of "
        f"`/v1/chat/completions` and `/v1/completions` (half each), {STREAM_SHARE:.0%} "
        f"streamed, max_tokens {max_tokens}, temperature {temperatures}, end tokens "
        f"{', '.join(map(str, edge.BANNED_TOKENS))} banned (every answer is checked to carry "
        f"exactly max_tokens); distinct prompts of {min(PROMPT_WORDS)}-"
        f"{max(PROMPT_WORDS)} words ({min(prompts)}-{max(prompts)} prompt tokens); "
        f"{ABANDON_SHARE:.0%} of the streams hung up on by the client after "
        f"{ABANDON_AFTER[0]}-{ABANDON_AFTER[1]} chunks.",
        f"- Gateway: Gemma 3 270M Q4_K_M GGUF on `airgate serve{extra_args}` with "
        f"{engine_env or 'its default settings'}; time to `/ready`: {result.ready_s:.1f} s.",
        f"- Load for {_clock(planned)} (m:ss) in {WINDOWS} windows of {_clock(width)}, the first "
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
    parts = [f"## Soak: {_clock(planned)} of mixed streaming load at saturation (llama.cpp)"]
    if planned < FULL_MINUTES * 60:
        parts.append(f"**Shortened run (`--duration {args.duration:g}`): not a result.**")
    parts += ["\n".join(_bullets(args, result, done)), by_kind]
    parts += [_window_table(windows, width), _process_table(result.samples, warm)]
    if failures:
        parts.append(_error_table(failures))
    parts.append(markdown_table(["Check", "Figure", "Target", "Result"], checks))
    return "\n\n".join(parts) + "\n", all(row[3] != "FAIL" for row in checks)


# --- command line -------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description="mixed streaming load at saturation against airgate serve (llama.cpp)",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=FULL_MINUTES,
        metavar="MIN",
        help=f"minutes of load (default {FULL_MINUTES:g}; shorter runs only print)",
    )
    parser.add_argument(
        "--concurrency", type=int, help="client workers (default: --slots, every slot busy)"
    )
    parser.add_argument("--seed", default="0", help="seed of the request mix (default 0)")
    parser.add_argument(
        "--output",
        type=Path,
        help=f"file to write the {NAME} section into (default BENCHMARKS.md at the repo root "
        f"after a run of {FULL_MINUTES:g} minutes or more; shorter: print only)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=default_cache_dir(),
        help="server data dir and logs (default ~/.cache/airgate/bench)",
    )
    edge.add_arguments(parser)  # the server's options: --slots, --threads, --api-key, ...
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    args.concurrency = args.concurrency or args.slots
    if args.duration <= 0 or args.concurrency < 1:
        print("bench.soak: --duration and --concurrency must be positive", file=sys.stderr)
        return 2
    args.command = shlex.join(["python", "-m", "bench.soak", *redacted_argv(argv)])
    try:
        result = run(args)
    except BenchError as exc:
        print(f"bench.soak: {exc}", file=sys.stderr)
        return 1
    body, passed = render(args, result)
    print(body)
    output: Path | None = args.output
    if output is None and args.duration >= FULL_MINUTES:
        output = REPO_ROOT / "BENCHMARKS.md"
    if output is not None:
        write_section(output, NAME, body)
        say(f"bench.soak: wrote the {NAME} section of {output}")
    if not passed:
        say("bench.soak: a check failed (see the table)")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
