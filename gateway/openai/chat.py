"""POST /v1/chat/completions: the chat wire format <-> the pipeline's facts and events."""

from __future__ import annotations

import time
from collections.abc import Callable
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
        encoder = _ChatStream(
            response_id, created, model, run.sequences, usage, bool(body.logprobs)
        )
        return Stream(
            run.stream(encoder),
            media_type="text/event-stream",
            headers={**SSE_HEADERS, **run.headers},
        )

    def render(per_choice: list[list[GenerationDelta]]) -> bytes:
        choices = []
        prompt_tokens = completion_tokens = 0
        for index, deltas in enumerate(per_choice):
            final = deltas[-1]
            assert final.usage is not None
            prompt_tokens += final.usage.prompt_tokens  # counted on one choice only
            completion_tokens += final.usage.completion_tokens
            logprobs = None
            if body.logprobs:
                logprobs = t.ChatLogprobs([x for d in deltas for x in _logprobs(d.logprobs)])
            text = "".join(d.text for d in deltas)
            calls = _tool_calls([p for d in deltas for p in d.tool_calls])
            message = t.ResponseMessage(text or None if calls else text, None, calls or None)
            choices.append(t.ChatChoice(index, message, finish_reason(final), logprobs))
        return _encode(
            t.ChatCompletion(
                id=response_id,
                created=created,
                model=model,
                choices=choices,
                usage=t.UsageInfo(
                    prompt_tokens, completion_tokens, prompt_tokens + completion_tokens
                ),
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


class _ChatStream:
    """chat.completion.chunk events: each choice's role first, then its text (and logprobs),
    then its finish reason; usage (when asked) and [DONE] once the completion is audited."""

    def __init__(
        self,
        response_id: str,
        created: int,
        model: str,
        choices: int,
        include_usage: bool,
        logprobs: bool,
    ) -> None:
        self._id, self._created, self._model = response_id, created, model
        self._choices = choices
        self._include_usage = include_usage
        self._logprobs = logprobs

        def text_chunk(index: int) -> Callable[[str], t.ChatCompletionChunk]:
            return lambda text: t.ChatCompletionChunk(
                response_id, created, model, [t.ChunkChoice(index, t.Delta(content=text))]
            )

        self._text = [TextFrame(text_chunk(i)) for i in range(choices)]

    def _chunk(self, choices: list[t.ChunkChoice], usage: t.UsageInfo | None = None) -> bytes:
        return sse(
            t.ChatCompletionChunk(self._id, self._created, self._model, choices, usage=usage)
        )

    def opening(self) -> bytes:
        return b"".join(
            self._chunk([t.ChunkChoice(i, t.Delta(role="assistant", content=""))])
            for i in range(self._choices)
        )

    def delta(self, index: int, delta: GenerationDelta) -> bytes:
        out = b""
        if delta.tool_calls:
            if delta.text:
                out = self._text[index](delta.text)
            calls = [_call_delta(p) for p in delta.tool_calls]
            out += self._chunk([t.ChunkChoice(index, t.Delta(tool_calls=calls))])
        elif self._logprobs and delta.logprobs:
            logprobs = t.ChatLogprobs(_logprobs(delta.logprobs))
            out = self._chunk([t.ChunkChoice(index, t.Delta(content=delta.text), None, logprobs)])
        elif delta.text:
            out = self._text[index](delta.text)
        if delta.finish_reason is not None:
            out += self._chunk([t.ChunkChoice(index, t.Delta(), finish_reason(delta))])
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
