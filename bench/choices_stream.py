"""The choices scenario's requests: one ``n=4`` chat stream, or four ``n=1`` streams at once, of
the same prompt, timed per choice.

``run_mode`` sends either shape and returns a ``ModeResult``: the wall time from the first
request sent to the last stream ended, the completion tokens of the final usage chunks (an
``n=4`` stream reports the sum over its choices), and each choice's time to its first non-empty
content delta. Every choice must run to ``max_tokens`` (the end tokens are banned): the usage
is checked.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any, Literal

import httpx
import msgspec

from bench._client import LoadError, describe_error
from bench.edge_workload import BANNED_TOKENS

__all__ = ["CHAT_PATH", "Mode", "ModeResult", "chat_body", "run_mode"]

CHAT_PATH = "/v1/chat/completions"
Mode = Literal["n", "separate"]


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    index: int = 0
    delta: _Delta | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class _Error(msgspec.Struct):
    message: str = ""


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = []
    usage: _Usage | None = None
    error: _Error | None = None


_chunk = msgspec.json.Decoder(_Chunk)


class ModeResult(msgspec.Struct, frozen=True, kw_only=True):
    mode: Mode
    choices: int
    wall_s: float  # first request sent -> last stream ended
    completion_tokens: int  # all choices
    prompt_tokens: int  # of one request
    ttfts_s: list[float]  # per choice, in index / request order

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.wall_s


def chat_body(
    model: str, prompt: str, max_tokens: int, seed: int, n: int, stream: bool = True
) -> dict[str, Any]:
    """A chat body at temperature 1 with ``seed``, ``n`` choices, the end tokens banned."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "seed": seed,
        "n": n,
        "logit_bias": {str(token): -100 for token in BANNED_TOKENS},
    }
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


async def _stream(
    client: httpx.AsyncClient, body: Mapping[str, Any], start: float
) -> tuple[dict[int, float], int, int]:
    """First-content time of each choice (since ``start``), completion and prompt tokens."""
    first: dict[int, float] = {}
    usage = None
    try:
        async with client.stream("POST", CHAT_PATH, json=body) as response:
            if response.status_code != 200:
                error = describe_error(response.status_code, await response.aread())
                raise LoadError(error, response.status_code)
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = _chunk.decode(data)
                if chunk.error is not None:
                    raise LoadError(f"error event in stream: {chunk.error.message[:200]}")
                now = time.perf_counter() - start
                for choice in chunk.choices:
                    content = choice.delta.content if choice.delta else None
                    if content and choice.index not in first:
                        first[choice.index] = now
                if chunk.usage is not None:
                    usage = chunk.usage
    except httpx.HTTPError as exc:
        raise LoadError(f"{type(exc).__name__}: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise LoadError(f"malformed stream chunk: {exc}") from exc
    if usage is None:
        raise LoadError("stream ended without a usage chunk")
    return first, usage.completion_tokens, usage.prompt_tokens


async def run_mode(
    client: httpx.AsyncClient,
    mode: Mode,
    model: str,
    prompt: str,
    max_tokens: int,
    seed: int,
    choices: int,
) -> ModeResult:
    """``choices`` completions of ``prompt``: one request (``n``) or as many at once."""
    if mode == "n":
        bodies = [chat_body(model, prompt, max_tokens, seed, choices)]
    else:
        bodies = [chat_body(model, prompt, max_tokens, seed + i, 1) for i in range(choices)]
    start = time.perf_counter()
    streams = await asyncio.gather(*(_stream(client, b, start) for b in bodies))
    wall = time.perf_counter() - start
    if mode == "n":
        firsts = streams[0][0]
        ttfts = [firsts[i] for i in sorted(firsts)]
    else:
        ttfts = [min(s[0].values()) for s in streams if s[0]]
    tokens = sum(s[1] for s in streams)
    if len(ttfts) != choices or tokens != choices * max_tokens:
        raise LoadError(
            f"{mode}: {len(ttfts)} choices with content and {tokens} completion tokens, not "
            f"{choices} and {choices * max_tokens}; is logit_bias honoured?"
        )
    return ModeResult(mode=mode, choices=choices, wall_s=wall, completion_tokens=tokens,
                      prompt_tokens=streams[0][2], ttfts_s=ttfts)  # fmt: skip
