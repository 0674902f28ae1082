"""The http scenario's servers: what each is sent, how each starts, one load point measured.

The bare route and LiteLLM's upstream are ``bench/bare_app.py`` under uvicorn; airgate serves
the echo engine with the configuration ``airgate_config`` writes (a policy whose caps and limits
are checked on every request and never reached, limits in Redis, the strict audit log); LiteLLM
is ``bench.peers_litellm``. Each server is pinned to its CPU, checked to answer the echo text
with usage and ``[DONE]`` before it is measured, and stopped after.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec

from bench import peers_litellm
from bench._client import BenchError, wait_ready
from bench._report import say
from bench._serve import free_port, inherited_env, serve_command, spawned, tail
from bench._wrk import Pinning, group_cpu_s, run_wrk, wait_idle

__all__ = [
    "CONNECTIONS",
    "CPU_CONNS",
    "LABELS",
    "LONG",
    "MODES",
    "SERVERS",
    "SHORT",
    "Point",
    "Setup",
    "Target",
    "airgate_command",
    "airgate_config",
    "bare_command",
    "measure",
    "request_body",
    "server",
    "server_env",
]

SERVERS = ("bare", "airgate", "litellm")
LABELS = {"bare": "bare Litestar route", "airgate": "airgate", "litellm": "LiteLLM"}
CONNECTIONS = (1, 8, 64)
SHORT, LONG = 16, 256  # max_tokens of the measured points; LONG only streamed, at CPU_CONNS
CPU_CONNS = 8
MODES = {"json": "non-streaming", "stream": "streaming"}
MESSAGE = "Say hello to the benchmark in one short sentence."
_TOKENS = tuple(f" tok{i}" for i in range(16))  # backends/echo.py's pattern


def request_body(stream: bool, max_tokens: int) -> str:
    """The chat body every server gets, as compact JSON."""
    body: dict[str, Any] = {
        "model": "echo",
        "messages": [{"role": "user", "content": MESSAGE}],
        "max_tokens": max_tokens,
    }
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return json.dumps(body, separators=(",", ":"))


# --- servers under test -------------------------------------------------------------------


class Point(msgspec.Struct, frozen=True, kw_only=True):
    """One measured load on one server."""

    server: str
    mode: str
    connections: int
    max_tokens: int
    requests: int
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    cpu_s: float  # the server's CPU time during the measured load

    @property
    def cpu_per_request_us(self) -> float:
        return self.cpu_s / self.requests * 1e6


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    url: str
    token: str
    pgid: int


@dataclass(frozen=True, slots=True)
class Setup:
    """What every run shares: CPUs, files, the airgate key, the LiteLLM virtualenv."""

    pin: Pinning
    work: Path
    logs: Path
    airgate_config: Path
    airgate_data: Path
    airgate_key: str
    litellm_venv: Path
    ready_timeout: float
    redis_url: str
    duration_s: int
    warmup_s: int


def bare_command(port: int) -> list[str]:
    return [sys.executable, "-m", "uvicorn", "bench.bare_app:app", "--host", "127.0.0.1",
            "--port", str(port), "--loop", "uvloop", "--http", "httptools", "--no-access-log",
            "--log-level", "warning"]  # fmt: skip


def airgate_command(setup: Setup, port: int) -> list[str]:
    return [*serve_command(), "serve", "--config", str(setup.airgate_config),
            "--port", str(port), "--data-dir", str(setup.airgate_data)]  # fmt: skip


def server_env() -> dict[str, str]:
    # airgate rejects unknown AIRGATE_* variables, and none may change the configuration
    return inherited_env("AIRGATE_")


def expected_text(max_tokens: int) -> str:
    return "".join(_TOKENS[i % len(_TOKENS)] for i in range(max_tokens))


def check_answers(target: Target) -> None:
    """One non-streaming and one streaming request: the echo text, usage and [DONE]."""
    headers = {"Authorization": f"Bearer {target.token}"} if target.token else {}
    url = f"{target.url}/v1/chat/completions"
    want = expected_text(SHORT)
    with httpx.Client(headers=headers, timeout=60.0) as client:
        response = client.post(url, content=request_body(False, SHORT))
        if response.status_code != 200:
            raise BenchError(f"HTTP {response.status_code}: {response.text[:300]}")
        data = response.json()
        text = data["choices"][0]["message"]["content"]
        if text != want or data["usage"]["completion_tokens"] != SHORT:
            raise BenchError(f"unexpected answer: {text!r}, usage {data.get('usage')}")
        pieces, usage, done = [], None, False
        with client.stream("POST", url, content=request_body(True, SHORT)) as stream:
            if stream.status_code != 200:
                raise BenchError(f"HTTP {stream.status_code} on a stream")
            for line in stream.iter_lines():
                payload = line.removeprefix("data: ")
                if not line.startswith("data: "):
                    continue
                if payload == "[DONE]":
                    done = True
                    break
                chunk = json.loads(payload)
                pieces += [c["delta"].get("content") or "" for c in chunk.get("choices", [])]
                usage = chunk.get("usage") or usage
    if "".join(pieces) != want or not done or not usage or usage["completion_tokens"] != SHORT:
        raise BenchError(f"unexpected stream: {''.join(pieces)!r}, usage {usage}, [DONE] {done}")


async def _ready(url: str, path: str, alive: Callable[[], bool], deadline_s: float) -> float:
    async with httpx.AsyncClient(base_url=url) as client:
        return await wait_ready(client, path, deadline_s, alive)


@contextlib.contextmanager
def _serving(
    name: str, command: Sequence[str], env: dict[str, str], port: int, path: str, setup: Setup,
    cpus: str, token: str = "",
) -> Iterator[Target]:  # fmt: skip
    """Start a server pinned to ``cpus``, wait for ``path``, check its answers, stop it after."""
    log = setup.logs / f"http-{name}.log"
    url = f"http://127.0.0.1:{port}"
    with spawned([*setup.pin.prefix(cpus), *command], env, log) as proc:
        try:
            asyncio.run(_ready(url, path, lambda: proc.poll() is None, setup.ready_timeout))
            target = Target(name, url, token, proc.pid)
            check_answers(target)
        except (BenchError, httpx.HTTPError, KeyError, ValueError) as exc:
            raise BenchError(f"{name}: {exc}\n--- last lines of {log} ---\n{tail(log)}") from exc
        yield target


@contextlib.contextmanager
def server(name: str, setup: Setup) -> Iterator[Target]:
    """The server ``name`` of SERVERS, started and ready (LiteLLM with its upstream)."""
    port = free_port()
    if name == "bare":
        with _serving(name, bare_command(port), server_env(), port, "/health", setup,
                      setup.pin.server) as target:  # fmt: skip
            yield target
    elif name == "airgate":
        command = airgate_command(setup, port)
        with _serving(name, command, server_env(), port, "/ready", setup, setup.pin.server,
                      setup.airgate_key) as target:  # fmt: skip
            yield target
    else:
        up_port = free_port()
        with _serving("upstream", bare_command(up_port), server_env(), up_port, "/health",
                      setup, setup.pin.load) as upstream:  # fmt: skip
            config = setup.work / "litellm.yaml"
            peers_litellm.write_config(config, upstream.url)
            key = peers_litellm.master_key()
            command = peers_litellm.command(setup.litellm_venv, config, port)
            env = peers_litellm.environment(key)
            with _serving(name, command, env, port, peers_litellm.READY_PATH, setup,
                          setup.pin.server, key) as target:  # fmt: skip
                yield target


def measure(target: Target, mode: str, connections: int, max_tokens: int, setup: Setup) -> Point:
    """A warm-up, then one measured load with the server's CPU time read around it."""
    body = request_body(mode == "stream", max_tokens)
    pin = setup.pin
    where = f"{target.name}, {MODES[mode]} {max_tokens} tokens at {connections} connections"
    try:
        run_wrk(target.url, target.token, body, connections, setup.warmup_s, pin, warm_up=True)
        wait_idle(target.pgid)
        before = group_cpu_s(target.pgid)
        result = run_wrk(target.url, target.token, body, connections, setup.duration_s, pin)
        cpu = group_cpu_s(target.pgid) - before
    except BenchError as exc:
        raise BenchError(f"{where}: {exc}") from exc
    lat = result.latency_us
    point = Point(
        server=target.name,
        mode=mode,
        connections=connections,
        max_tokens=max_tokens,
        requests=result.requests,
        rps=result.requests / (result.duration_us / 1e6),
        p50_ms=lat.p50 / 1e3,
        p90_ms=lat.p90 / 1e3,
        p99_ms=lat.p99 / 1e3,
        max_ms=lat.max / 1e3,
        cpu_s=cpu,
    )
    say(f"    {where}: {point.rps:,.0f} req/s, p50 {point.p50_ms:.2f} ms, "
        f"p99 {point.p99_ms:.2f} ms, {point.cpu_per_request_us:,.0f} µs CPU/request")  # fmt: skip
    return point


_POLICY = """\
name = "bench-http"
description = "The http benchmark: model echo; every cap and limit is checked, none is reached."

[[rules]]
name = "bench"
teams = ["*"]
roles = ["app"]
models = ["echo"]
max_tokens = 4096
max_n = 1
max_prompt_bytes = 1048576
requests_per_minute = 10000000
tokens_per_minute = 10000000000
concurrent_streams = 10000
audit_level = "metadata"
"""


def airgate_config(work: Path, redis_url: str) -> Path:
    """airgate.toml and its policy directory under ``work``: limits in Redis, strict audit."""
    policy = work / "policy"
    policy.mkdir(parents=True)
    (policy / "bench.toml").write_text(_POLICY)
    config = work / "airgate.toml"
    config.write_text(
        f"[policy]\npath = {json.dumps(str(policy))}\n\n"
        f'[limits]\nredis_url = {json.dumps(redis_url)}\nfail_mode = "open"\n\n'
        "[audit]\nstrict = true\n\n"
        '[[models]]\nid = "echo"\nengine = "echo"\n'
    )
    return config
