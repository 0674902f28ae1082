"""The edge scenario's servers under test: how each is started, and one server driven.

- airgate: ``airgate serve`` on a free port with the data dir ``<cache>/data``, the engine
  settings of ``server_env`` and an app key (``--api-key``, or one created in the database the
  server will open). The soak starts airgate the same way (``gateway_launch``);
- ``llama-server`` and ``llama_cpp.server``: prepared into the cache by ``prepare_peers``
  (``bench.peers_llama_server``, ``bench.peers_llama``), no key.
"""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bench._client import BenchError, LoadError
from bench._levels import ServerOutcome, drive_levels
from bench._serve import create_api_key, free_port, inherited_env, run_served, serve_command
from bench.edge_workload import LEVELS, MAX_TOKENS, body
from bench.peers_llama import (
    LLAMA_CPP_SERVER,
    LLAMA_SERVER,
    UsageTransport,
    llama_cpp_server_command,
    llama_cpp_server_python,
)
from bench.peers_llama_server import llama_server_binary, llama_server_command

__all__ = [
    "AIRGATE",
    "OWN_ENV_PREFIX",
    "PEERS",
    "PEER_N_CTX",
    "SERVERS",
    "SLOTS_ENV",
    "THREADS_ENV",
    "Launch",
    "Peers",
    "gateway_launch",
    "peer_launch",
    "prepare_peers",
    "run_server",
    "server_env",
]

AIRGATE = "airgate"
PEERS = (LLAMA_SERVER, LLAMA_CPP_SERVER)
SERVERS = (AIRGATE, *PEERS)
PEER_N_CTX = 2048  # tokens per sequence for the peers: ~100 prompt + 128 generated fit

# Engine settings passed to the server unless --no-engine-env ([engine] keys of airgate.toml).
SLOTS_ENV = "AIRGATE_ENGINE__SLOTS"
THREADS_ENV = "AIRGATE_ENGINE__N_THREADS"
# The server rejects unknown AIRGATE_* variables: ours never reach it.
OWN_ENV_PREFIX = "AIRGATE_BENCH_"


@dataclass(frozen=True, slots=True)
class Launch:
    """How to start one server and talk to it."""

    name: str
    command: list[str]
    env: dict[str, str]
    port: int
    ready_path: str
    headers: dict[str, str] = field(default_factory=dict)
    count_chunks: bool = False  # the server streams no usage: count its chunks (UsageTransport)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass(frozen=True, slots=True)
class Peers:
    """The prepared peers: None for one left out with --edge-skip."""

    llama_server: Path | None
    llama_cpp_python: Path | None

    def names(self) -> tuple[str, ...]:
        ready = {LLAMA_SERVER: self.llama_server, LLAMA_CPP_SERVER: self.llama_cpp_python}
        return tuple(name for name in PEERS if ready[name] is not None)


def server_env(args: argparse.Namespace) -> dict[str, str]:
    """Environment given to the server: engine defaults, then every --server-env."""
    env: dict[str, str] = {}
    if not args.no_engine_env:
        env[SLOTS_ENV] = str(args.slots)
        env[THREADS_ENV] = str(args.threads)
    for item in args.server_env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BenchError(f"--server-env wants KEY=VALUE, got {item!r}")
        env[key] = value
    return env


def gateway_launch(args: argparse.Namespace, key_name: str = "bench-edge") -> Launch:
    """``airgate serve`` on a free port, with an app key (created now unless --api-key)."""
    port = free_port()
    data_dir = args.cache_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    command = [*serve_command(), "serve", "--port", str(port), "--data-dir", str(data_dir)]
    command += args.server_arg
    env = {**inherited_env(OWN_ENV_PREFIX), **server_env(args)}
    api_key = args.api_key or create_api_key(data_dir, env, args.server_arg, name=key_name)
    headers = {"Authorization": f"Bearer {api_key}"}
    return Launch(AIRGATE, command, env, port, "/ready", headers)


def peer_launch(args: argparse.Namespace, name: str, peers: Peers, model_path: Path) -> Launch:
    """``llama-server`` or ``llama_cpp.server`` on a free port (neither asks for a key)."""
    port = free_port()
    if name == LLAMA_SERVER and peers.llama_server is not None:
        command = llama_server_command(
            peers.llama_server,
            model_path,
            threads=args.threads,
            parallel=args.llama_server_parallel,
            n_ctx_seq=PEER_N_CTX,
            port=port,
        )
        return Launch(name, command, inherited_env(OWN_ENV_PREFIX), port, "/health")
    if name == LLAMA_CPP_SERVER and peers.llama_cpp_python is not None:
        command = llama_cpp_server_command(
            peers.llama_cpp_python, model_path, threads=args.threads, n_ctx=PEER_N_CTX, port=port
        )
        env = inherited_env(OWN_ENV_PREFIX)
        return Launch(name, command, env, port, "/v1/models", count_chunks=True)
    raise BenchError(f"{name} is not prepared")


def prepare_peers(args: argparse.Namespace) -> Peers:
    """Install and build the peers not left out (once; later runs reuse the cache)."""
    skip = set(args.edge_skip)
    return Peers(
        llama_server=None if LLAMA_SERVER in skip else llama_server_binary(args.cache_dir),
        llama_cpp_python=(
            None if LLAMA_CPP_SERVER in skip else llama_cpp_server_python(args.cache_dir)
        ),
    )


def run_server(
    args: argparse.Namespace, launch: Launch, prompts: Mapping[int, list[str]], log_path: Path
) -> ServerOutcome:
    """Start one server, drive every level, stop it. ``prompts[0][0]`` is the warm-up."""
    warmup = [body(prompts[0][0], args.model)]
    levels = {level: [body(p, args.model) for p in prompts[level]] for level in LEVELS}

    async def drive(proc: subprocess.Popen[bytes]) -> ServerOutcome:
        try:
            return await drive_levels(
                launch.base_url,
                launch.name,
                warmup,
                levels,
                MAX_TOKENS,
                ready_path=launch.ready_path,
                ready_timeout_s=args.ready_timeout,
                alive=lambda: proc.poll() is None,
                headers=launch.headers,
                transport=UsageTransport() if launch.count_chunks else None,
            )
        except LoadError as exc:
            if launch.name == AIRGATE and exc.status in (401, 403):
                raise BenchError(
                    f"the gateway refused the API key (HTTP {exc.status}): pass an app key with "
                    "--api-key or AIRGATE_BENCH_API_KEY, or leave both unset to have one created"
                ) from exc
            raise

    return run_served(launch.name, launch.command, launch.env, log_path, drive)
