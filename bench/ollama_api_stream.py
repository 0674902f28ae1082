"""The ollama_api scenario's requests: one streamed chat through Ollama's API (``/api/chat``,
NDJSON) or OpenAI's (``/v1/chat/completions``, SSE), read by the same client loop.

Both APIs get the same prompt, the same length (``options.num_predict`` / ``max_tokens``),
temperature 0 and the same seed. Each stream is read line by line with httpx and tallied by a
pure parser (``NdjsonTally``, ``SseTally``; unit-tested on recorded streams):

- TTFT: request sent -> first line / chunk with non-empty content;
- tokens: what the server counted for the tokens it sent: Ollama's ``eval_count`` on its final
  ``done: true`` line, OpenAI's ``usage.completion_tokens`` (``stream_options.include_usage``);
- chunks: the lines / chunks that carried content, a cross-check: one per token, except for a
  token whose text the engine holds back (part of a UTF-8 character), so never more than the
  tokens and never none.

``run_batch`` streams a list of bodies through a fixed number of workers (the concurrency stays
constant until the list runs out), as ``bench._client.run_load`` does for SSE alone: both APIs
go through the same loop, so the client's own cost is the same for both.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import httpx
import msgspec

from bench._client import LoadError, describe_error, in_workers

__all__ = [
    "APIS",
    "PATHS",
    "Api",
    "ApiRequest",
    "Batch",
    "NdjsonTally",
    "SseTally",
    "Tally",
    "body",
    "run_batch",
]

Api = Literal["ollama", "openai"]
APIS: tuple[Api, Api] = ("ollama", "openai")
PATHS: dict[Api, str] = {"ollama": "/api/chat", "openai": "/v1/chat/completions"}


def body(api: Api, model: str, prompt: str, max_tokens: int, seed: int) -> dict[str, Any]:
    """The chat body a client of ``api`` sends: one user message, greedy, ``seed``, at most
    ``max_tokens`` tokens, streamed (Ollama streams by default: ``stream`` is left out)."""
    messages = [{"role": "user", "content": prompt}]
    if api == "ollama":
        options = {"num_predict": max_tokens, "temperature": 0, "seed": seed}
        return {"model": model, "messages": messages, "options": options}
    return {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


class Tally(msgspec.Struct, frozen=True, kw_only=True):
    """What one stream carried, as the client counted it."""

    ttft_s: float  # request sent -> first non-empty content
    tokens: int  # the server's count of the tokens it sent (eval_count / usage)
    chunks: int  # lines / chunks with non-empty content
    prompt_tokens: int
    finish: str | None  # done_reason / finish_reason


class _Message(msgspec.Struct):
    content: str = ""


class _Line(msgspec.Struct):
    """A line of Ollama's chat stream (only the fields counted here)."""

    done: bool = False
    message: _Message | None = None
    done_reason: str | None = None
    eval_count: int | None = None
    prompt_eval_count: int | None = None
    error: str | None = None


_line = msgspec.json.Decoder(_Line)


def _check(api: str, tally: Tally) -> Tally:
    if not 0 < tally.chunks <= tally.tokens:
        raise LoadError(
            f"{api}: {tally.chunks} content chunks for {tally.tokens} counted tokens "
            "(expected at least one, and at most one per token)"
        )
    return tally


class NdjsonTally:
    """Ollama's ``/api/chat`` NDJSON stream, fed line by line (``at``: seconds since the
    request was sent); ``result()`` once it ended."""

    __slots__ = ("_chunks", "_final", "_first")

    def __init__(self) -> None:
        self._first: float | None = None
        self._chunks = 0
        self._final: _Line | None = None

    def feed(self, at: float, raw: str | bytes) -> None:
        if not raw.strip():
            return
        if self._final is not None:
            raise LoadError("a line after the final done line")
        try:
            line = _line.decode(raw)
        except msgspec.DecodeError as exc:
            raise LoadError(f"malformed NDJSON line: {exc}") from exc
        if line.error is not None:
            raise LoadError(f"error line in stream: {line.error[:200]}")
        if line.message is not None and line.message.content:
            self._chunks += 1
            if self._first is None:
                self._first = at
        if line.done:
            self._final = line

    def result(self) -> Tally:
        final = self._final
        if final is None or final.eval_count is None:
            raise LoadError("stream ended without its final line (done: true, eval_count)")
        if self._first is None:
            raise LoadError("stream ended without any content")
        tally = Tally(ttft_s=self._first, tokens=final.eval_count, chunks=self._chunks,
                      prompt_tokens=final.prompt_eval_count or 0,
                      finish=final.done_reason)  # fmt: skip
        return _check("ollama", tally)


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    finish_reason: str | None = None


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


