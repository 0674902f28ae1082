"""A Responses request -> the pipeline's `Generation`: its input items as engine messages, its
tools, tool choice and `text.format` through the translation chat uses (`outputs.shape`).

    instructions          -> a system message, first
    input (a string)      -> one user message
    message items         -> user / system / developer / assistant messages (text parts joined)
    function_call         -> a tool call of the assistant turn it follows
    function_call_output  -> a tool message answering its `call_id`

Stateful or non-text inputs are refused naming the field (`input[i].type`, `tools[i].type`,
`input[i].content[j].type`): airgate keeps no responses to reference, runs no built-in tools and
serves text models.  No message repeats a value the client sent.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from backends.types import ChatMessage, MessageToolCall, SamplingParams

from ..errors import InvalidRequest, UnsupportedParameter
from ..http.decode import decode
from ..pipeline import Generation, OutputKind
from . import responses_types as r
from .outputs import RESPONSES_FIELDS, Tool, shape

__all__ = ["KEPT_NOTHING", "audit_sampling", "generation", "tools_of"]

T = TypeVar("T")

KEPT_NOTHING = "airgate keeps no responses: send the whole conversation as input items"
_head = msgspec.json.Decoder(r.ItemHead)
_input_message = msgspec.json.Decoder(r.InputMessage)
_assistant = msgspec.json.Decoder(r.AssistantInput)
_call = msgspec.json.Decoder(r.FunctionCallInput)
_call_output = msgspec.json.Decoder(r.FunctionCallOutputInput)
_function_tool = msgspec.json.Decoder(r.FunctionTool)


def generation(body: r.ResponseCreateRequest, tools: list[r.FunctionTool]) -> Generation:
    """The pipeline's `Generation` of a request (a 400 naming the field otherwise)."""
    _refuse_state(body)
    choice = body.tool_choice
    only = None
    if isinstance(choice, r.NamedFunction):
        only, choice = choice.name, "required"
    fmt = body.text.format if body.text is not None else None
    kind: OutputKind = "text"
    schema = None
    if isinstance(fmt, r.JsonObjectFormat):
        kind = "json_object"
    elif isinstance(fmt, r.JsonSchemaFormat):
        kind, schema = "json_schema", fmt.schema
    out = shape(
        [Tool(x.name, x.description, x.parameters) for x in tools],
        choice=choice,
        only=only,
        kind=kind,
        schema=schema,
        parallel=body.parallel_tool_calls if tools else None,
        fields=RESPONSES_FIELDS,
    )
    return Generation(
        messages=_messages(body),
        tools=out.tools,
        constraint=out.constraint,
        output=out.kind,
        tools_offered=out.tools_offered,
        tool_calls=out.tool_calls,
        max_tokens=body.max_output_tokens,
        sampling=SamplingParams(
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
        ),
    )


def audit_sampling(body: r.ResponseCreateRequest) -> dict[str, bool | int | float]:
    """The request's sampling parameters for the audit log: numbers and flags only."""
    out: dict[str, bool | int | float] = {"stream": bool(body.stream)}
    for name in ("temperature", "top_p", "max_output_tokens"):
        value = getattr(body, name)
        if value is not None:
            out[name] = value
    return out


def _refuse_state(body: r.ResponseCreateRequest) -> None:
    """What would need a stored response, a background job or a reasoning model."""
    if body.store:
        raise UnsupportedParameter(f"store: true is not supported: {KEPT_NOTHING}.", param="store")
    if body.previous_response_id is not None:
        raise UnsupportedParameter(
            f"previous_response_id is not supported: {KEPT_NOTHING}.", param="previous_response_id"
        )
    if body.conversation is not None:
        raise UnsupportedParameter(
            f"conversation is not supported: {KEPT_NOTHING}.", param="conversation"
        )
    if body.background:
        raise UnsupportedParameter(
            "background: true is not supported: airgate keeps no responses to poll later; "
            "use stream: true for long answers.",
            param="background",
        )
    if body.prompt is not None:
        raise UnsupportedParameter(
            "prompt templates are not supported: airgate stores none; send instructions and "
            "input instead.",
            param="prompt",
        )
    if body.reasoning is not None and (
        body.reasoning.effort not in (None, "none")
        or body.reasoning.summary is not None
        or body.reasoning.generate_summary is not None
    ):
        raise UnsupportedParameter(
            "reasoning is not supported by this model.", param="reasoning.effort"
        )
    if body.include:
        raise UnsupportedParameter(
            "include is not supported: this server adds no optional output data.",
            param="include",
        )
    if body.top_logprobs:
        raise UnsupportedParameter(
            "top_logprobs is not supported on /v1/responses.", param="top_logprobs"
        )
    if body.max_tool_calls is not None:
        raise UnsupportedParameter("max_tool_calls is not supported.", param="max_tool_calls")


