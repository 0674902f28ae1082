"""The embeddings scenario's servers: airgate and ``llama-server --embeddings`` on the same MiniLM
GGUF, driven over HTTP at batch 1, 16 and 64 inputs per request by ``CONCURRENCY`` clients.

- airgate: ``airgate serve`` with no model configuration, started as the edge scenario starts it
  (``bench.edge_servers.gateway_launch``: its data dir in the cache, the engine threads of
  ``--threads``, an app key); it serves ``all-minilm-l6-v2`` beside Gemma, sealed from the
  package at its first start. Its configuration names only a policy (``airgate_config``) whose
  rate limits no run reaches: the default policy's 600 requests a minute per key would refuse
  batch-1 requests, which come faster than that. Its embedder packs inputs across requests:
  512 tokens and at most 16 inputs per ``llama_decode`` (its defaults for this model).
- ``llama-server``: the edge scenario's build (the llama.cpp airgate's llama-cpp-python vendors)
  with ``--embeddings --pooling mean`` on the GGUF airgate's converter writes
  (``bench.embeddings_inputs.ensure_gguf``), the same threads, and the same packing: 16 slots of
  512 tokens, 512-token batches (``-b``/``-ub``: a non-causal input never spans two).

Both get the same bodies: ``{"model", "input": [texts], "encoding_format": "float"}``. After each
start one warm-up request whose vectors are kept (to compare the servers' outputs) and whose
``usage.prompt_tokens`` must be ``INPUT_TOKENS`` per input; then each batch size in turn, every
response checked to hold one vector per input.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import msgspec

from bench._client import BenchError, LoadError, describe_error, wait_ready
from bench._report import say
from bench._serve import free_port, inherited_env, run_served
from bench.edge_servers import OWN_ENV_PREFIX, Launch
from bench.embeddings_inputs import INPUT_TOKENS
from bench.peers_llama_server import llama_server_command

__all__ = [
    "BATCHES",
    "CONCURRENCY",
    "EMBED_PATH",
    "PEER_BATCH",
    "PEER_CTX",
    "PEER_PARALLEL",
    "Level",
    "ServerOutcome",
    "airgate_config",
    "embeddings_body",
    "inputs_per_level",
    "llama_server_embeddings_launch",
    "peer_command",
    "run_embeddings",
]

EMBED_PATH = "/v1/embeddings"
CONCURRENCY = 4
BATCHES = (1, 16, 64)
# llama-server packed as airgate's embedder is by default for MiniLM
PEER_PARALLEL = 16  # inputs per decode at most
PEER_CTX = 512  # tokens per input at most (the model's position embeddings)
PEER_BATCH = 512  # tokens per decode


class Level(msgspec.Struct, frozen=True, kw_only=True):
    """One batch size: its requests through ``CONCURRENCY`` clients."""

    batch: int
    requests: int
    inputs: int
    prompt_tokens: int  # as the server counted them (usage)
    wall_s: float  # first request sent -> last response read
    latencies_s: list[float]

    @property
    def inputs_per_s(self) -> float:
        return self.inputs / self.wall_s


class ServerOutcome(msgspec.Struct, frozen=True, kw_only=True):
    server: str
    ready_s: float
    warmup_s: float
    warmup_vectors: list[list[float]]  # of the warm-up inputs, to compare the servers
    levels: list[Level]


class _Item(msgspec.Struct):
    embedding: list[float]
    index: int = 0


class _Usage(msgspec.Struct):
    prompt_tokens: int = 0


class _EmbeddingList(msgspec.Struct):
    data: list[_Item]
    usage: _Usage | None = None


_decoder = msgspec.json.Decoder(_EmbeddingList)


_POLICY = """\
name = "bench-embeddings"
description = "The embeddings benchmark: the default policy's rule, with limits no run reaches."

