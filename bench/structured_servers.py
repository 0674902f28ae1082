"""The structured scenario's HTTP part: airgate and ``llama-server`` serving the same Gemma GGUF,
the same constrained chat bodies at concurrency ``CONCURRENCY``.

Both start as the edge scenario starts them (``bench.edge_servers``: ``airgate serve`` with its
in-process llama.cpp engine and an app key, ``llama-server`` built from the llama.cpp airgate's
llama-cpp-python vendors), one at a time. Every body is a streamed ``/v1/chat/completions``
with ``response_format: {"type": "json_schema", "json_schema": {"name", "strict", "schema"}}``,
which both take as is (llama-server's ``oaicompat_chat_params_parse`` turns
``response_format.json_schema.schema`` into its grammar). After each start, one non-streamed
warm-up request (it compiles the grammar) whose answer must start as the schema says: a server
that ignored the schema would fail here, not pass unconstrained.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import msgspec

from bench._client import LoadError, LoadResult, check_lengths, describe_error, run_load, wait_ready
from bench._report import percentile, say
from bench._serve import run_served
from bench.edge_servers import Launch
from bench.edge_workload import BANNED_TOKENS

__all__ = [
    "CHAT_PATH",
    "CONCURRENCY",
    "MAX_TOKENS",
    "HttpOutcome",
    "chat_body",
    "requests_per_round",
    "run_http",
]

CHAT_PATH = "/v1/chat/completions"
CONCURRENCY = 8
MAX_TOKENS = 128
_STARTS = re.compile(r'\s*\{\s*"people"\s*:\s*\[')


class HttpOutcome(msgspec.Struct, frozen=True, kw_only=True):
    server: str
    ready_s: float  # process start -> ready
    warmup_s: float  # the non-streamed warm-up request (it compiles the grammar)
    result: LoadResult


def requests_per_round(quick: bool) -> int:
    """Two waves at full concurrency (one in --quick)."""
    return CONCURRENCY if quick else 2 * CONCURRENCY


def chat_body(prompt: str, model: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    """The streamed chat body both servers get: greedy, ``MAX_TOKENS`` tokens (the end tokens
    banned as in the edge scenario; the schema's ``minItems`` cannot be met sooner anyway)."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": f"{prompt} List the people in it as JSON."}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logit_bias": {str(token): -100 for token in BANNED_TOKENS},
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "people", "strict": True, "schema": dict(schema)},
        },
    }


async def _warm_up(client: httpx.AsyncClient, label: str, body: Mapping[str, Any]) -> float:
    """One non-streamed request; its answer must be constrained and run to ``MAX_TOKENS``."""
    plain = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    start = time.perf_counter()
    try:
        response = await client.post(CHAT_PATH, json=plain)
    except httpx.HTTPError as exc:
        raise LoadError(f"{label} warm-up: {type(exc).__name__}: {exc}") from exc
    elapsed = time.perf_counter() - start
    if response.status_code != 200:
        error = describe_error(response.status_code, response.content)
        raise LoadError(f"{label} warm-up: {error}", response.status_code)
    data = response.json()
    content = data["choices"][0]["message"].get("content") or ""
    tokens = data.get("usage", {}).get("completion_tokens")
    if not _STARTS.match(content):
        raise LoadError(f"{label} did not follow the schema ({len(content)} characters)")
    if tokens != MAX_TOKENS:
        raise LoadError(f"{label} warm-up generated {tokens} tokens, not {MAX_TOKENS}")
    return elapsed


def run_http(
    args: argparse.Namespace, launch: Launch, bodies: Sequence[Mapping[str, Any]], log_path: Path
) -> HttpOutcome:
    """Start one server, warm it up with ``bodies[0]``, stream ``bodies[1:]`` at
    ``CONCURRENCY``, stop it."""

    async def drive(proc: subprocess.Popen[bytes]) -> HttpOutcome:
        async with httpx.AsyncClient(
            base_url=launch.base_url,
            headers=launch.headers,
            timeout=httpx.Timeout(900.0, connect=10.0),
            limits=httpx.Limits(max_connections=CONCURRENCY + 4),
        ) as client:
            alive = lambda: proc.poll() is None  # noqa: E731
            ready_s = await wait_ready(client, launch.ready_path, args.ready_timeout, alive)
            warmup_s = await _warm_up(client, launch.name, bodies[0])
            result = await run_load(client, CHAT_PATH, bodies[1:], CONCURRENCY)
        check_lengths(f"{launch.name} at concurrency {CONCURRENCY}", result.requests, MAX_TOKENS)
        say(
            f"  {launch.name}: {result.tokens_per_s:.1f} tok/s constrained at concurrency "
            f"{CONCURRENCY}, TTFT p50 {percentile(result.ttfts, 50):.2f} s"
        )
        return HttpOutcome(server=launch.name, ready_s=ready_s, warmup_s=warmup_s, result=result)

    return run_served(launch.name, launch.command, launch.env, log_path, drive)
