"""POST /v1/chat/completions."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from litestar import Request, Response, post
from litestar.di import NamedDependency
from litestar.response import Stream

from backends.types import ChatMessage, GenerationDelta, GenerationRequest, TokenLogprob

from ..errors import InvalidRequest, UnsupportedParameter
from ..reqlog import request_info
from . import types as t
from ._decode import decode
from ._pipeline import (
    SSE_DONE,
    SSE_HEADERS,
    Run,
    Services,
    TextFrame,
    finish_reason,
    sampling_params,
    sse,
    stop_strings,
)

__all__ = ["chat_completions"]

_decoder = msgspec.json.Decoder(t.ChatCompletionRequest)
_encode = msgspec.json.Encoder().encode


def _messages(body: t.ChatCompletionRequest) -> tuple[ChatMessage, ...]:
    out = []
    for i, m in enumerate(body.messages):
        if isinstance(m, t.ToolMessage):
            raise UnsupportedParameter(
                "tool messages are not supported (this server has no tool calling).",
                param=f"messages[{i}].role",
            )
        content = m.content
        if not isinstance(content, str):
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, t.TextPart):
                    raise UnsupportedParameter(
                        "only text content parts are supported by this model.",
                        param=f"messages[{i}].content[{j}].type",
                    )
                texts.append(part.text)
            content = "\n".join(texts)
        out.append(ChatMessage(type(m).__struct_config__.tag, content))  # type: ignore[arg-type]
    return tuple(out)


def _to_engine(
    body: t.ChatCompletionRequest, request_id: str, max_tokens: int | None
) -> GenerationRequest:
    if body.top_logprobs is not None and not body.logprobs:
        raise InvalidRequest("top_logprobs requires logprobs to be true.", param="top_logprobs")
    if body.stream_options is not None and not body.stream:
        raise InvalidRequest(
            "stream_options is only allowed when stream is true.", param="stream_options"
        )
    if (
        body.max_tokens
        and body.max_completion_tokens
        and body.max_tokens != body.max_completion_tokens
    ):
        raise InvalidRequest(
            "max_tokens and max_completion_tokens disagree; send one.", param="max_tokens"
        )
    return GenerationRequest(
        request_id=request_id,
        messages=_messages(body),
        max_tokens=max_tokens,
        stop=stop_strings(body.stop),
        sampling=sampling_params(body),
        logprobs=(body.top_logprobs or 0) if body.logprobs else None,
    )


def _logprobs(items: tuple[TokenLogprob, ...]) -> list[t.TokenInfo]:
    return [
        t.TokenInfo(
            token=lp.text.decode("utf-8", "replace"),
            logprob=lp.logprob if lp.logprob is not None else 0.0,
            bytes=list(lp.text),
            top_logprobs=[
                t.TopTokenInfo(txt.decode("utf-8", "replace"), v, list(txt)) for _, txt, v in lp.top
            ],
        )
        for lp in items
    ]


@post("/v1/chat/completions", status_code=200)
async def chat_completions(
    request: Request[Any, Any, Any], inference: NamedDependency[Services]
) -> Response[Any]:
    """Create a chat completion (OpenAI-compatible; streaming with `stream: true`)."""
    info = request_info(request.scope)
    raw = await request.body()
    body = decode(_decoder, raw)
    model = inference.models.resolve(body.model)
    asked = body.max_completion_tokens or body.max_tokens
    run = await Run.begin(
        request,
        body,
        raw,
        [_to_engine(body, info.request_id, asked)],
        model=model,
        info=info,
        services=inference,
        action="chat.completions",
        prompt_param="messages",
    )
    admitted = run.admitted
    response_id = f"chatcmpl-{info.request_id}"
    created = int(time.time())
    want_logprobs = body.logprobs
    if body.stream:
        usage = bool(body.stream_options and body.stream_options.include_usage)
        return Stream(
            _stream(run, response_id, created, model.id, usage, want_logprobs),
            media_type="text/event-stream",
            headers={**SSE_HEADERS, **admitted.headers},
        )
    deltas = (await run.collect(request))[0]
    final = deltas[-1]
    assert final.usage is not None
    logprobs = None
    if want_logprobs:
        logprobs = t.ChatLogprobs([x for d in deltas for x in _logprobs(d.logprobs)])
    completion = t.ChatCompletion(
        id=response_id,
        created=created,
        model=model.id,
        choices=[
            t.ChatChoice(
                0,
                t.ResponseMessage("assistant", "".join(d.text for d in deltas)),
                finish_reason(final),
                logprobs,
            )
        ],
        usage=_usage(final),
    )
    payload = _encode(completion)
    await run.complete(response_bytes=len(payload))
    return Response(payload, media_type="application/json", headers=admitted.headers)


def _usage(delta: GenerationDelta) -> t.UsageInfo:
    assert delta.usage is not None
    p, c = delta.usage.prompt_tokens, delta.usage.completion_tokens
    return t.UsageInfo(p, c, p + c)


async def _stream(
    run: Run, response_id: str, created: int, model: str, include_usage: bool, want_logprobs: bool
) -> AsyncIterator[bytes]:
    def chunk(choices: list[t.ChunkChoice], usage: t.UsageInfo | None = None) -> bytes:
        return sse(t.ChatCompletionChunk(response_id, created, model, choices, usage=usage))

    text_frame = TextFrame(
        lambda text: t.ChatCompletionChunk(
            response_id, created, model, [t.ChunkChoice(0, t.Delta(content=text))]
        )
    )
    yield chunk([t.ChunkChoice(0, t.Delta(role="assistant", content=""))])
    try:
        async for _, delta in run.deltas():
            if want_logprobs and delta.logprobs:
                logprobs = t.ChatLogprobs(_logprobs(delta.logprobs))
                yield chunk([t.ChunkChoice(0, t.Delta(content=delta.text), None, logprobs)])
            elif delta.text:
                yield text_frame(delta.text)
            if delta.finish_reason is not None:
                yield chunk([t.ChunkChoice(0, t.Delta(), finish_reason(delta))])
                await run.complete()  # audited before the usage chunk and [DONE]
                if include_usage:
                    yield chunk([], _usage(delta))
    except Exception as exc:
        yield run.stream_error(exc)
        return
    yield SSE_DONE
