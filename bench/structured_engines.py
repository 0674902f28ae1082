"""The structured scenario's engine worker: one engine in a fresh process, constrained against
unconstrained decoding on one stream, and (llama.cpp) the grammar compile times.

``run_worker`` writes an ``EngineJob`` to a file and runs ``python -m bench.structured_engines
JOB OUT`` (the process entry below, internal), which starts the engine in process, as airgate
does, and writes an ``EngineOutcome``:

1. (llama.cpp) compile times on ``engine.grammars``: a warm-up schema first (not counted), then
   each schema's first ``sampler()`` (it compiles: ``compiles`` must grow by one) and a repeat
   (a cache hit: ``compiles`` must not grow); then the tool-call grammar
   (``backends.tool_calls.calls_schema``) for 1 and for 8 tools, as tool_choice "auto" (lazy,
   with the trigger) and "required". Every sampler handed out is freed (``free_sampler``).
2. Decoding: one warm-up of each kind, then ``rounds`` rounds; in each, for temperature 1.0
   and for greedy, the same request (same prompt, seed and banned end tokens) with the
   ``json_schema`` constraint and without, the one that goes first alternating. Only one
   request runs at a time. Decode speed is the tokens after the first over the time from the
   first token's delta to the last one's.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec

from bench._client import BenchError
from bench._serve import inherited_env, spawned, tail

__all__ = [
    "MODES",
    "CompileTimes",
    "Decode",
    "EngineJob",
    "EngineOutcome",
    "ToolCompile",
    "run_worker",
    "worker_command",
]

Mode = Literal["sampled", "greedy"]
Choice = Literal["auto", "required"]  # tool_choice: lazy grammar after the trigger, or whole
_CHOICES: tuple[Choice, Choice] = ("auto", "required")
MODES: tuple[Mode, Mode] = ("sampled", "greedy")
_TEMPERATURE = {"sampled": 1.0, "greedy": 0.0}
# What a constrained answer to the long schema starts with, whatever whitespace the grammar
# allows; an unconstrained one never does.
_STARTS = re.compile(r'\s*\{\s*"people"\s*:\s*\[')


class EngineJob(msgspec.Struct, frozen=True, kw_only=True):
    engine: Literal["llama.cpp", "vllm"]
    model: str  # a GGUF file (llama.cpp) or a model directory (vLLM)
    threads: int  # llama.cpp
    vllm_dtype: str = "float32"
    vllm_kv_cache_gib: int = 1
    vllm_enforce_eager: bool = False
    max_tokens: int
    banned: list[int]  # end tokens, logit bias -100
    prompts: list[str]  # [0]: the warm-ups; then one per round
    schema: str  # the long-output schema, checked
    compile_schemas: list[str] = []  # checked; llama.cpp only
    tools: list[tuple[str, str]] = []  # (name, checked parameters) for the tool-call grammars


class Decode(msgspec.Struct, frozen=True, kw_only=True):
    mode: Mode
    constrained: bool
    round: int
    tokens: int
    ttft_s: float  # submit -> first token's delta
    decode_tokens: int  # after the first
    decode_s: float  # first token's delta -> last token's delta

    @property
    def tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_s


class ToolCompile(msgspec.Struct, frozen=True, kw_only=True):
    tools: int
    choice: Choice
    first_s: float
    compile_s: float
    repeat_s: float


class CompileTimes(msgspec.Struct, frozen=True, kw_only=True):
    first_s: list[float]  # sampler() awaited, per schema: worker thread, compile, clone
    compile_s: list[float]  # GrammarCache.last_compile_s: converter + llama.cpp's parse
    repeat_s: list[float]  # sampler() again: a cache hit (the clone)
    compiles_first: int  # grammars compiled by the first requests (one per schema)
    compiles_repeat: int  # by the repeats (none)
    tools: list[ToolCompile]


class EngineOutcome(msgspec.Struct, frozen=True, kw_only=True):
    engine: str
    load_s: float
    decodes: list[Decode]
    compile: CompileTimes | None = None
    sample_text: str = ""  # the start of a constrained answer, for the report


class WorkerError(Exception):
    """The engine did not do what the measurement assumes (the worker exits 1 with this)."""


async def _compile_times(engine: Any, job: EngineJob) -> CompileTimes:
    from backends.llamacpp._sampler import free_sampler
    from backends.structured import canonical, check_schema
    from backends.tool_calls import TRIGGER, calls_schema
    from backends.types import OutputConstraint, ToolDefinition

    cache = engine.grammars

    async def timed(constraint: OutputConstraint) -> float:
        start = time.perf_counter()
        sampler = await cache.sampler(constraint)
        elapsed = time.perf_counter() - start
        free_sampler(sampler)
        return elapsed

    warm = check_schema({"type": "object", "properties": {"w": {"type": "string"}}}, param="w")
    await timed(OutputConstraint(warm))
    constraints = [OutputConstraint(text) for text in job.compile_schemas]
    first, compiled = [], []
    before = cache.compiles
    for constraint in constraints:
        first.append(await timed(constraint))
        compiled.append(cache.last_compile_s)
    after_first = cache.compiles
    repeat = [await timed(constraint) for constraint in constraints]
    after_repeat = cache.compiles
    tools = [ToolDefinition(name, f"Calls {name}.", params) for name, params in job.tools]
    tool_times = []
    for count in (1, len(tools)):
        schema = canonical(calls_schema(tools[:count], only=None, parallel=True))
        for choice in _CHOICES:
            trigger = TRIGGER if choice == "auto" else None
            constraint = OutputConstraint(schema, trigger=trigger, param="tools")
            first_s = await timed(constraint)
            compile_s = cache.last_compile_s
            repeat_s = await timed(constraint)
            tool_times.append(
                ToolCompile(
                    tools=count,
                    choice=choice,
                    first_s=first_s,
                    compile_s=compile_s,
                    repeat_s=repeat_s,
                )
            )
    return CompileTimes(
        first_s=first,
        compile_s=compiled,
        repeat_s=repeat,
        compiles_first=after_first - before,
        compiles_repeat=after_repeat - after_first,
        tools=tool_times,
    )


async def _decode(
    engine: Any, job: EngineJob, prompt: str, mode: Mode, constrained: bool, round_: int
) -> tuple[Decode, str]:
    """One request (``round_`` -1: a warm-up); its figures and its text."""
    from backends.types import GenerationRequest, OutputConstraint, SamplingParams

    request = GenerationRequest(
        request_id=f"structured-{round_}-{mode}-{int(constrained)}",
        prompt=prompt,
        max_tokens=job.max_tokens,
        sampling=SamplingParams(
            temperature=_TEMPERATURE[mode],
            seed=1000 + round_,
            logit_bias=tuple((token, -100.0) for token in job.banned),
        ),
        constraint=OutputConstraint(job.schema) if constrained else None,
    )
    start = time.perf_counter()
    handle = await engine.submit(request)
    first_at = last_at = 0.0
    first_n = tokens = 0
    text = []
    async for delta in handle:
        if delta.n_tokens:
            last_at = time.perf_counter()
            if not tokens:
                first_at, first_n = last_at, delta.n_tokens
            tokens += delta.n_tokens
        text.append(delta.text)
    out = "".join(text)
    what = f"{job.engine} {mode} {'constrained' if constrained else 'unconstrained'}"
    if tokens != job.max_tokens:
        raise WorkerError(f"{what}: {tokens} tokens generated, not {job.max_tokens}")
    if constrained != bool(_STARTS.match(out)):
        raise WorkerError(f"{what}: the output does not start as the schema says: {out[:60]!r}")
    decode = Decode(
        mode=mode,
        constrained=constrained,
        round=round_,
        tokens=tokens,
        ttft_s=first_at - start,
        decode_tokens=tokens - first_n,
        decode_s=last_at - first_at,
    )
    return decode, out


def _engine(job: EngineJob) -> Any:
    if job.engine == "llama.cpp":
        from backends.llamacpp import LlamaCppEngine, LlamaCppOptions

        options = LlamaCppOptions(slots=1, context_length=1024, n_threads=job.threads)
        return LlamaCppEngine(job.model, options)
    from backends.vllm import VllmEngine, VllmOptions

    vllm = VllmOptions(
        dtype=job.vllm_dtype,  # type: ignore[arg-type]  # checked by the scenario's parser
        max_model_len=512,
        max_num_seqs=8,
        seed=0,
        kv_cache_space_gib=job.vllm_kv_cache_gib,
        enforce_eager=job.vllm_enforce_eager,
    )
    return VllmEngine(job.model, vllm)


async def _work(job: EngineJob) -> EngineOutcome:
    engine = _engine(job)
    start = time.perf_counter()
    await engine.start()
    load_s = time.perf_counter() - start
    try:
        compile_times = await _compile_times(engine, job) if job.compile_schemas else None
        sample = ""
        for mode in MODES:  # warm-ups: vLLM compiles its grammar at the first constrained one
            for constrained in (False, True):
                _, out = await _decode(engine, job, job.prompts[0], mode, constrained, -1)
                sample = out if constrained and mode == "greedy" else sample
        decodes = []
        for i, prompt in enumerate(job.prompts[1:]):
            for k, mode in enumerate(MODES):
                order = (True, False) if (i + k) % 2 == 0 else (False, True)
                for constrained in order:
                    decode, _ = await _decode(engine, job, prompt, mode, constrained, i)
                    decodes.append(decode)
    finally:
        await engine.stop()
    return EngineOutcome(engine=job.engine, load_s=load_s, decodes=decodes,
                         compile=compile_times, sample_text=sample[:80])  # fmt: skip


def worker_command(job_path: Path, out_path: Path) -> list[str]:
    """The worker's command line: a fresh Python that reads ``job_path``, writes ``out_path``."""
    return [sys.executable, "-m", "bench.structured_engines", str(job_path), str(out_path)]


