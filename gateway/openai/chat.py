"""POST /v1/chat/completions: the chat wire format <-> the pipeline's facts and events."""

from __future__ import annotations

import time
from typing import Any

import msgspec
from litestar import Request, Response, post
from litestar.di import NamedDependency
from litestar.response import Stream

from backends.types import GenerationDelta, TokenLogprob, ToolCallPiece, Usage

from ..errors import GatewayError, InvalidRequest, UnsupportedParameter
from ..http.decode import decode
from ..http.disconnect import disconnected
from ..http.request_log import RequestInfo, request_info
from ..pipeline import Generation, InferenceRequest, Pipeline
from . import types as t
from .outputs import messages, outputs
from .sampling import finish_reason, inference_request, sampling_params, stop_strings
from .sse import SSE_DONE, SSE_HEADERS, TextFrame, sse, sse_error

__all__ = ["chat_completions"]

_decoder = msgspec.json.Decoder(t.ChatCompletionRequest)
_encode = msgspec.json.Encoder().encode


def _facts(
    request: Request[Any, Any, Any], body: t.ChatCompletionRequest, raw: bytes, log: RequestInfo
) -> InferenceRequest:
    if body.top_logprobs is not None and not body.logprobs:
        raise InvalidRequest("top_logprobs requires logprobs to be true.", param="top_logprobs")
    if body.store:
        raise UnsupportedParameter(
            "store: true is not supported: this server never stores completions.", param="store"
        )
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
    shape = outputs(body)
    generation = Generation(
        messages=messages(body),
        tools=shape.tools,
        constraint=shape.constraint,
        output=shape.kind,
        tools_offered=shape.tools_offered,
        tool_calls=shape.tool_calls,
        max_tokens=body.max_completion_tokens or body.max_tokens,
        stop=stop_strings(body.stop),
        sampling=sampling_params(body),
        logprobs=(body.top_logprobs or 0) if body.logprobs else None,
    )
    return inference_request(
        request, log, body, raw, generation, action="chat.completions", prompt_param="messages"
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
    request: Request[Any, Any, Any], inference: NamedDependency[Pipeline]
) -> Response[Any]:
    """Create a chat completion (OpenAI-compatible; streaming with `stream: true`)."""
    log = request_info(request.scope)
    raw = await request.body()
    body = decode(_decoder, raw)
    run = await inference.start(_facts(request, body, raw, log), log)
    response_id = f"chatcmpl-{log.request_id}"
    created = int(time.time())
    model = run.model.id
    if body.stream:
        usage = bool(body.stream_options and body.stream_options.include_usage)
        encoder = _ChatStream(response_id, created, model, usage, bool(body.logprobs))
        return Stream(
            run.stream(encoder),
            media_type="text/event-stream",
            headers={**SSE_HEADERS, **run.headers},
        )

    def render(choices: list[list[GenerationDelta]]) -> bytes:
        deltas = choices[0]
        final = deltas[-1]
        logprobs = None
        if body.logprobs:
            logprobs = t.ChatLogprobs([x for d in deltas for x in _logprobs(d.logprobs)])
        text = "".join(d.text for d in deltas)
        calls = _tool_calls([p for d in deltas for p in d.tool_calls])
        message = t.ResponseMessage(text or None if calls else text, None, calls or None)
        return _encode(
            t.ChatCompletion(
                id=response_id,
                created=created,
                model=model,
                choices=[t.ChatChoice(0, message, finish_reason(final), logprobs)],
                usage=_usage(final),
            )
        )

    payload = await run.result(render, disconnected(request))
    return Response(payload, media_type="application/json", headers=run.headers)


def _tool_calls(pieces: list[ToolCallPiece]) -> list[t.ToolCall]:
    """Whole calls from their streamed pieces (the first piece names the call)."""
    calls: list[t.ToolCall] = []
    for piece in pieces:
        if piece.id is not None:
            calls.append(t.ToolCall(piece.id, t.ToolCallFunction(piece.name or "", "")))
        else:
            f = calls[piece.index].function
            f.arguments += piece.arguments
    return calls


def _usage(delta: GenerationDelta) -> t.UsageInfo:
    assert delta.usage is not None
    p, c = delta.usage.prompt_tokens, delta.usage.completion_tokens
    return t.UsageInfo(p, c, p + c)


class _ChatStream:
    """chat.completion.chunk events: the role first, then text (and logprobs), then the
    finish reason; usage (when asked) and [DONE] once the completion is audited."""

    def __init__(
        self, response_id: str, created: int, model: str, include_usage: bool, logprobs: bool
    ) -> None:
        self._id, self._created, self._model = response_id, created, model
        self._include_usage = include_usage
        self._logprobs = logprobs
        self._text = TextFrame(
            lambda text: t.ChatCompletionChunk(
                response_id, created, model, [t.ChunkChoice(0, t.Delta(content=text))]
            )
        )

    def _chunk(self, choices: list[t.ChunkChoice], usage: t.UsageInfo | None = None) -> bytes:
        return sse(
            t.ChatCompletionChunk(self._id, self._created, self._model, choices, usage=usage)
        )

    def opening(self) -> bytes:
        return self._chunk([t.ChunkChoice(0, t.Delta(role="assistant", content=""))])

    def delta(self, index: int, delta: GenerationDelta) -> bytes:
        out = b""
        if delta.tool_calls:
            if delta.text:
                out = self._text(delta.text)
            out += self._chunk(
                [t.ChunkChoice(0, t.Delta(tool_calls=[_call_delta(p) for p in delta.tool_calls]))]
            )
        elif self._logprobs and delta.logprobs:
            logprobs = t.ChatLogprobs(_logprobs(delta.logprobs))
            out = self._chunk([t.ChunkChoice(0, t.Delta(content=delta.text), None, logprobs)])
        elif delta.text:
            out = self._text(delta.text)
        if delta.finish_reason is not None:
            out += self._chunk([t.ChunkChoice(0, t.Delta(), finish_reason(delta))])
        return out

    def closing(self, usage: Usage) -> bytes:
        if not self._include_usage:
            return SSE_DONE
        p, c = usage.prompt_tokens, usage.completion_tokens
        return self._chunk([], t.UsageInfo(p, c, p + c)) + SSE_DONE

    def failure(self, error: GatewayError) -> bytes:
        return sse_error(error)


def _call_delta(piece: ToolCallPiece) -> t.ToolCallDelta:
    if piece.id is not None:  # the call's first piece: id, type and name, empty arguments
        return t.ToolCallDelta(
            piece.index, t.ToolCallFunctionDelta(piece.name, ""), piece.id, "function"
        )
    return t.ToolCallDelta(piece.index, t.ToolCallFunctionDelta(arguments=piece.arguments))
