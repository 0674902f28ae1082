"""Scenario "ollama_api": streamed chat through Ollama's API against the same through OpenAI's,
on one airgate server (the same pipeline, the same llama.cpp engine).

airgate serves Gemma 3 270M as the edge scenario starts it (``airgate serve`` with
``--threads`` and ``--slots``, otherwise its default configuration; an app key). In each run
(``--runs``; one in ``--quick``) the server starts afresh and answers a warm-up prompt three
ways (the official ``ollama`` AsyncClient, then each API through httpx: the same token count
each time). Then, at concurrency 1 and 8, ``--ollama-api-pairs`` pairs of batches (one in
``--quick``): the same prompts once through ``/api/chat`` (NDJSON, ``options.num_predict``) and
once through ``/v1/chat/completions`` (SSE, ``max_tokens``), temperature 0, one seed; the API
that goes first alternates from pair to pair and from run to run, so drift and neighbours'
load hit both alike (``bench.ollama_api_stream``).

Target (``bench.ollama_api_report``): aggregate tokens/s through Ollama's API at least 0.97x
OpenAI's at each concurrency, the ratio taken per pair of batches; the TTFT ratio is reported
beside it. A run during which other processes used more than ``--max-foreign-load`` of the CPUs
is discarded and repeated (on a shared machine, ``--max-foreign-load 1`` keeps every run: the
interleaving spreads the disturbance over both APIs).
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import time
from typing import Any

import httpx
import msgspec

from bench._check import airgate_args, importable, shown
from bench._client import BenchError, LoadError, synthetic_prompts, wait_ready
from bench._report import cpu_sample, foreign_cpu_share, say
from bench._runs import add_run_options, quiet_runs
from bench._serve import run_served
from bench.edge_servers import Launch, gateway_launch
from bench.llama_model import WORDS
from bench.ollama_api_report import Results, Round, render, tokens_per_s
from bench.ollama_api_stream import APIS, Api, Batch, body, run_batch

NAME = "ollama_api"
LEVELS = (1, 8)
SEED = 1234
_KEY_NAME = "bench-ollama-api"
_LOG = "ollama-api-airgate.log"
# Asked of the base model, a list goes on: every request ran to the token limit (64 and 128
# tried), which matters because Ollama has no logit_bias to ban the end tokens with.
_ASK = "Continue this list of words with many more words, one per line:\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "ollama_api scenario (also: --threads, --slots, --model, --api-key, --server-env, "
        "--server-arg of edge)"
    )
    group.add_argument(
        "--ollama-api-pairs",
        type=int,
        default=2,
        metavar="N",
        help="pairs of batches (one per API) per concurrency and run (default 2; --quick 1)",
    )
    group.add_argument(
        "--ollama-api-max-tokens",
        type=int,
        default=64,
        metavar="N",
        help="options.num_predict / max_tokens of every request (default 64)",
    )
    group.add_argument(
        "--ollama-api-prompt-words",
        type=int,
        default=60,
        metavar="N",
        help="random words in each prompt (default 60)",
    )
    add_run_options(group)


def _requests(level: int, quick: bool) -> int:
    """Requests per batch: one wave at concurrency 8, two one after the other at 1."""
    return max(2, level)


def _prompts(args: argparse.Namespace, attempt: int, level: int, pair: int) -> list[str]:
    words = synthetic_prompts(
        f"ollama_api/{attempt}/{level}/{pair}", WORDS, args.ollama_api_prompt_words,
        _requests(level, args.quick),
    )  # fmt: skip
    return [_ASK + w for w in words]


def _bodies(args: argparse.Namespace, api: Api, prompts: list[str]) -> list[dict[str, Any]]:
    return [body(api, args.model, p, args.ollama_api_max_tokens, SEED) for p in prompts]


async def _official(launch: Launch, args: argparse.Namespace, prompt: str) -> int:
    """The warm-up prompt through the official ``ollama`` AsyncClient: its eval_count."""
    ollama = importlib.import_module("ollama")
    client = ollama.AsyncClient(host=launch.base_url, headers=launch.headers)
    options = {"num_predict": args.ollama_api_max_tokens, "temperature": 0, "seed": SEED}
    count: int | None = None
    try:
        stream = await client.chat(model=args.model, messages=[{"role": "user", "content": prompt}],
                                   options=options, stream=True)  # fmt: skip
        async for part in stream:
            if part.done:
                count = part.eval_count
    except ollama.ResponseError as exc:
        raise LoadError(f"ollama client: HTTP {exc.status_code}", exc.status_code) from exc
    if count is None:
        raise LoadError("ollama client: the stream ended without its final line")
    return int(count)


async def _warm_up(client: httpx.AsyncClient, launch: Launch, args: argparse.Namespace,
                   attempt: int) -> int:  # fmt: skip
    prompt = _prompts(args, attempt, 0, -1)[0]
    counts = {"ollama client": await _official(launch, args, prompt)}
    for api in APIS:
        batch = await run_batch(client, api, _bodies(args, api, [prompt]), 1)
        counts[api] = batch.tokens
    if len(set(counts.values())) != 1:
        raise LoadError(f"the warm-up prompt's tokens differ: {counts}")
    return counts["ollama client"]


def _round(args: argparse.Namespace, attempt: int, pairs: int) -> Round:
    """One server start: the warm-up, then at each level ``pairs`` pairs of batches."""
    launch = gateway_launch(args, key_name=_KEY_NAME)

    async def drive(proc: subprocess.Popen[bytes]) -> Round:
        async with httpx.AsyncClient(
            base_url=launch.base_url,
            headers=launch.headers,
            timeout=httpx.Timeout(900.0, connect=10.0),
            limits=httpx.Limits(max_connections=max(LEVELS) + 4),
        ) as client:
            alive = lambda: proc.poll() is None  # noqa: E731
            ready_s = await wait_ready(client, launch.ready_path, args.ready_timeout, alive)
            warm = await _warm_up(client, launch, args, attempt)
            batches: list[Batch] = []
            for step, level in enumerate(LEVELS):
                for pair in range(pairs):
                    prompts = _prompts(args, attempt, level, pair)
                    first = (attempt + step + pair) % 2
                    done = {}
                    for api in (APIS[first], APIS[1 - first]):
                        done[api] = await run_batch(client, api, _bodies(args, api, prompts), level)
                        batches.append(done[api])
                    say(
                        f"  concurrency {level}, pair {pair + 1}: Ollama "
                        f"{done['ollama'].tokens_per_s:.1f} tok/s, OpenAI "
                        f"{done['openai'].tokens_per_s:.1f} tok/s ({APIS[first]} first)"
                    )
        return Round(ready_s=ready_s, warmup_tokens=warm, batches=batches, foreign_share=0.0)

    before = cpu_sample()
    log = args.cache_dir / "logs" / _LOG
    result = run_served(launch.name, launch.command, launch.env, log, drive)
    return msgspec.structs.replace(result, foreign_share=foreign_cpu_share(before, cpu_sample()))


def _pairs(args: argparse.Namespace) -> int:
    pairs = 1 if args.quick else args.ollama_api_pairs
    if min(pairs, args.ollama_api_max_tokens, args.ollama_api_prompt_words) < 1:
        raise BenchError("--ollama-api-pairs, --ollama-api-max-tokens and "
                         "--ollama-api-prompt-words must be at least 1")  # fmt: skip
    if not args.no_engine_env and args.slots < max(LEVELS):
        raise BenchError(f"--slots must be at least {max(LEVELS)}: requests would queue")
    return pairs


def run(args: argparse.Namespace) -> str:
    """Run the scenario; returns the markdown body of its BENCHMARKS.md section."""
    pairs = _pairs(args)
    logs = args.cache_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / _LOG).write_bytes(b"")  # this invocation's output only
    runs = 1 if args.quick else args.runs

    def one_run(done: int, attempt: int) -> Round:
        say(f"ollama_api: run {done + 1}/{runs} (airgate started afresh)")
        r = _round(args, attempt, pairs)
        for level in LEVELS:
            o, a = (tokens_per_s([b for b in r.batches if b.api == api and b.concurrency == level])
                    for api in APIS)  # fmt: skip
            say(f"  concurrency {level}: Ollama / OpenAI tokens/s {o / a:.3f}")
        return r

    start = time.monotonic()
    rounds, discarded = quiet_runs(runs, args.max_foreign_load, one_run)
    results = Results(max_tokens=args.ollama_api_max_tokens, levels=list(LEVELS), pairs=pairs,
                      requests={c: _requests(c, args.quick) for c in LEVELS}, rounds=rounds,
                      discarded=discarded)  # fmt: skip
    dump = logs / "ollama-api-results.json"
    dump.write_bytes(msgspec.json.encode(results))
    say(f"ollama_api: {time.monotonic() - start:.0f} s; per-request results: {dump}")
    return render(args, results)


def check(args: argparse.Namespace) -> str:
    """Set-up only (``--check``): airgate's launch as a run builds it (an app key created in its
    data dir, its command line parsed by airgate's CLI) and every request body, decoded by the
    gateway's own decoders of both APIs."""
    pairs = _pairs(args)
    lines = [importable(["ollama:AsyncClient", "gateway.ollama.types:ChatRequest"])]
    launch = gateway_launch(args, key_name=_KEY_NAME)
    lines.append(
        f"airgate: {shown(launch.command)} parsed as `airgate {airgate_args(launch.command)}`; "
        + ("the --api-key given" if args.api_key else "an app key created in its data dir")
    )
    from gateway.errors import GatewayError
    from gateway.ollama.options import mapped
    from gateway.ollama.types import ChatRequest
    from gateway.openai.types import ChatCompletionRequest

    shapes: dict[Api, Any] = {"ollama": ChatRequest, "openai": ChatCompletionRequest}
    count = 0
    try:
        for level in (0, *LEVELS):
            for pair in (-1,) if level == 0 else range(pairs):
                for api in APIS:
                    for one in _bodies(args, api, _prompts(args, 0, level, pair)):
                        decoded = msgspec.convert(one, shapes[api])
                        if api == "ollama":
                            mapped(decoded.options, stream=True)  # a 400 on a refused option
                        count += 1
    except (msgspec.ValidationError, GatewayError) as exc:
        raise BenchError(f"airgate would refuse a request body: {exc}") from exc
    lines.append(
        f"{count} request bodies per run, decoded as airgate's ChatRequest (Ollama) and "
        f"ChatCompletionRequest (OpenAI), for model {args.model!r} at concurrency "
        f"{', '.join(map(str, LEVELS))} ({args.ollama_api_max_tokens} tokens each)"
    )
    return "\n".join([f"## {NAME}: set-up checked, nothing started", *(f"- {x}" for x in lines)])
