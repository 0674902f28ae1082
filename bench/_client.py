"""A small async load generator for OpenAI-compatible streaming endpoints.

``run_load`` sends a list of request bodies through a fixed number of workers (the concurrency
stays constant until the list runs out) and records, per request, the time to the first content
token and the token counts of the final usage chunk. It is deliberately thin (httpx + msgspec,
no SDK): on a 2-core machine the load generator shares the CPUs with the server it measures.

Errors::

    BenchError          a benchmark cannot produce a valid figure (the CLI prints it, exits 1)
    └── LoadError       a request failed: HTTP status, error event, or a stream without usage
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import httpx
import msgspec

__all__ = [
    "BenchError",
    "LoadError",
    "LoadResult",
    "RequestResult",
    "check_lengths",
    "chunk_decoder",
    "completion_body",
    "describe_error",
    "has_content",
    "in_workers",
    "run_load",
    "synthetic_prompts",
    "wait_ready",
]

T = TypeVar("T")
R = TypeVar("R")


class BenchError(Exception):
    """A benchmark cannot produce a valid figure."""


class LoadError(BenchError):
    """A request of the load failed; ``status`` is the HTTP status when there was one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class RequestResult(msgspec.Struct, frozen=True, kw_only=True):
    """One streamed request, as seen by the client."""

    ttft_s: float  # request sent -> first non-empty content delta
    duration_s: float  # request sent -> end of stream
    completion_tokens: int
    prompt_tokens: int
    finish_reason: str | None


class LoadResult(msgspec.Struct, frozen=True, kw_only=True):
    """A batch of requests sent at one concurrency."""

    concurrency: int
    wall_s: float  # first request sent -> last stream ended
    requests: tuple[RequestResult, ...]

    @property
    def completion_tokens(self) -> int:
        return sum(r.completion_tokens for r in self.requests)

    @property
    def tokens_per_s(self) -> float:
        """Aggregate generated tokens per second of wall time."""
        return self.completion_tokens / self.wall_s

    @property
    def ttfts(self) -> list[float]:
        return [r.ttft_s for r in self.requests]


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    text: str | None = None  # /v1/completions
    delta: _Delta | None = None  # /v1/chat/completions
    finish_reason: str | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class _ErrorBody(msgspec.Struct):
    message: str = ""
    type: str | None = None
    code: str | int | None = None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = []
    usage: _Usage | None = None
    error: _ErrorBody | None = None


class _ErrorEnvelope(msgspec.Struct):
    error: _ErrorBody


chunk_decoder = msgspec.json.Decoder(_Chunk)
_error_decoder = msgspec.json.Decoder(_ErrorEnvelope)


def has_content(choice: _Choice) -> bool:
    if choice.text:
        return True
    return choice.delta is not None and bool(choice.delta.content)


def describe_error(status: int, body: bytes) -> str:
    try:
        err = _error_decoder.decode(body).error
    except msgspec.DecodeError:
        return f"HTTP {status}"
    return f"HTTP {status} {err.type or ''}/{err.code or ''}: {err.message[:200]}"


