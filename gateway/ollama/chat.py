"""POST /api/chat: Ollama's chat <-> the pipeline's facts (action "chat.completions", so a
policy applies to it as to /v1/chat/completions) and its events as NDJSON lines."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, post
from litestar.di import NamedDependency

from ..http.decode import decode
from ..http.request_log import request_info
from ..pipeline import Generation, Pipeline
from . import types as t
from .options import mapped
from .outputs import messages, outputs, refuse_unsupported
from .reply import Make, answer, check_num_ctx, facts, loaded

__all__ = ["chat"]

_decoder = msgspec.json.Decoder(t.ChatRequest)


def _line(model: str) -> Make:
    def make(when: str, text: str, calls: list[t.OutToolCall] | None) -> t.ChatReply:
        return t.ChatReply(
            model=model, created_at=when, done=False, message=t.OutMessage("assistant", text, calls)
        )

    return make


@post("/api/chat", status_code=200)
async def chat(
    request: Request[Any, Any, Any], inference: NamedDependency[Pipeline]
) -> Response[Any]:
    """Chat (Ollama-compatible): NDJSON lines unless `stream` is false."""
    log = request_info(request.scope)
    raw = await request.body()
    body = decode(_decoder, raw)
    refuse_unsupported(body.think, body.logprobs, body.top_logprobs)
    make = _line(body.model)
    if not body.messages:
        return loaded(request, inference, log, body.model, make)
    check_num_ctx(request, inference, body.model, body.options)
    stream = body.stream is not False
    options = mapped(body.options, stream=stream)
    shape = outputs(body.format, body.tools)
    generation = Generation(
        messages=messages(body.messages),
        tools=shape.tools,
        constraint=shape.constraint,
        output=shape.kind,
        tools_offered=shape.tools_offered,
        tool_calls=shape.tool_calls,
        max_tokens=options.max_tokens,
        stop=options.stop,
        sampling=options.sampling,
    )
    inference_request = facts(
        request,
        log,
        model=body.model,
        action="chat.completions",
        raw=raw,
        stream=stream,
        generation=generation,
        options=options,
        prompt_param="messages",
    )
    return await answer(request, inference, inference_request, log, make)