class SseTally:
    """OpenAI's ``/v1/chat/completions`` SSE stream, fed line by line, as ``NdjsonTally``."""

    __slots__ = ("_chunks", "_done", "_finish", "_first", "_usage")

    def __init__(self) -> None:
        self._first: float | None = None
        self._chunks = 0
        self._usage: _Usage | None = None
        self._finish: str | None = None
        self._done = False

    def feed(self, at: float, raw: str | bytes) -> None:
        text = raw.decode() if isinstance(raw, bytes) else raw
        if not text.startswith("data:"):
            return  # blank separators, comments
        data = text[5:].strip()
        if self._done:
            raise LoadError("an event after [DONE]")
        if data == "[DONE]":
            self._done = True
            return
        try:
            chunk = _chunk.decode(data)
        except msgspec.DecodeError as exc:
            raise LoadError(f"malformed stream chunk: {exc}") from exc
        if chunk.error is not None:
            raise LoadError(f"error event in stream: {chunk.error.message[:200]}")
        for choice in chunk.choices:
            if choice.delta is not None and choice.delta.content:
                self._chunks += 1
                if self._first is None:
                    self._first = at
            self._finish = choice.finish_reason or self._finish
        if chunk.usage is not None:
            self._usage = chunk.usage

    def result(self) -> Tally:
        if not self._done:
            raise LoadError("stream ended without data: [DONE]")
        if self._usage is None:
            raise LoadError("stream ended without a usage chunk (stream_options.include_usage)")
        if self._first is None:
            raise LoadError("stream ended without any content")
        tally = Tally(ttft_s=self._first, tokens=self._usage.completion_tokens,
                      chunks=self._chunks, prompt_tokens=self._usage.prompt_tokens,
                      finish=self._finish)  # fmt: skip
        return _check("openai", tally)


class ApiRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One streamed request: its tally and its duration (request sent -> end of stream)."""

    tally: Tally
    duration_s: float


class Batch(msgspec.Struct, frozen=True, kw_only=True):
    """A list of requests sent through one API at one concurrency; ``requests`` in the order
    of the bodies."""

    api: Api
    concurrency: int
    wall_s: float  # first request sent -> last stream ended
    requests: list[ApiRequest]

    @property
    def tokens(self) -> int:
        return sum(r.tally.tokens for r in self.requests)

    @property
    def chunks(self) -> int:
        return sum(r.tally.chunks for r in self.requests)

    @property
    def tokens_per_s(self) -> float:
        """Aggregate tokens received per second of wall time."""
        return self.tokens / self.wall_s

    @property
    def ttfts(self) -> list[float]:
        return [r.tally.ttft_s for r in self.requests]


async def _stream(client: httpx.AsyncClient, api: Api, body: Mapping[str, Any]) -> ApiRequest:
    tally = NdjsonTally() if api == "ollama" else SseTally()
    start = time.perf_counter()
    try:
        async with client.stream("POST", PATHS[api], json=body) as response:
            if response.status_code != 200:
                raw = await response.aread()
                raise LoadError(f"{api}: {_error(response.status_code, raw)}", response.status_code)
            async for line in response.aiter_lines():
                tally.feed(time.perf_counter() - start, line)
    except httpx.HTTPError as exc:
        raise LoadError(f"{api}: {type(exc).__name__}: {exc}") from exc
    duration = time.perf_counter() - start
    return ApiRequest(tally=tally.result(), duration_s=duration)


class _OllamaError(msgspec.Struct):
    error: str


def _error(status: int, raw: bytes) -> str:
    """An error answer in either API's shape (Ollama: ``{"error": "..."}``)."""
    try:
        return f"HTTP {status}: {msgspec.json.decode(raw, type=_OllamaError).error[:200]}"
    except msgspec.DecodeError:
        return describe_error(status, raw)


async def run_batch(
    client: httpx.AsyncClient, api: Api, bodies: Sequence[Mapping[str, Any]], concurrency: int
) -> Batch:
    """Stream every body through ``concurrency`` workers; wall time covers the whole batch."""
    wall, ordered = await in_workers(concurrency, bodies, lambda body: _stream(client, api, body))
    return Batch(api=api, concurrency=concurrency, wall_s=wall, requests=ordered)
