"""The smallest honest OpenAI-compatible chat route: the baseline of the "http" scenario.

``POST /v1/chat/completions`` on Litestar, the body read raw and decoded by one module-level
msgspec Decoder (as airgate's handler does), answering what airgate's echo engine answers: the
tokens ``" tok0"`` .. ``" tok15"`` repeated, ``max_tokens`` of them (default 16), with the echo
engine's stand-in prompt count (1 + prompt characters / 4).  The bodies are airgate's, byte for
byte but for ids and timestamps: a ``chat.completion`` with usage; with ``stream: true`` a role
chunk, one SSE chunk per token (an ``await asyncio.sleep(0)`` between tokens, the token boundary
the echo engine has too), a finish chunk, a usage chunk when ``stream_options.include_usage``,
then ``data: [DONE]``.  (Headers differ: airgate adds a request id and rate-limit headers.)

Nothing else: no auth, policy, limits, audit log, metrics or request log.  Unknown request
fields are ignored (LiteLLM, which forwards to this app, adds some of its own).

Run it as the scenario does::

    python -m uvicorn bench.bare_app:app --host 127.0.0.1 --port 8001 \
        --loop uvloop --http httptools --no-access-log --log-level warning
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from litestar import Litestar, Request, Response, get, post
from litestar.response import Stream

__all__ = ["app"]

_PIECES = tuple(f" tok{i}" for i in range(16))  # backends/echo.py's pattern
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_DONE = b"data: [DONE]\n\n"


class _TextPart(msgspec.Struct):
    text: str = ""


class _Message(msgspec.Struct):
    role: str
    content: str | list[_TextPart] | None = None


class _StreamOptions(msgspec.Struct):
    include_usage: bool = False


class _ChatRequest(msgspec.Struct):
    model: str
    messages: list[_Message]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stream: bool = False
    stream_options: _StreamOptions | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class _ResponseMessage(msgspec.Struct):
    role: str
    content: str


class _Choice(msgspec.Struct):
    index: int
    message: _ResponseMessage
    finish_reason: str
    logprobs: None = None


class _Completion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[_Choice]
    usage: _Usage
    object: str = "chat.completion"
    system_fingerprint: None = None


class _Delta(msgspec.Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None


class _ChunkChoice(msgspec.Struct):
    index: int
    delta: _Delta
    finish_reason: str | None = None
    logprobs: None = None


class _Chunk(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[_ChunkChoice]
    object: str = "chat.completion.chunk"
    usage: _Usage | None = None


_decoder = msgspec.json.Decoder(_ChatRequest)
_encode = msgspec.json.Encoder().encode


def _prompt_tokens(messages: list[_Message]) -> int:
    size = 0
    for m in messages:
        if isinstance(m.content, str):
            size += len(m.content)
        elif m.content is not None:
            size += len("\n".join(part.text for part in m.content))
    return 1 + size // 4


def _sse(chunk: _Chunk) -> bytes:
    return b"data: " + _encode(chunk) + b"\n\n"


async def _stream(
    response_id: str, created: int, body: _ChatRequest, n: int, prompt: int
) -> AsyncIterator[bytes]:
    def chunk(choices: list[_ChunkChoice], usage: _Usage | None = None) -> bytes:
        return _sse(_Chunk(response_id, created, body.model, choices, usage=usage))

    yield chunk([_ChunkChoice(0, _Delta(role="assistant", content=""))])
    for i in range(n):
        if i:
            await asyncio.sleep(0)
        yield chunk([_ChunkChoice(0, _Delta(content=_PIECES[i % len(_PIECES)]))])
    yield chunk([_ChunkChoice(0, _Delta(), "length")])
    if body.stream_options is not None and body.stream_options.include_usage:
        yield chunk([], _Usage(prompt, n, prompt + n))
    yield _DONE


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request[Any, Any, Any]) -> Response[Any]:
    """Answer like airgate's echo engine, with no access control at all."""
    try:
        body = _decoder.decode(await request.body())
    except msgspec.DecodeError as exc:
        error = {"message": str(exc), "type": "invalid_request_error"}
        return Response({"error": error}, status_code=400)
    n = body.max_completion_tokens or body.max_tokens or 16
    prompt = _prompt_tokens(body.messages)
    response_id = f"chatcmpl-{secrets.token_hex(12)}"
    created = int(time.time())
    if body.stream:
        return Stream(
            _stream(response_id, created, body, n, prompt),
            media_type="text/event-stream",
            headers=_SSE_HEADERS,
        )
    text = "".join(_PIECES[i % len(_PIECES)] for i in range(n))
    completion = _Completion(
        response_id,
        created,
        body.model,
        [_Choice(0, _ResponseMessage("assistant", text), "length")],
        _Usage(prompt, n, prompt + n),
    )
    return Response(_encode(completion), media_type="application/json")


@get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


app = Litestar(
    route_handlers=[chat_completions, health],
    openapi_config=None,
    debug=False,
    logging_config=None,
)