def run_worker(job: EngineJob, log_path: Path, timeout_s: float = 3600.0) -> EngineOutcome:
    """Run ``job`` in a fresh process (output appended to ``log_path``); its process group is
    reaped before this returns (vLLM's engine core and its worker included), so their CPU time
    counts as ours."""
    with tempfile.TemporaryDirectory(prefix="airgate-bench-") as tmp:
        job_path, out_path = Path(tmp, "job.json"), Path(tmp, "out.json")
        job_path.write_bytes(msgspec.json.encode(job))
        command = worker_command(job_path, out_path)
        with log_path.open("ab") as log:
            log.write(f"\n=== {job.engine} worker: {' '.join(command)}\n".encode())
        with spawned(command, inherited_env("AIRGATE_BENCH_"), log_path) as proc:
            try:
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise BenchError(f"the {job.engine} worker ran past {timeout_s:.0f} s") from None
        if code != 0:
            raise BenchError(
                f"the {job.engine} worker failed (exit {code}); last lines of {log_path}:\n"
                f"{tail(log_path)}"
            )
        return msgspec.json.decode(out_path.read_bytes(), type=EngineOutcome)


def _main(argv: Sequence[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m bench.structured_engines JOB OUT", file=sys.stderr)
        return 2
    job = msgspec.json.decode(Path(argv[0]).read_bytes(), type=EngineJob)
    try:
        outcome = asyncio.run(_work(job))
    except WorkerError as exc:
        print(f"structured worker: {exc}", file=sys.stderr)
        return 1
    Path(argv[1]).write_bytes(msgspec.json.encode(outcome))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
