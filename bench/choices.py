"""Scenario "choices": ``n > 1`` on airgate's llama.cpp engine, where the choices share one
prefill, against the same number of separate concurrent requests.

airgate serves Gemma 3 270M (``airgate serve``, as the edge scenario starts it: ``--threads``,
``--slots``, an app key). In each round (``--runs``; one in ``--quick``) the server starts
afresh, answers one warm-up request of each shape, then runs ``--choices-pairs`` pairs
(one in ``--quick``): the same prompt of ``--choices-prompt-words`` words (a few hundred tokens,
so the prefill counts) once as one streamed ``n=4`` chat request and once as four streamed
``n=1`` requests sent together, the shape that goes first alternating. Temperature 1 with seeds,
``--choices-max-tokens`` tokens per choice, the end tokens banned (``bench.choices_stream``).

Target (``bench.choices_report``): aggregate completion tokens/s of the ``n=4`` request at
least 1.2x the four requests'. TTFT of the first and the last choice is reported for both. A
round during which other processes used more than ``--max-foreign-load`` of the CPUs is
discarded and repeated.
"""

from __future__ import annotations

import argparse
import subprocess
import time
from typing import Any

import httpx
import msgspec

from bench._check import airgate_args, shown
from bench._client import BenchError, LoadError, describe_error, synthetic_prompts, wait_ready
from bench._report import cpu_sample, foreign_cpu_share, say
from bench._runs import add_run_options, quiet_runs
from bench._serve import run_served
from bench.choices_report import Results, Round, render
from bench.choices_stream import CHAT_PATH, Mode, ModeResult, chat_body, run_mode
from bench.edge_servers import Launch, gateway_launch
from bench.llama_model import WORDS

NAME = "choices"
CHOICES = 4
SEED = 1000
_KEY_NAME = "bench-choices"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "choices scenario (also: --threads, --slots, --model, --api-key, --server-env, "
        "--server-arg of edge)"
    )
    group.add_argument(
        "--choices-pairs",
        type=int,
        default=2,
        metavar="N",
        help="pairs of runs (n=4, then 4 requests, or the reverse) per round (default 2; "
        "--quick 1); rounds: --runs",
    )
    group.add_argument(
        "--choices-max-tokens",
        type=int,
        default=64,
        metavar="N",
        help="completion tokens per choice (default 64)",
    )
    group.add_argument(
        "--choices-prompt-words",
        type=int,
        default=300,
        metavar="N",
        help="words of the prompt (default 300: about 310 Gemma tokens)",
    )
    add_run_options(group)


def _prompt(attempt: int, pair: int, words: int) -> str:
    return synthetic_prompts(f"choices/{attempt}/{pair}", WORDS, words, 1)[0]


