"""POST /v1/responses, stateless: the Responses wire format <-> the pipeline's facts and events.

The request becomes the same `Generation` chat makes (`responses_input.py`); the pipeline's
deltas become output items: the text one `message` (`msg_<request id>`), each tool call one
`function_call` (`fc_...`, its `call_id` the pipeline's).  Streamed, OpenAI's event sequence:

    response.created, response.in_progress
    response.output_item.added (message), response.content_part.added,
        response.output_text.delta..., .output_text.done, .content_part.done, .output_item.done
    response.output_item.added (function_call), response.function_call_arguments.delta...,
        .function_call_arguments.done, .output_item.done               (per call)
    response.completed (or response.incomplete at max_output_tokens), with the whole output

every event numbered (`sequence_number`); a failure after the first byte is an `error` event
and `response.failed`.  Nothing is kept: the answer says `store: false`, and the routes that
would read a stored response answer 404 (`no_such_response`).
"""

from __future__ import annotations

import time
from typing import Any, Literal

import msgspec
from litestar import Request, Response, delete, get, post
from litestar.di import NamedDependency
from litestar.response import Stream

from backends.types import GenerationDelta, ToolCallPiece, Usage

from ..errors import GatewayError, NotFound
from ..http.authn import caller
from ..http.decode import decode
from ..http.disconnect import disconnected
from ..http.request_log import request_info
from ..pipeline import InferenceRequest, Pipeline
from . import responses_types as r
from .responses_input import KEPT_NOTHING, audit_sampling, generation, tools_of
from .sse import SSE_HEADERS

__all__ = [
    "cancel_response",
    "create_response",
    "delete_response",
    "get_response",
    "list_input_items",
]

_decoder = msgspec.json.Decoder(r.ResponseCreateRequest)
_encode = msgspec.json.Encoder().encode


@post("/v1/responses", status_code=200)
async def create_response(
    request: Request[Any, Any, Any], inference: NamedDependency[Pipeline]
) -> Response[Any]:
    """Create a model response (OpenAI-compatible, stateless; streaming with `stream: true`)."""
    log = request_info(request.scope)
    raw = await request.body()
    body = decode(_decoder, raw)
    tools = tools_of(body)
    facts = InferenceRequest(
        request_id=log.request_id,
        principal=caller(request),
        action="responses",
        route=log.route,
        model=body.model,
        prompt_bytes=len(raw),
        stream=bool(body.stream),
        generation=generation(body, tools),
        sampling=audit_sampling(body),
        prompt_param="input",
        traceparent=request.headers.get("traceparent"),
    )
    run = await inference.start(facts, log)
    head = _Head(log.request_id, run.model.id, body, tools)
    if body.stream:
        return Stream(
            run.stream(_ResponseStream(head)),
            media_type="text/event-stream",
            headers={**SSE_HEADERS, **run.headers},
        )

    def render(per_choice: list[list[GenerationDelta]]) -> bytes:
        deltas = per_choice[0]
        final = deltas[-1]
        assert final.usage is not None
        text = "".join(d.text for d in deltas)
        calls = _calls([p for d in deltas for p in d.tool_calls])
        return _encode(head.response(_output(head, text, calls, final), final.usage, final))

    payload = await run.result(render, disconnected(request))
    return Response(payload, media_type="application/json", headers=run.headers)


class _Head:
    """What every response object of one request says besides its output: ids and the
    request's settings, echoed as OpenAI echoes them."""

    def __init__(
        self,
        request_id: str,
        model: str,
        body: r.ResponseCreateRequest,
        tools: list[r.FunctionTool],
    ) -> None:
        self.id = f"resp_{request_id}"
        self.message_id = f"msg_{request_id}"
        self.created = int(time.time())
        self.model = model
        self.body = body
        self.tools = tools

    def response(
        self,
        output: list[r.OutputItem],
        usage: Usage | None,
        final: GenerationDelta | None,
        *,
        status: str | None = None,
        error: r.ResponseError | None = None,
    ) -> r.ResponseObject:
        body = self.body
        incomplete = final is not None and final.finish_reason == "length"
        if status is None:
            status = "incomplete" if incomplete else "completed"
        return r.ResponseObject(
            id=self.id,
            created_at=self.created,
            status=status,  # type: ignore[arg-type]
            model=self.model,
            output=output,
            usage=None if usage is None else _usage(usage),
            error=error,
            incomplete_details=r.IncompleteDetails("max_output_tokens") if incomplete else None,
            instructions=body.instructions,
            max_output_tokens=body.max_output_tokens,
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            tools=self.tools,
            tool_choice=body.tool_choice or "auto",
            parallel_tool_calls=body.parallel_tool_calls is not False,
            text=body.text or r.TextConfig(format=r.TextFormat()),
            metadata=body.metadata or {},
            truncation=body.truncation or "disabled",
            user=body.user,
        )