[[rules]]
name = "bench"
teams = ["*"]
roles = ["app"]
models = ["*"]
max_tokens = 4096
max_n = 8
max_prompt_bytes = 1048576
requests_per_minute = 10000000
tokens_per_minute = 10000000000
concurrent_streams = 10000
engine_classes = ["gpu", "edge"]
audit_level = "metadata"
"""


def airgate_config(work: Path) -> Path:
    """airgate.toml under ``work`` naming only the policy above (written there too): no model
    configuration, so airgate serves its defaults, the MiniLM embedder among them."""
    policy = work / "policy"
    policy.mkdir(parents=True, exist_ok=True)
    (policy / "bench.toml").write_text(_POLICY)
    config = work / "airgate.toml"
    config.write_text(f"[policy]\npath = {json.dumps(str(policy))}\n")
    return config


def inputs_per_level(quick: bool) -> int:
    """Inputs embedded at each batch size: two waves of 64-input requests (one in --quick)."""
    return 2 * CONCURRENCY * BATCHES[-1] // (2 if quick else 1)


def embeddings_body(model: str, texts: Sequence[str]) -> dict[str, Any]:
    return {"model": model, "input": list(texts), "encoding_format": "float"}


def peer_command(binary: Path | str, model: Path | str, threads: int, port: int | str) -> list[str]:
    """``llama-server`` embedding ``model`` with mean pooling, packed as airgate packs."""
    base = llama_server_command(
        binary, model, threads=threads, parallel=PEER_PARALLEL, n_ctx_seq=PEER_CTX, port=port
    )
    return [*base, "--embeddings", "--pooling", "mean",
            "-b", str(PEER_BATCH), "-ub", str(PEER_BATCH)]  # fmt: skip


def llama_server_embeddings_launch(name: str, binary: Path, model: Path, threads: int) -> Launch:
    port = free_port()
    command = peer_command(binary, model, threads, port)
    return Launch(name, command, inherited_env(OWN_ENV_PREFIX), port, "/health")


async def _embed(
    client: httpx.AsyncClient, body: dict[str, Any], label: str
) -> tuple[_EmbeddingList, float]:
    start = time.perf_counter()
    try:
        response = await client.post(EMBED_PATH, json=body)
    except httpx.HTTPError as exc:
        raise LoadError(f"{label}: {type(exc).__name__}: {exc}") from exc
    elapsed = time.perf_counter() - start
    if response.status_code != 200:
        error = describe_error(response.status_code, response.content)
        raise LoadError(f"{label}: {error}", response.status_code)
    try:
        result = _decoder.decode(response.content)
    except msgspec.DecodeError as exc:
        raise LoadError(f"{label}: malformed embeddings response: {exc}") from exc
    if len(result.data) != len(body["input"]):
        raise LoadError(f"{label}: {len(result.data)} vectors for {len(body['input'])} inputs")
    return result, elapsed


async def _level(
    client: httpx.AsyncClient, label: str, batch: int, bodies: Sequence[dict[str, Any]]
) -> Level:
    pending: Iterator[dict[str, Any]] = iter(bodies)
    latencies: list[float] = []
    tokens = 0

    async def worker() -> None:
        nonlocal tokens
        for body in pending:  # one event loop: next() on the shared iterator is safe
            result, elapsed = await _embed(client, body, f"{label} at batch {batch}")
            latencies.append(elapsed)
            tokens += result.usage.prompt_tokens if result.usage else 0

    start = time.perf_counter()
    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(CONCURRENCY):
                group.create_task(worker())
    except ExceptionGroup as failed:
        errors = [e for e in failed.exceptions if isinstance(e, LoadError)]
        if not errors:
            raise
        raise errors[0] from failed
    wall = time.perf_counter() - start
    inputs = sum(len(b["input"]) for b in bodies)
    return Level(batch=batch, requests=len(bodies), inputs=inputs, prompt_tokens=tokens,
                 wall_s=wall, latencies_s=latencies)  # fmt: skip


def run_embeddings(
    args: argparse.Namespace,
    launch: Launch,
    warmup: Sequence[str],
    levels: dict[int, list[str]],
    log_path: Path,
) -> ServerOutcome:
    """Start one server, warm it up with ``warmup``, embed ``levels[batch]`` in requests of
    ``batch`` inputs at each batch size, stop it."""
    model = args.embedding_model

    async def drive(proc: subprocess.Popen[bytes]) -> ServerOutcome:
        async with httpx.AsyncClient(
            base_url=launch.base_url,
            headers=launch.headers,
            timeout=httpx.Timeout(600.0, connect=10.0),
            limits=httpx.Limits(max_connections=CONCURRENCY + 2),
        ) as client:
            alive = lambda: proc.poll() is None  # noqa: E731
            ready_s = await wait_ready(client, launch.ready_path, args.ready_timeout, alive)
            first, warmup_s = await _embed(
                client, embeddings_body(model, warmup), f"{launch.name} warm-up"
            )
            counted = first.usage.prompt_tokens if first.usage else 0
            if counted != INPUT_TOKENS * len(warmup):
                raise BenchError(
                    f"{launch.name} counted {counted} tokens for {len(warmup)} inputs of "
                    f"{INPUT_TOKENS}: not the same tokenisation"
                )
            done = []
            for batch, texts in levels.items():
                bodies = [embeddings_body(model, texts[i : i + batch])
                          for i in range(0, len(texts), batch)]  # fmt: skip
                level = await _level(client, launch.name, batch, bodies)
                say(f"  {launch.name}: batch {batch}: {level.inputs_per_s:.1f} inputs/s")
                done.append(level)
        vectors = [item.embedding for item in sorted(first.data, key=lambda x: x.index)]
        return ServerOutcome(server=launch.name, ready_s=ready_s, warmup_s=warmup_s,
                             warmup_vectors=vectors, levels=done)  # fmt: skip

    return run_served(launch.name, launch.command, launch.env, log_path, drive)
