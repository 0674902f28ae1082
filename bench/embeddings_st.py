"""The embeddings scenario's in-process baseline: sentence-transformers in a fresh process.

``run_st`` writes an ``StJob`` to a file and runs ``python -m bench.embeddings_st JOB OUT`` (the
process entry below, internal): it loads the packaged all-MiniLM-L6-v2 (extracted into the
cache) with ``SentenceTransformer(path, device="cpu")`` after ``torch.set_num_threads(threads)``
(one inter-op thread), embeds the warm-up inputs (their vectors are kept, to compare with the
servers'), then at each batch size calls ``encode(chunk, batch_size=batch,
normalize_embeddings=True)`` on consecutive chunks of ``batch`` inputs, one after the other:
one client, no HTTP, no JSON. Equal-length inputs mean no padding.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec

from bench._client import BenchError
from bench._serve import inherited_env, spawned, tail

__all__ = ["StJob", "StLevel", "StOutcome", "run_st", "st_command"]


class StJob(msgspec.Struct, frozen=True, kw_only=True):
    model_dir: str
    threads: int
    warmup: list[str]
    levels: dict[int, list[str]]  # batch -> inputs


class StLevel(msgspec.Struct, frozen=True, kw_only=True):
    batch: int
    inputs: int
    wall_s: float

    @property
    def inputs_per_s(self) -> float:
        return self.inputs / self.wall_s


class StOutcome(msgspec.Struct, frozen=True, kw_only=True):
    load_s: float
    versions: dict[str, str]
    warmup_vectors: list[list[float]]
    levels: list[StLevel]


def st_command(job_path: Path, out_path: Path) -> list[str]:
    return [sys.executable, "-m", "bench.embeddings_st", str(job_path), str(out_path)]


def run_st(job: StJob, log_path: Path, timeout_s: float = 1800.0) -> StOutcome:
    """Run ``job`` in a fresh process (output appended to ``log_path``), reaped before this
    returns so its CPU time counts as ours."""
    with tempfile.TemporaryDirectory(prefix="airgate-bench-") as tmp:
        job_path, out_path = Path(tmp, "job.json"), Path(tmp, "out.json")
        job_path.write_bytes(msgspec.json.encode(job))
        command = st_command(job_path, out_path)
        with log_path.open("ab") as log:
            log.write(f"\n=== sentence-transformers: {' '.join(command)}\n".encode())
        # HF_HUB_OFFLINE: the model is a local directory; nothing may be looked up
        env = {**inherited_env("AIRGATE_BENCH_"), "HF_HUB_OFFLINE": "1"}
        with spawned(command, env, log_path) as proc:
            try:
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise BenchError(f"sentence-transformers ran past {timeout_s:.0f} s") from None
        if code != 0:
            raise BenchError(
                f"the sentence-transformers worker failed (exit {code}); last lines of "
                f"{log_path}:\n{tail(log_path)}"
            )
        return msgspec.json.decode(out_path.read_bytes(), type=StOutcome)


def _work(job: StJob) -> StOutcome:
    import importlib.metadata

    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(job.threads)
    torch.set_num_interop_threads(1)
    start = time.perf_counter()
    model = SentenceTransformer(job.model_dir, device="cpu")
    load_s = time.perf_counter() - start
    with torch.inference_mode():
        warm = model.encode(job.warmup, batch_size=len(job.warmup), normalize_embeddings=True)
        levels = []
        for batch, texts in job.levels.items():
            start = time.perf_counter()
            for i in range(0, len(texts), batch):
                model.encode(texts[i : i + batch], batch_size=batch, normalize_embeddings=True)
            wall = time.perf_counter() - start
            levels.append(StLevel(batch=batch, inputs=len(texts), wall_s=wall))
            print(f"sentence-transformers: batch {batch}: {len(texts) / wall:.1f} inputs/s")
    versions = {name: importlib.metadata.version(name)
                for name in ("sentence-transformers", "torch", "transformers")}  # fmt: skip
    return StOutcome(load_s=load_s, versions=versions,
                     warmup_vectors=warm.tolist(), levels=levels)  # fmt: skip


def _main(argv: Sequence[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m bench.embeddings_st JOB OUT", file=sys.stderr)
        return 2
    job = msgspec.json.decode(Path(argv[0]).read_bytes(), type=StJob)
    Path(argv[1]).write_bytes(msgspec.json.encode(_work(job)))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
