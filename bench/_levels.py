"""A streaming server under test, loaded level by level (the edge and vllm scenarios).

``drive_levels`` waits until the server is ready, sends the warm-up, then streams each
concurrency level's bodies through ``run_load`` at that concurrency; every request must generate
exactly ``max_tokens`` tokens (``check_lengths``). Start the server around it with
``bench._serve.run_served``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx
import msgspec

from bench._client import LoadResult, check_lengths, run_load, wait_ready
from bench._report import percentile, say

__all__ = ["Body", "ServerOutcome", "drive_levels"]

Body = Mapping[str, Any]


class ServerOutcome(msgspec.Struct, frozen=True, kw_only=True):
    ready_s: float  # process start -> ready (with ``warmup_in_ready``: and the warm-up answered)
    levels: list[LoadResult]


async def drive_levels(
    base_url: str,
    label: str,
    warmup: Sequence[Body],
    levels: Mapping[int, Sequence[Body]],
    max_tokens: int,
    *,
    ready_path: str,
    ready_timeout_s: float,
    alive: Callable[[], bool],
    headers: Mapping[str, str] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    warmup_in_ready: bool = False,
) -> ServerOutcome:
    """Ready, warm-up (one request at a time), then every level in order: ``levels`` maps a
    concurrency to the bodies sent at it."""
    most = max(levels)
    async with httpx.AsyncClient(
        base_url=base_url,
        headers=dict(headers or {}),
        timeout=httpx.Timeout(900.0, connect=10.0),
        limits=httpx.Limits(max_connections=most + 4, max_keepalive_connections=most),
        transport=transport,
    ) as client:
        ready_s = await wait_ready(client, ready_path, ready_timeout_s, alive)
        warm = await run_load(client, "/v1/completions", warmup, 1)
        check_lengths(f"{label} warm-up", warm.requests, max_tokens)
        if warmup_in_ready:
            ready_s += warm.wall_s
        results = []
        for level, bodies in levels.items():
            result = await run_load(client, "/v1/completions", bodies, level)
            check_lengths(f"{label} at concurrency {level}", result.requests, max_tokens)
            say(
                f"  {label} at concurrency {level}: {result.tokens_per_s:.1f} tok/s, "
                f"TTFT p50 {percentile(result.ttfts, 50) * 1000:.1f} ms"
            )
            results.append(result)
    return ServerOutcome(ready_s=ready_s, levels=results)