async def _warm_up(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
    try:
        response = await client.post(CHAT_PATH, json=body)
    except httpx.HTTPError as exc:
        raise LoadError(f"warm-up: {type(exc).__name__}: {exc}") from exc
    if response.status_code != 200:
        raise LoadError(
            f"warm-up: {describe_error(response.status_code, response.content)}",
            response.status_code,
        )


def _round(args: argparse.Namespace, attempt: int, pairs: int) -> Round:
    """One server start: warm-ups, then ``pairs`` pairs of runs."""
    launch: Launch = gateway_launch(args, key_name=_KEY_NAME)
    log = args.cache_dir / "logs" / "choices-airgate.log"
    max_tokens = args.choices_max_tokens

    async def drive(proc: subprocess.Popen[bytes]) -> Round:
        async with httpx.AsyncClient(
            base_url=launch.base_url,
            headers=launch.headers,
            timeout=httpx.Timeout(600.0, connect=10.0),
            limits=httpx.Limits(max_connections=CHOICES + 2),
        ) as client:
            alive = lambda: proc.poll() is None  # noqa: E731
            ready_s = await wait_ready(client, launch.ready_path, args.ready_timeout, alive)
            warm = _prompt(attempt, -1, args.choices_prompt_words)
            for n in (CHOICES, 1):
                await _warm_up(client, chat_body(args.model, warm, 16, SEED, n, stream=False))
            done: list[tuple[ModeResult, ModeResult]] = []
            firsts: list[str] = []
            for pair in range(pairs):
                prompt = _prompt(attempt, pair, args.choices_prompt_words)
                order: tuple[Mode, Mode] = ("n", "separate") if pair % 2 == 0 else ("separate", "n")
                got: dict[str, ModeResult] = {}
                for mode in order:
                    got[mode] = await run_mode(
                        client, mode, args.model, prompt, max_tokens, SEED + 10 * pair, CHOICES
                    )
                say(
                    f"  pair {pair + 1}: n={CHOICES} {got['n'].tokens_per_s:.1f} tok/s, "
                    f"{CHOICES} requests {got['separate'].tokens_per_s:.1f} tok/s"
                )
                done.append((got["n"], got["separate"]))
                firsts.append(f"n={CHOICES}" if order[0] == "n" else f"{CHOICES} requests")
        return Round(ready_s=ready_s, pairs=done, firsts=firsts, foreign_share=0.0)

    before = cpu_sample()
    result = run_served(launch.name, launch.command, launch.env, log, drive)
    return msgspec.structs.replace(result, foreign_share=foreign_cpu_share(before, cpu_sample()))


def _pairs(args: argparse.Namespace) -> int:
    pairs = 1 if args.quick else args.choices_pairs
    if pairs < 1 or args.choices_max_tokens < 1 or args.choices_prompt_words < 1:
        raise BenchError("--choices-pairs, --choices-max-tokens and --choices-prompt-words "
                         "must be at least 1")  # fmt: skip
    if not args.no_engine_env and args.slots < CHOICES:
        # fewer slots than choices: the choices would run in waves, not side by side
        raise BenchError(f"--slots must be at least {CHOICES} for n={CHOICES}")
    return pairs


def run(args: argparse.Namespace) -> str:
    """Run the scenario; returns the markdown body of its BENCHMARKS.md section."""
    pairs = _pairs(args)
    logs = args.cache_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "choices-airgate.log").write_bytes(b"")  # this invocation's output only
    runs = 1 if args.quick else args.runs

    def one_run(done: int, attempt: int) -> Round:
        say(f"choices: round {done + 1}/{runs} (airgate started afresh)")
        return _round(args, attempt, pairs)

    start = time.monotonic()
    rounds, discarded = quiet_runs(runs, args.max_foreign_load, one_run)
    results = Results(choices=CHOICES, max_tokens=args.choices_max_tokens,
                      prompt_words=args.choices_prompt_words, rounds=rounds,
                      discarded=discarded)  # fmt: skip
    dump = logs / "choices-results.json"
    dump.write_bytes(msgspec.json.encode(results))
    say(f"choices: {time.monotonic() - start:.0f} s; per-run results: {dump}")
    return render(args, results)


def check(args: argparse.Namespace) -> str:
    """Set-up only (``--check``): airgate's launch as a run builds it (an app key created in its
    data dir, its command line parsed by airgate's CLI) and the request bodies."""
    pairs = _pairs(args)
    launch = gateway_launch(args, key_name=_KEY_NAME)
    lines = [
        f"airgate: {shown(launch.command)} parsed as `airgate {airgate_args(launch.command)}`; "
        + ("the --api-key given" if args.api_key else "an app key created in its data dir")
    ]
    bodies = []
    for pair in range(pairs):
        prompt = _prompt(0, pair, args.choices_prompt_words)
        bodies.append(chat_body(args.model, prompt, args.choices_max_tokens, SEED, CHOICES))
        bodies += [chat_body(args.model, prompt, args.choices_max_tokens, SEED + i, 1)
                   for i in range(CHOICES)]  # fmt: skip
    from gateway.openai.types import ChatCompletionRequest

    try:
        for body in bodies:
            msgspec.convert(body, ChatCompletionRequest)
    except msgspec.ValidationError as exc:
        raise BenchError(f"airgate would refuse a request body: {exc}") from exc
    lines.append(
        f"{len(bodies)} request bodies per round, decoded as airgate's ChatCompletionRequest, "
        f"for model {args.model!r} (n={CHOICES}, and "
        f"{CHOICES} x n=1; {args.choices_max_tokens} tokens per choice)"
    )
    return "\n".join([f"## {NAME}: set-up checked, nothing started", *(f"- {x}" for x in lines)])
