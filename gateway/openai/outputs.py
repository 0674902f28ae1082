"""The chat request's tools, tool_choice and response_format -> the pipeline's protocol-neutral
output facts (tools for the prompt, the constraint the engine enforces, what the audit counts),
and its conversation -> engine messages (tool calls and results included).

Every schema is checked here (`backends.structured`), before admission: a schema that is not
a schema, too large, recursive or asking for what cannot be enforced gets a 400 naming the
field, and nothing is generated, audited as admitted, or stored.
"""

from __future__ import annotations

import json

import msgspec

from backends.errors import InvalidGenerationRequest
from backends.structured import ANY_JSON_OBJECT, check_schema
from backends.tool_calls import TRIGGER, CallMode, calls_or_response_schema, calls_schema
from backends.types import ChatMessage, MessageToolCall, OutputConstraint, ToolDefinition

from ..errors import InvalidRequest, UnsupportedParameter
from ..pipeline import OutputKind
from . import types as t

__all__ = ["Outputs", "messages", "outputs"]

_NO_PARAMETERS = '{"type":"object","properties":{}}'


class Outputs(msgspec.Struct, frozen=True):
    tools: tuple[ToolDefinition, ...]
    constraint: OutputConstraint | None
    kind: OutputKind
    tools_offered: int  # for the audit: tools sent, whatever tool_choice made of them
    tool_calls: CallMode | None  # where calls are read from the output (None: no calls)


def outputs(body: t.ChatCompletionRequest) -> Outputs:
    """What the request asks of the output's shape (a 400 naming the field otherwise)."""
    tools = _tools(body.tools or [])
    choice = body.tool_choice
    fmt = body.response_format
    kind: OutputKind = "text"
    constraint = None
    if isinstance(fmt, t.JsonObjectFormat):
        kind, constraint = "json_object", OutputConstraint(ANY_JSON_OBJECT)
    elif isinstance(fmt, t.JsonSchemaFormat):
        kind = "json_schema"
        spec = fmt.json_schema.schema
        text = (
            ANY_JSON_OBJECT
            if spec is None
            else _checked(spec, "response_format.json_schema.schema")
        )
        constraint = OutputConstraint(text)
    if choice is not None and not tools:
        raise InvalidRequest(
            "tool_choice is only allowed when tools are given.", param="tool_choice"
        )
    if body.parallel_tool_calls is not None and not tools:
        raise InvalidRequest(
            "parallel_tool_calls is only allowed when tools are given.",
            param="parallel_tool_calls",
        )
    if not tools or choice == "none":
        return Outputs((), constraint, kind, len(tools), None)
    only = None
    if isinstance(choice, t.NamedToolChoice):
        only = choice.function.name
        if all(tool.name != only for tool in tools):
            raise InvalidRequest(
                "tool_choice names a function that is not among the tools.",
                param="tool_choice.function.name",
            )
    parallel = body.parallel_tool_calls is not False
    schema = calls_schema(tools, only=only, parallel=parallel)
    mode: CallMode = "whole" if choice not in (None, "auto") else "after_trigger"
    if constraint is not None and mode == "after_trigger":
        # the model answers with the response's JSON object or calls tools: one JSON value
        response = json.loads(constraint.schema)
        if response.get("type") != "object":
            raise UnsupportedParameter(
                "with tools, a response_format schema must describe a JSON object.",
                param="response_format",
            )
        schema, mode = calls_or_response_schema(schema, response), "array_or_object"
    text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
    trigger = TRIGGER if mode == "after_trigger" else None
    constraint = OutputConstraint(text, trigger=trigger, param="tools")
    return Outputs(tools, constraint, kind, len(tools), mode)


def _tools(wire: list[t.FunctionTool]) -> tuple[ToolDefinition, ...]:
    seen: set[str] = set()
    out = []
    for i, tool in enumerate(wire):
        f = tool.function
        if f.name in seen:
            raise InvalidRequest(
                "tool function names must be unique.", param=f"tools[{i}].function.name"
            )
        seen.add(f.name)
        parameters = (
            _NO_PARAMETERS
            if f.parameters is None
            else _checked(f.parameters, f"tools[{i}].function.parameters")
        )
        out.append(ToolDefinition(f.name, f.description or "", parameters))
    return tuple(out)


def _checked(schema: dict[str, object], param: str) -> str:
    try:
        return check_schema(schema, param=param)
    except InvalidGenerationRequest as exc:
        raise InvalidRequest(str(exc), param=exc.param) from None


def messages(body: t.ChatCompletionRequest) -> tuple[ChatMessage, ...]:
    """The conversation as engine messages: text parts joined, tool calls and results kept."""
    out = []
    for i, m in enumerate(body.messages):
        content = _text(m.content, i)
        if isinstance(m, t.ToolMessage):
            out.append(ChatMessage("tool", content, tool_call_id=m.tool_call_id))
        elif isinstance(m, t.AssistantMessage):
            calls = tuple(
                MessageToolCall(c.id, c.function.name, c.function.arguments)
                for c in m.tool_calls or ()
            )
            if not content and not calls:
                raise InvalidRequest(
                    "an assistant message needs content or tool_calls.",
                    param=f"messages[{i}].content",
                )
            out.append(ChatMessage("assistant", content, tool_calls=calls))
        else:
            out.append(ChatMessage(type(m).__struct_config__.tag, content))  # type: ignore[arg-type]
    return tuple(out)


def _text(content: str | list[t.TextPart] | list[t.ContentPart] | None, i: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, t.TextPart):
            raise UnsupportedParameter(
                "only text content parts are supported by this model.",
                param=f"messages[{i}].content[{j}].type",
            )
        texts.append(part.text)
    return "\n".join(texts)