def tools_of(body: r.ResponseCreateRequest) -> list[r.FunctionTool]:
    """The request's function tools (anything else is refused by its type)."""
    tools = []
    for i, raw in enumerate(body.tools or ()):
        where = f"tools[{i}]"
        if _item(_head, raw, where).type != "function":
            raise UnsupportedParameter(
                "only function tools are supported: this server runs no built-in tools "
                "(web search, file search, code interpreter, ...).",
                param=f"{where}.type",
            )
        tools.append(_item(_function_tool, raw, where))
    return tools


def _messages(body: r.ResponseCreateRequest) -> tuple[ChatMessage, ...]:
    out: list[ChatMessage] = []
    if body.instructions:
        out.append(ChatMessage("system", body.instructions))
    if isinstance(body.input, str):
        out.append(ChatMessage("user", body.input))
        return tuple(out)
    turn: _Turn | None = None  # the assistant turn being read (its text, then its calls)
    for i, raw in enumerate(body.input):
        where = f"input[{i}]"
        head = _item(_head, raw, where)
        kind = head.type if head.type is not None else "message" if head.role else None
        if kind == "function_call":
            call = _item(_call, raw, where)
            turn = turn or _Turn()
            turn.calls.append(MessageToolCall(call.call_id, call.name, call.arguments))
            continue
        if kind == "message" and head.role == "assistant":
            if turn is not None and turn.calls:  # a new turn after calls and their results
                out.append(turn.message())
                turn = None
            turn = turn or _Turn()
            turn.texts.append(_assistant_text(_item(_assistant, raw, where), where))
            continue
        if turn is not None:
            out.append(turn.message())
            turn = None
        if kind == "message":
            message = _item(_input_message, raw, where)
            out.append(ChatMessage(message.role, _text(message.content, f"{where}.content")))
        elif kind == "function_call_output":
            result = _item(_call_output, raw, where)
            text = _text(result.output, f"{where}.output")
            out.append(ChatMessage("tool", text, tool_call_id=result.call_id))
        elif kind == "item_reference":
            raise UnsupportedParameter(
                f"item references are not supported: {KEPT_NOTHING}.", param=f"{where}.type"
            )
        elif kind is None:
            raise InvalidRequest("each input item needs a type (or a role).", param=where)
        else:
            raise UnsupportedParameter(
                "only message, function_call and function_call_output input items are supported.",
                param=f"{where}.type",
            )
    if turn is not None:
        out.append(turn.message())
    return tuple(out)


class _Turn:
    """An assistant turn as Responses splits it: message items, then function_call items."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.calls: list[MessageToolCall] = []

    def message(self) -> ChatMessage:
        text = "\n".join(t for t in self.texts if t)
        return ChatMessage("assistant", text, tool_calls=tuple(self.calls))


def _assistant_text(message: r.AssistantInput, where: str) -> str:
    if isinstance(message.content, str):
        return message.content
    texts = []
    for part in message.content:
        texts.append(part.refusal if isinstance(part, r.RefusalInput) else part.text)
    if not any(texts):
        raise InvalidRequest("an assistant message needs text.", param=f"{where}.content")
    return "\n".join(texts)


def _text(content: str | list[r.InputContent], where: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, r.InputText):
            raise UnsupportedParameter(
                "only text input is supported by this model.", param=f"{where}[{j}].type"
            )
        texts.append(part.text)
    return "\n".join(texts)


def _item(decoder: msgspec.json.Decoder[T], raw: msgspec.Raw, where: str) -> T:
    """One raw item decoded, its errors naming the field from the request's root."""
    try:
        return decode(decoder, bytes(raw))
    except InvalidRequest as exc:
        inner = exc.param
        param = f"{where}.{inner}" if inner else where
        if inner:
            message = exc.message.replace(f"'{inner}'", f"'{param}'")
        else:
            message = exc.message.replace("the request body", f"'{where}'")
            message = message.replace("The request body", f"'{where}'")
        raise type(exc)(message, param=param) from None
