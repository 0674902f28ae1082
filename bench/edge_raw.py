"""The edge scenario's raw baseline: ``llama_cpp.Llama`` in a fresh process, one stream.

``run_raw`` writes a ``RawJob`` to a file and runs ``python -m bench.edge_raw --raw-worker JOB
OUT`` (the process entry below, internal); the worker loads the model with the same threads as
the servers, answers one warm-up prompt, then the job's prompts one after the other with the
same -100 logit bias on the end tokens, and writes a ``RawOutcome``. No server runs meanwhile,
so nothing shares the CPUs with it.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from bench._client import BenchError, LoadResult, RequestResult
from bench._report import REPO_ROOT
from bench.edge_workload import BANNED_TOKENS, MAX_TOKENS

__all__ = ["RAW_N_CTX", "RawJob", "RawOutcome", "run_raw", "worker_command"]

RAW_N_CTX = 2048


class RawJob(msgspec.Struct, frozen=True, kw_only=True):
    model_path: str
    threads: int
    warmup_prompt: str
    prompts: list[str]


class RawOutcome(msgspec.Struct, frozen=True, kw_only=True):
    load_s: float
    result: LoadResult


def _raw_generate(llm: Any, llama_cpp: Any, prompt: str) -> RequestResult:
    import numpy as np  # only in the worker process

    banned = np.array(BANNED_TOKENS, dtype=np.intc)
    sampled = 0

    def ban_and_count(_input_ids: Any, scores: Any) -> Any:
        # Called once per sampled token: the same -100 bias the gateway gets, and the count.
        nonlocal sampled
        sampled += 1
        scores[banned] -= 100.0
        return scores

    start = time.perf_counter()
    ttft: float | None = None
    finish: str | None = None
    stream = llm.create_completion(
        prompt,
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        stream=True,
        logits_processor=llama_cpp.LogitsProcessorList([ban_and_count]),
    )
    for chunk in stream:
        choice = chunk["choices"][0]
        if ttft is None and choice["text"]:
            ttft = time.perf_counter() - start
        finish = choice["finish_reason"] or finish
    duration = time.perf_counter() - start
    return RequestResult(
        ttft_s=ttft if ttft is not None else duration,
        duration_s=duration,
        completion_tokens=sampled,
        prompt_tokens=len(llm.tokenize(prompt.encode("utf-8"))),
        finish_reason=finish,
    )


def _raw_worker(job: RawJob) -> RawOutcome:
    llama_cpp = importlib.import_module("llama_cpp")
    start = time.perf_counter()
    llm = llama_cpp.Llama(
        model_path=job.model_path,
        n_threads=job.threads,
        n_ctx=RAW_N_CTX,
        verbose=False,
        logits_all=False,
    )
    load_s = time.perf_counter() - start
    _raw_generate(llm, llama_cpp, job.warmup_prompt)
    start = time.perf_counter()
    results = tuple(_raw_generate(llm, llama_cpp, prompt) for prompt in job.prompts)
    wall = time.perf_counter() - start
    return RawOutcome(
        load_s=load_s, result=LoadResult(concurrency=1, wall_s=wall, requests=results)
    )


def worker_command(job_path: Path, out_path: Path) -> list[str]:
    """The worker's command line: a fresh Python that reads ``job_path``, writes ``out_path``."""
    return [sys.executable, "-m", "bench.edge_raw", "--raw-worker", str(job_path), str(out_path)]


def run_raw(job: RawJob, log_path: Path) -> RawOutcome:
    """Run the raw baseline in a fresh process (its stderr goes to ``log_path``)."""
    with tempfile.TemporaryDirectory(prefix="airgate-bench-") as tmp:
        job_path, out_path = Path(tmp, "job.json"), Path(tmp, "out.json")
        job_path.write_bytes(msgspec.json.encode(job))
        with log_path.open("ab") as log:
            done = subprocess.run(
                worker_command(job_path, out_path),
                cwd=REPO_ROOT,
                stdout=log,
                stderr=log,
                timeout=3600,
                check=False,
            )
        if done.returncode != 0:
            raise BenchError(f"raw baseline failed (exit {done.returncode}); see {log_path}")
        return msgspec.json.decode(out_path.read_bytes(), type=RawOutcome)


def _worker_main(argv: Sequence[str]) -> int:
    if len(argv) != 3 or argv[0] != "--raw-worker":
        print("usage: python -m bench.edge_raw --raw-worker JOB OUT", file=sys.stderr)
        return 2
    job = msgspec.json.decode(Path(argv[1]).read_bytes(), type=RawJob)
    Path(argv[2]).write_bytes(msgspec.json.encode(_raw_worker(job)))
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
