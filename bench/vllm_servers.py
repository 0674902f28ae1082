"""The vllm scenario's two servers: the same engine arguments, set up and driven one at a time.

- airgate: per run a fresh data dir; the model sealed with airgate's own CLI (``kms init``,
  ``signing-key create``, ``bundle create``) into a signed, encrypted bundle; an airgate.toml
  with that one vLLM model, the publisher key pinned and ``BENCH_POLICY``; an app key;
  ``airgate serve``.
- ``vllm serve`` (``python -m vllm.entrypoints.openai.api_server``) on the plain model directory.

Both get the same environment (offline, the KV-cache size) and the same bodies; ``ready_s`` is
start to ready and the warm-up answered.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

from bench._client import BenchError
from bench._levels import Body, ServerOutcome, drive_levels
from bench._report import REPO_ROOT
from bench._serve import create_api_key, free_port, inherited_env, run_served, serve_command, tail
from bench.vllm_workload import LEVELS, MAX_TOKENS, MODEL_ID

__all__ = [
    "BENCH_POLICY",
    "OFFLINE_ENV",
    "AirgateFiles",
    "EngineArgs",
    "airgate_cli",
    "airgate_launch",
    "run_airgate",
    "run_vllm_serve",
    "seal_steps",
    "server_env",
    "vllm_serve_command",
]

# Air-gap settings for both servers (airgate sets the same ones itself if they are missing).
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}

# No rate, token or concurrency limits: the benchmark measures the gateway, not the limiter.
# The request caps (max_tokens, n, prompt size) stay: they are checks, not counters.
BENCH_POLICY = """\
name = "bench"
description = "The vllm benchmark: every app may use every model, without rate or token limits."

