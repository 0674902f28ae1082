"""The soak's request mix, and what became of each request.

``plan`` draws one request from a seeded ``random.Random``: ``/v1/chat/completions`` or
``/v1/completions`` (half each), streamed (``STREAM_SHARE``) or not, ``max_tokens`` from
``MAX_TOKENS``, temperature 0 or 0.8, a distinct prompt of ``PROMPT_WORDS`` words, the end tokens
banned. About ``ABANDON_SHARE`` of the streams are hung up on after a few chunks. ``send`` sends
it and returns an ``Outcome``: ``Done`` (200, usage, exactly ``max_tokens`` completion tokens),
``Abandoned`` (hung up on purpose), or ``Failure`` naming the kind of error.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec

from bench._client import (
    chunk_decoder,
    completion_body,
    describe_error,
    has_content,
    synthetic_prompts,
)
from bench.edge_workload import BANNED_TOKENS
from bench.llama_model import WORDS

__all__ = ["Abandoned", "Done", "Failure", "Outcome", "Planned", "plan", "send"]

MAX_TOKENS = (16, 64, 128)
PROMPT_WORDS = (20, 50, 100, 200, 300)
TEMPERATURES = (0.0, 0.8)
STREAM_SHARE = 0.7
ABANDON_SHARE = 0.05  # of the streams
ABANDON_AFTER = (1, 4)  # content chunks read before hanging up, inclusive range


@dataclass(frozen=True, slots=True)
class Planned:
    kind: str  # "chat" or "completion", with " stream" when streamed
    path: str
    body: dict[str, Any]
    max_tokens: int
    abandon_after: int | None  # content chunks to read before hanging up; None: read it all


def plan(rng: random.Random, model: str, prompt_seed: str) -> Planned:
    """One request of the mix; the same ``rng`` state and seed give the same request."""
    chat = rng.random() < 0.5
    stream = rng.random() < STREAM_SHARE
    max_tokens = rng.choice(MAX_TOKENS)
    prompt = synthetic_prompts(prompt_seed, WORDS, rng.choice(PROMPT_WORDS), 1)[0]
    body = completion_body(model, prompt, max_tokens, BANNED_TOKENS)
    body["temperature"] = rng.choice(TEMPERATURES)
    if not stream:
        body["stream"] = False
        del body["stream_options"]  # the gateway refuses it on a plain request, as OpenAI does
    if chat:
        body["messages"] = [{"role": "user", "content": body.pop("prompt")}]
    hang_up = stream and rng.random() < ABANDON_SHARE
    return Planned(
        kind=("chat" if chat else "completion") + (" stream" if stream else ""),
        path="/v1/chat/completions" if chat else "/v1/completions",
        body=body,
        max_tokens=max_tokens,
        abandon_after=rng.randint(*ABANDON_AFTER) if hang_up else None,
    )


class Done(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    kind: str
    end_s: float  # load start -> response complete
    e2e_s: float
    ttft_s: float | None  # streams: request sent -> first content chunk
    prompt_tokens: int
    completion_tokens: int


class Abandoned(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    kind: str
    end_s: float


class Failure(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    kind: str
    end_s: float
    error: str  # its kind: "HTTP 503", "wrong length", "ReadTimeout", ...
    detail: str


Outcome = Done | Abandoned | Failure


class _Failed(Exception):
    def __init__(self, error: str, detail: str) -> None:
        super().__init__(error)
        self.error, self.detail = error, detail


async def _stream(
    client: httpx.AsyncClient, req: Planned, start: float
) -> tuple[int, int, float] | None:
    """(prompt tokens, completion tokens, TTFT) of a stream; None once hung up on purpose."""
    ttft: float | None = None
    tokens: tuple[int, int] | None = None
    chunks = 0
    async with client.stream("POST", req.path, json=req.body) as response:
        if response.status_code != 200:
            error = describe_error(response.status_code, await response.aread())
            raise _Failed(f"HTTP {response.status_code}", error)
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = chunk_decoder.decode(data)
            if chunk.error is not None:
                raise _Failed("error event", chunk.error.message[:200])
            if any(has_content(choice) for choice in chunk.choices):
                chunks += 1
                ttft = time.monotonic() - start if ttft is None else ttft
                if req.abandon_after is not None and chunks >= req.abandon_after:
                    return None  # leaving the block closes the connection mid-stream
            if chunk.usage is not None:
                tokens = (chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
    if tokens is None:
        raise _Failed("no usage", "the stream ended without a usage chunk")
    if ttft is None:
        raise _Failed("no content", "the stream ended without any content")
    return (*tokens, ttft)


async def _post(client: httpx.AsyncClient, req: Planned) -> tuple[int, int]:
    """(prompt tokens, completion tokens) of a plain request."""
    response = await client.post(req.path, json=req.body)
    if response.status_code != 200:
        raise _Failed(
            f"HTTP {response.status_code}",
            describe_error(response.status_code, response.content),
        )
    usage = chunk_decoder.decode(response.content).usage
    if usage is None:
        raise _Failed("no usage", "the response carries no usage")
    return usage.prompt_tokens, usage.completion_tokens


async def send(client: httpx.AsyncClient, req: Planned, t0: float) -> Outcome:
    """Send one request; whatever goes wrong becomes a Failure naming its kind."""
    start = time.monotonic()
    ttft: float | None = None
    try:
        if req.body["stream"]:
            streamed = await _stream(client, req, start)
            if streamed is None:
                return Abandoned(kind=req.kind, end_s=time.monotonic() - t0)
            prompt, completion, ttft = streamed
        else:
            prompt, completion = await _post(client, req)
        if completion != req.max_tokens:
            raise _Failed("wrong length", f"{completion} completion tokens, not {req.max_tokens}")
    except _Failed as exc:
        error, detail = exc.error, exc.detail
    except httpx.HTTPError as exc:
        error, detail = type(exc).__name__, str(exc)[:200]
    except msgspec.DecodeError as exc:
        error, detail = "malformed JSON", str(exc)[:200]
    else:
        end = time.monotonic()
        return Done(
            kind=req.kind,
            end_s=end - t0,
            e2e_s=end - start,
            ttft_s=ttft,
            prompt_tokens=prompt,
            completion_tokens=completion,
        )
    return Failure(kind=req.kind, end_s=time.monotonic() - t0, error=error, detail=detail)