def _usage(usage: Usage) -> r.ResponseUsage:
    p, c = usage.prompt_tokens, usage.completion_tokens
    return r.ResponseUsage(input_tokens=p, output_tokens=c, total_tokens=p + c)


def _status(final: GenerationDelta) -> r.ItemStatus:
    return "incomplete" if final.finish_reason == "length" else "completed"


def _output(
    head: _Head, text: str, calls: list[r.FunctionCallItem], final: GenerationDelta
) -> list[r.OutputItem]:
    """The message (when there is text, or nothing else), then the calls."""
    output: list[r.OutputItem] = []
    if text or not calls:
        content = [r.OutputText(text)]
        output.append(r.MessageItem(head.message_id, _status(final), content))
    output.extend(calls)
    return output


def _call_item(piece: ToolCallPiece, status: r.ItemStatus = "completed") -> r.FunctionCallItem:
    call_id = piece.id or ""
    return r.FunctionCallItem(
        f"fc_{call_id.removeprefix('call_')}", call_id, piece.name or "", "", status
    )


def _calls(pieces: list[ToolCallPiece]) -> list[r.FunctionCallItem]:
    """Whole calls from their streamed pieces (the first piece names the call)."""
    calls: list[r.FunctionCallItem] = []
    for piece in pieces:
        if piece.id is not None:
            calls.append(_call_item(piece))
        else:
            calls[piece.index].arguments += piece.arguments
    return calls


def _event(event: r.StreamEvent) -> bytes:
    kind: str = type(event).__struct_config__.tag  # type: ignore[assignment]
    return b"event: " + kind.encode() + b"\ndata: " + _encode(event) + b"\n\n"