[[rules]]
name = "inference"
teams = ["*"]
roles = ["app", "admin"]
models = ["*"]
max_tokens = 4096
max_n = 1
max_prompt_bytes = 1048576
engine_classes = ["gpu", "edge"]
audit_level = "metadata"
"""


class EngineArgs(msgspec.Struct, frozen=True, kw_only=True):
    """The engine arguments both servers get: rendered once as TOML, once as CLI flags."""

    dtype: str
    max_model_len: int
    max_num_seqs: int
    seed: int
    enable_prefix_caching: bool
    kv_cache_gib: int  # whole GiB: VLLM_CPU_KVCACHE_SPACE takes no fraction
    gpu_memory_utilization: float  # on CPUs: the share of RAM; unused with an explicit KV size
    enforce_eager: bool

    def toml(self) -> str:
        """airgate's ``[models.vllm]`` table (its engine always runs scheduling_policy=priority
        with request logging and stat logging off)."""
        return "\n".join(
            [
                "[models.vllm]",
                f"dtype = {json.dumps(self.dtype)}",
                f"max_model_len = {self.max_model_len}",
                f"max_num_seqs = {self.max_num_seqs}",
                f"seed = {self.seed}",
                f"enable_prefix_caching = {json.dumps(self.enable_prefix_caching)}",
                f"kv_cache_space_gib = {self.kv_cache_gib}",
                f"gpu_memory_utilization = {self.gpu_memory_utilization}",
                f"enforce_eager = {json.dumps(self.enforce_eager)}",
            ]
        )

    def flags(self) -> list[str]:
        """``vllm serve`` flags for the same engine, airgate's fixed choices included."""
        return [
            "--dtype", self.dtype,
            "--max-model-len", str(self.max_model_len),
            "--max-num-seqs", str(self.max_num_seqs),
            "--seed", str(self.seed),
            "--enable-prefix-caching" if self.enable_prefix_caching
            else "--no-enable-prefix-caching",
            "--kv-cache-memory-bytes", str(self.kv_cache_gib * 2**30),
            "--gpu-memory-utilization", str(self.gpu_memory_utilization),
            "--enforce-eager" if self.enforce_eager else "--no-enforce-eager",
            "--scheduling-policy", "priority",
            "--no-enable-log-requests",
            "--disable-log-stats",
        ]  # fmt: skip

    def env(self) -> dict[str, str]:
        return {"VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib)}


def server_env(engine: EngineArgs) -> dict[str, str]:
    """The same environment for both servers: ours without AIRGATE_* (airgate rejects unknown
    ones; its settings come from the generated config), offline, the KV-cache size."""
    return {**inherited_env("AIRGATE_"), **OFFLINE_ENV, **engine.env()}


def _serve_and_drive(
    label: str,
    command: Sequence[str],
    env: dict[str, str],
    log_path: Path,
    port: int,
    headers: Mapping[str, str],
    ready_path: str,
    bodies: Mapping[int, list[Body]],
    ready_timeout_s: float,
) -> ServerOutcome:
    """Start one server, drive it (``bodies[0]``: the warm-up), stop it."""

    async def drive(proc: subprocess.Popen[bytes]) -> ServerOutcome:
        return await drive_levels(
            f"http://127.0.0.1:{port}",
            label,
            bodies[0],
            {level: bodies[level] for level in LEVELS},
            MAX_TOKENS,
            ready_path=ready_path,
            ready_timeout_s=ready_timeout_s,
            alive=lambda: proc.poll() is None,
            headers=headers,
            warmup_in_ready=True,
        )

    return run_served(label, command, env, log_path, drive, tail_lines=30)


def airgate_cli(args: Sequence[str | Path], env: dict[str, str], log_path: Path) -> None:
    """``airgate ARGS``, which must succeed (output appended to the log)."""
    command = [*serve_command(), *map(str, args)]
    with log_path.open("ab") as log:
        log.write(f"\n=== {' '.join(command)}\n".encode())
        log.flush()
        done = subprocess.run(
            command, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            timeout=600, check=False,
        )  # fmt: skip
    if done.returncode != 0:
        raise BenchError(
            f"`airgate {' '.join(map(str, args[:2]))}` failed (exit {done.returncode}):\n"
            f"{tail(log_path)}"
        )


@dataclass(frozen=True, slots=True)
class AirgateFiles:
    """Where one run's airgate keeps its files."""

    run_dir: Path

    @property
    def data(self) -> Path:
        return self.run_dir / "data"

    @property
    def publisher(self) -> Path:
        return self.run_dir / "publisher.key"

    @property
    def bundle(self) -> Path:
        return self.run_dir / f"{MODEL_ID}.bundle"


def seal_steps(model_dir: Path, files: AirgateFiles) -> list[list[str]]:
    """The ``airgate`` commands that seal the model: a KMS key, a publisher key, the bundle."""
    return [
        ["kms", "init", "--data-dir", str(files.data)],
        ["signing-key", "create", str(files.publisher)],
        [
            "bundle", "create", str(model_dir),
            "--name", MODEL_ID, "--version", "1", "--architecture", "llama",
            "--recipient", "local:default",
            "--signing-key", str(files.publisher),
            "--out", str(files.bundle),
            "--data-dir", str(files.data),
        ],
    ]  # fmt: skip


def _airgate_config(files: AirgateFiles, engine: EngineArgs) -> Path:
    policy_dir = files.run_dir / "policy"
    policy_dir.mkdir()
    (policy_dir / "bench.toml").write_text(BENCH_POLICY)
    publisher_pub = files.publisher.with_name(files.publisher.name + ".pub")
    config = files.run_dir / "airgate.toml"
    config.write_text(
        f"""\
[bundles]
trusted_keys = [{json.dumps(str(publisher_pub))}]

[policy]
path = {json.dumps(str(policy_dir))}

[[models]]
id = "{MODEL_ID}"
engine = "vllm"
bundle = {json.dumps(str(files.bundle))}

{engine.toml()}
"""
    )
    return config


def airgate_launch(
    files: AirgateFiles, engine: EngineArgs, env: Mapping[str, str]
) -> tuple[list[str], int, str]:
    """Write airgate.toml and its policy, create an app key: ``airgate serve``'s command line,
    port and key."""
    config = _airgate_config(files, engine)
    key = create_api_key(files.data, env, ["--config", str(config)], name="bench-vllm")
    port = free_port()
    command = [
        *serve_command(), "serve",
        "--port", str(port), "--data-dir", str(files.data), "--config", str(config),
    ]  # fmt: skip
    return command, port, key


def run_airgate(
    model_dir: Path,
    engine: EngineArgs,
    bodies: Mapping[int, list[Body]],
    run_dir: Path,
    log_path: Path,
    ready_timeout_s: float,
) -> ServerOutcome:
    """Seal the model, configure and start ``airgate serve``, drive every level, stop it."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    files = AirgateFiles(run_dir)
    env = server_env(engine)
    for step in seal_steps(model_dir, files):
        airgate_cli(step, env, log_path)
    command, port, key = airgate_launch(files, engine, env)
    headers = {"Authorization": f"Bearer {key}"}
    return _serve_and_drive(
        "airgate", command, env, log_path, port, headers, "/ready", bodies, ready_timeout_s
    )


def vllm_serve_command(model_dir: Path, engine: EngineArgs, port: int) -> list[str]:
    """``vllm serve`` on the plain model directory with the same engine arguments."""
    # `python -m`: the `vllm` script of vllm-cpu 0.32.0 fails (it asks for the version of a
    # distribution named "vllm"); this module is the same server, with a deprecation warning.
    return [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", MODEL_ID,
        "--host", "127.0.0.1", "--port", str(port),
        *engine.flags(),
    ]  # fmt: skip


def run_vllm_serve(
    model_dir: Path,
    engine: EngineArgs,
    bodies: Mapping[int, list[Body]],
    log_path: Path,
    ready_timeout_s: float,
) -> ServerOutcome:
    """``vllm serve`` started, every level driven, stopped."""
    port = free_port()
    command = vllm_serve_command(model_dir, engine, port)
    return _serve_and_drive(
        "vllm serve", command, server_env(engine), log_path, port, {}, "/health", bodies,
        ready_timeout_s,
    )  # fmt: skip
