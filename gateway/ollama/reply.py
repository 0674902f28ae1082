"""What chat and generate share on the way out: the pipeline's facts of a request, its answer
as NDJSON lines (streamed) or one object, and the answer to a "load the model" request.

The two routes differ only in where a line carries the text (`message.content` for chat,
`response` for generate): each passes a `Make` that builds its line, and the rest is here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from litestar import Request, Response
from litestar.response import Stream

from backends.types import GenerationDelta, ToolCallPiece, Usage

from ..errors import GatewayError, InvalidRequest
from ..http.authn import caller
from ..http.disconnect import disconnected
from ..http.request_log import RequestInfo
from ..pipeline import Action, Generation, Inference, InferenceRequest, Pipeline
from . import types as t
from .models import visible
from .ndjson import NDJSON, Timing, created_at, line, line_error
from .options import Mapped, Options, check_context
from .outputs import done_reason, tool_calls

__all__ = ["Make", "answer", "check_num_ctx", "facts", "loaded"]

# (created_at, text, tool calls) -> the route's line
Make = Callable[[str, str, list[t.OutToolCall] | None], t.Line]


def check_num_ctx(
    request: Request[Any, Any, Any], inference: Pipeline, model: str, options: Options | None
) -> None:
    """`options.num_ctx` within the model's context (checked only once the caller is known to
    see the model: a refusal must not reveal one it may not use)."""
    if options is None or options.num_ctx is None:
        return
    served = inference.models.resolve(model)
    visible(inference.security, caller(request), served)
    check_context(options, served.context_length)


def facts(
    request: Request[Any, Any, Any],
    log: RequestInfo,
    *,
    model: str,
    action: Action,
    raw: bytes,
    stream: bool,
    generation: Generation,
    options: Mapped,
    prompt_param: str,
) -> InferenceRequest:
    """The pipeline's facts of an Ollama generation (`raw`: the request body)."""
    return InferenceRequest(
        request_id=log.request_id,
        principal=caller(request),
        action=action,
        route=log.route,
        model=model,
        prompt_bytes=len(raw),
        stream=stream,
        generation=generation,
        sampling=options.audit,
        prompt_param=prompt_param,
        traceparent=request.headers.get("traceparent"),
    )


async def answer(
    request: Request[Any, Any, Any],
    inference: Pipeline,
    facts: InferenceRequest,
    log: RequestInfo,
    make: Make,
) -> Response[Any]:
    """Run `facts` through the pipeline; the answer as NDJSON lines or one JSON object."""
    timing = Timing(log.started)
    run = await inference.start(facts, log)
    if facts.stream:
        encoder = _Lines(make, timing, run)
        return Stream(run.stream(encoder), media_type=NDJSON, headers=run.headers)

    def render(per_choice: list[list[GenerationDelta]]) -> bytes:
        deltas = per_choice[0]
        final = deltas[-1]
        assert final.usage is not None
        text = "".join(d.text for d in deltas)
        reason = done_reason(final)
        pieces = [p for d in deltas for p in d.tool_calls]
        calls = tool_calls(pieces, cut=reason == "length") or None
        reply = make(created_at(), text, calls)
        return line(timing.final(reply, run, final.usage, reason))

    payload = await run.result(render, disconnected(request))
    return Response(payload, media_type="application/json", headers=run.headers)


def loaded(
    request: Request[Any, Any, Any], inference: Pipeline, log: RequestInfo, model: str, make: Make
) -> Response[Any]:
    """An empty request loads a model in Ollama: here every model is loaded from the start,
    so it is only checked (it exists, the caller may use it, it generates)."""
    timing = Timing(log.started)
    served = inference.models.resolve(model)
    visible(inference.security, caller(request), served)
    if served.task != "generate":
        raise InvalidRequest(
            "this model creates embeddings; it does not generate text", param="model"
        )
    reply = make(created_at(), "", None)
    reply.done, reply.done_reason = True, "load"
    reply.total_duration, reply.load_duration = timing.elapsed_ns(), 0
    return Response(line(reply), media_type="application/json")


class _Lines:
    """The stream: a line per piece of text, a line with the tool calls once they are whole,
    then the summary line (after the completion is audited), or an error line."""

    def __init__(self, make: Make, timing: Timing, run: Inference) -> None:
        self._make = make
        self._timing = timing
        self._run = run
        self._pieces: list[ToolCallPiece] = []
        self._reason = "stop"

    def opening(self) -> bytes:
        return b""

    def delta(self, index: int, delta: GenerationDelta) -> bytes:
        out = b""
        if delta.text:
            out = line(self._make(created_at(), delta.text, None))
        if delta.tool_calls:
            self._pieces.extend(delta.tool_calls)
        if delta.finish_reason is not None:
            self._reason = done_reason(delta)
            calls = tool_calls(self._pieces, cut=self._reason == "length")
            if calls:
                out += line(self._make(created_at(), "", calls))
        return out

    def closing(self, usage: Usage) -> bytes:
        reply = self._make(created_at(), "", None)
        return line(self._timing.final(reply, self._run, usage, self._reason))

    def failure(self, error: GatewayError) -> bytes:
        return line_error(error)