class _ResponseStream:
    """The Responses events of one answer.  Items open lazily: the message at the first text,
    a function_call at its call's first piece; each closes when the next begins or the
    generation ends; `response.completed` follows once the completion is audited."""

    def __init__(self, head: _Head) -> None:
        self._head = head
        self._seq = 0
        self._done: list[r.OutputItem] = []  # closed items, in output order
        self._text: list[str] | None = None  # the open message's text so far
        self._call: r.FunctionCallItem | None = None  # the open call
        self._final: GenerationDelta | None = None

    def _next(self) -> int:
        self._seq += 1
        return self._seq - 1

    def _lifecycle(self, kind: type[r.ResponseCreated | r.ResponseInProgress]) -> bytes:
        response = self._head.response([], None, None, status="in_progress")
        return _event(kind(sequence_number=self._next(), response=response))

    def opening(self) -> bytes:
        return self._lifecycle(r.ResponseCreated) + self._lifecycle(r.ResponseInProgress)

    def delta(self, index: int, delta: GenerationDelta) -> bytes:
        out = b""
        if delta.text:
            if self._text is None:
                out += self._close_call() + self._open_message()
            self._text.append(delta.text)  # type: ignore[union-attr]
            out += _event(
                r.OutputTextDelta(
                    sequence_number=self._next(),
                    item_id=self._head.message_id,
                    output_index=len(self._done),
                    content_index=0,
                    delta=delta.text,
                )
            )
        for piece in delta.tool_calls:
            if piece.id is not None:
                out += self._close_message() + self._close_call()
                self._call = _call_item(piece, "in_progress")
                out += _event(
                    r.OutputItemAdded(
                        sequence_number=self._next(),
                        output_index=len(self._done),
                        item=self._call,
                    )
                )
            elif self._call is not None and piece.arguments:
                self._call.arguments += piece.arguments
                out += _event(
                    r.FunctionCallArgumentsDelta(
                        sequence_number=self._next(),
                        item_id=self._call.id,
                        output_index=len(self._done),
                        delta=piece.arguments,
                    )
                )
        if delta.finish_reason is not None:
            self._final = delta
            if not self._done and self._text is None and self._call is None:
                out += self._open_message()  # nothing was said: an empty message
            out += self._close_message() + self._close_call()
        return out

    def _open_message(self) -> bytes:
        self._text = []
        index = len(self._done)
        item = r.MessageItem(self._head.message_id, "in_progress", [])
        added = r.OutputItemAdded(sequence_number=self._next(), output_index=index, item=item)
        part = r.ContentPartAdded(
            sequence_number=self._next(),
            item_id=item.id,
            output_index=index,
            content_index=0,
            part=r.OutputText(""),
        )
        return _event(added) + _event(part)

    def _close_message(self) -> bytes:
        if self._text is None:
            return b""
        text, self._text = "".join(self._text), None
        index, item_id = len(self._done), self._head.message_id
        status = "completed" if self._final is None else _status(self._final)
        item = r.MessageItem(item_id, status, [r.OutputText(text)])
        self._done.append(item)
        return b"".join(
            _event(e)
            for e in (
                r.OutputTextDone(
                    sequence_number=self._next(),
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    text=text,
                ),
                r.ContentPartDone(
                    sequence_number=self._next(),
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    part=r.OutputText(text),
                ),
                r.OutputItemDone(sequence_number=self._next(), output_index=index, item=item),
            )
        )

    def _close_call(self) -> bytes:
        call, self._call = self._call, None
        if call is None:
            return b""
        call.status = "completed"
        index = len(self._done)
        self._done.append(call)
        done = r.FunctionCallArgumentsDone(
            sequence_number=self._next(),
            item_id=call.id,
            output_index=index,
            arguments=call.arguments,
        )
        item = r.OutputItemDone(sequence_number=self._next(), output_index=index, item=call)
        return _event(done) + _event(item)

    def closing(self, usage: Usage) -> bytes:
        response = self._head.response(self._done, usage, self._final)
        kind = r.ResponseIncomplete if response.status == "incomplete" else r.ResponseCompleted
        return _event(kind(sequence_number=self._next(), response=response))

    def failure(self, error: GatewayError) -> bytes:
        """OpenAI's `error` event (our code), then `response.failed` (OpenAI's code)."""
        failed = self._head.response(
            self._done,
            None,
            None,
            status="failed",
            error=r.ResponseError(_failed_code(error), error.message, error.type, error.param),
        )
        first = r.ErrorEvent(
            sequence_number=self._next(),
            code=error.code or error.type,
            message=error.message,
            param=error.param,
        )
        return _event(first) + _event(
            r.ResponseFailed(sequence_number=self._next(), response=failed)
        )


def _failed_code(
    error: GatewayError,
) -> Literal["server_error", "rate_limit_exceeded", "invalid_prompt"]:
    if error.status_code == 429:
        return "rate_limit_exceeded"
    return "invalid_prompt" if 400 <= error.status_code < 500 else "server_error"


# ---- what would read a stored response: there is none ------------------------------------------


def _none_kept() -> NotFound:
    error = NotFound(f"No such response: {KEPT_NOTHING}.", param="response_id")
    error.code = "no_such_response"
    return error


@get("/v1/responses/{response_id:str}")
async def get_response() -> None:
    """Retrieve a response: airgate keeps none (404)."""
    raise _none_kept()


@delete("/v1/responses/{response_id:str}", status_code=200)
async def delete_response() -> None:
    """Delete a response: airgate keeps none (404)."""
    raise _none_kept()


@get("/v1/responses/{response_id:str}/input_items")
async def list_input_items() -> None:
    """List a response's input items: airgate keeps none (404)."""
    raise _none_kept()


@post("/v1/responses/{response_id:str}/cancel", status_code=200)
async def cancel_response() -> None:
    """Cancel a background response: airgate runs none (404)."""
    raise _none_kept()