async def _stream_one(
    client: httpx.AsyncClient, path: str, body: Mapping[str, Any]
) -> RequestResult:
    try:
        return await _stream(client, path, body)
    except httpx.HTTPError as exc:
        raise LoadError(f"{type(exc).__name__}: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise LoadError(f"malformed stream chunk: {exc}") from exc


async def _stream(client: httpx.AsyncClient, path: str, body: Mapping[str, Any]) -> RequestResult:
    start = time.perf_counter()
    ttft: float | None = None
    usage: _Usage | None = None
    finish: str | None = None
    async with client.stream("POST", path, json=body) as response:
        if response.status_code != 200:
            error = describe_error(response.status_code, await response.aread())
            raise LoadError(error, response.status_code)
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = chunk_decoder.decode(data)
            if chunk.error is not None:
                raise LoadError(f"error event in stream: {chunk.error.message[:200]}")
            for choice in chunk.choices:
                if ttft is None and has_content(choice):
                    ttft = time.perf_counter() - start
                finish = choice.finish_reason or finish
            if chunk.usage is not None:
                usage = chunk.usage
    duration = time.perf_counter() - start
    if usage is None:
        raise LoadError("stream ended without a usage chunk (stream_options.include_usage)")
    if ttft is None:
        raise LoadError("stream ended without any content")
    return RequestResult(
        ttft_s=ttft,
        duration_s=duration,
        completion_tokens=usage.completion_tokens,
        prompt_tokens=usage.prompt_tokens,
        finish_reason=finish,
    )


async def run_load(
    client: httpx.AsyncClient,
    path: str,
    bodies: Sequence[Mapping[str, Any]],
    concurrency: int,
) -> LoadResult:
    """Stream every body through ``concurrency`` workers; wall time covers the whole batch."""
    wall, results = await in_workers(
        concurrency, bodies, lambda body: _stream_one(client, path, body)
    )
    return LoadResult(concurrency=concurrency, wall_s=wall, requests=tuple(results))


async def in_workers(
    concurrency: int, items: Sequence[T], one: Callable[[T], Awaitable[R]]
) -> tuple[float, list[R]]:
    """``one(item)`` for every item, ``concurrency`` at a time: the wall time of the whole and
    the results in the items' order.  A LoadError stops the batch, naming how many failed."""
    pending: Iterator[tuple[int, T]] = iter(enumerate(items))
    results: dict[int, R] = {}

    async def worker() -> None:
        # next() on a shared iterator is safe: the event loop runs one worker at a time.
        for index, item in pending:
            results[index] = await one(item)

    start = time.perf_counter()
    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(concurrency):
                group.create_task(worker())
    except ExceptionGroup as failed:
        errors = [e for e in failed.exceptions if isinstance(e, LoadError)]
        if not errors:
            raise
        raise LoadError(
            f"{errors[0]} ({len(errors)} failed at concurrency {concurrency})", errors[0].status
        ) from failed
    return time.perf_counter() - start, [results[i] for i in range(len(items))]


def check_lengths(where: str, results: Sequence[RequestResult], max_tokens: int) -> None:
    """Raise BenchError unless every request generated exactly ``max_tokens`` tokens (usage)."""
    short = [r for r in results if r.completion_tokens != max_tokens]
    if short:
        seen = sorted({(r.completion_tokens, r.finish_reason) for r in short}, key=str)
        raise BenchError(
            f"{where}: {len(short)}/{len(results)} requests did not generate {max_tokens} tokens "
            f"(tokens, finish_reason: {seen}); is logit_bias honoured?"
        )


async def wait_ready(
    client: httpx.AsyncClient,
    path: str,
    deadline_s: float,
    alive: Callable[[], bool],
) -> float:
    """Poll ``path`` until it answers 200; returns the seconds waited.

    Raises BenchError when ``alive()`` turns false (the server exited) or the deadline passes.
    """
    start = time.monotonic()
    while True:
        if not alive():
            raise BenchError("server exited before it was ready")
        try:
            response = await client.get(path, timeout=2.0)
            if response.status_code == 200:
                return time.monotonic() - start
        except httpx.TransportError:
            pass  # not listening yet
        if time.monotonic() - start > deadline_s:
            raise BenchError(f"server not ready after {deadline_s:.0f} s")
        await asyncio.sleep(0.2)


def synthetic_prompts(seed: str, words: Sequence[str], length: int, count: int) -> list[str]:
    """`count` deterministic prompts of `length` words drawn from `words`, one sentence each;
    distinct seeds give distinct prompts (so no engine reuses a cached prefix)."""
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(words) for _ in range(length)).capitalize() + "." for _ in range(count)
    ]


def completion_body(
    model: str, prompt: str, max_tokens: int, banned: Sequence[int]
) -> dict[str, Any]:
    """A streamed, greedy `/v1/completions` body that must run to `max_tokens` (the `banned`
    end tokens get a logit bias of -100) and reports its usage."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logit_bias": {str(token): -100 for token in banned},
    }
