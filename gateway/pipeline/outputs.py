"""Tools, tool choice and structured-output format -> the pipeline's protocol-neutral output
facts (tools for the prompt, the constraint the engine enforces, what the audit counts), one
translation for every adapter: `shape()` takes the fields as each protocol spells them (OpenAI
chat's `tools[].function` and `response_format`, Responses' flat `tools[]` and `text.format`,
Ollama's `tools[].function` and `format`) and `Fields` says where each sits, for the `param`
an error names.

Every schema is checked here (`backends.structured`), before admission: a schema that is not
a schema, too large, recursive or asking for what cannot be enforced gets a 400 naming the
field, and nothing is generated, audited as admitted, or stored.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import msgspec

from backends.errors import InvalidGenerationRequest
from backends.structured import ANY_JSON_OBJECT, check_schema
from backends.tool_calls import TRIGGER, CallMode, calls_or_response_schema, calls_schema
from backends.types import OutputConstraint, ToolDefinition

from ..errors import InvalidRequest, UnsupportedParameter
from .facts import OutputKind

__all__ = ["Fields", "Outputs", "Tool", "shape"]

_NO_PARAMETERS = '{"type":"object","properties":{}}'


class Outputs(msgspec.Struct, frozen=True):
    tools: tuple[ToolDefinition, ...]
    constraint: OutputConstraint | None
    kind: OutputKind
    tools_offered: int  # for the audit: tools sent, whatever tool_choice made of them
    tool_calls: CallMode | None  # where calls are read from the output (None: no calls)


@dataclass(frozen=True, slots=True)
class Fields:
    """Where a protocol's request keeps each output field: the `param` its errors name."""

    tool_name: str  # a format string of the tool's position `i`
    tool_parameters: str
    choice_name: str
    format: str  # the structured-output format
    schema: str  # its schema


class Tool(NamedTuple):
    """A function tool as either protocol sends it (chat nests it under `function`)."""

    name: str
    description: str | None
    parameters: dict[str, Any] | None


def shape(
    wire: Sequence[Tool],
    *,
    choice: Literal["none", "auto", "required"] | None,
    only: str | None,
    kind: OutputKind,
    schema: dict[str, Any] | None,
    parallel: bool | None,
    fields: Fields,
) -> Outputs:
    """The output facts of either protocol: its tools, its tool choice (`only`: the one
    function a named choice forces), its format (`schema`: a json_schema format's schema,
    None for any JSON object) and whether calls may come in parallel."""
    tools = _tools(wire, fields)
    constraint = None
    if kind == "json_object":
        constraint = OutputConstraint(ANY_JSON_OBJECT, param=fields.format)
    elif kind == "json_schema":
        text = ANY_JSON_OBJECT if schema is None else _checked(schema, fields.schema)
        constraint = OutputConstraint(text, param=fields.format)
    if choice is not None and not tools:
        raise InvalidRequest(
            "tool_choice is only allowed when tools are given.", param="tool_choice"
        )
    if parallel is not None and not tools:
        raise InvalidRequest(
            "parallel_tool_calls is only allowed when tools are given.",
            param="parallel_tool_calls",
        )
    if not tools or choice == "none":
        return Outputs((), constraint, kind, len(tools), None)
    if only is not None and all(tool.name != only for tool in tools):
        raise InvalidRequest(
            "tool_choice names a function that is not among the tools.",
            param=fields.choice_name,
        )
    calls = calls_schema(tools, only=only, parallel=parallel is not False)
    mode: CallMode = "whole" if choice == "required" else "after_trigger"
    if constraint is not None and mode == "after_trigger":
        # the model answers with the response's JSON object or calls tools: one JSON value
        response = json.loads(constraint.schema)
        if response.get("type") != "object":
            raise UnsupportedParameter(
                "with tools, a structured-output schema must describe a JSON object.",
                param=fields.format,
            )
        calls, mode = calls_or_response_schema(calls, response), "array_or_object"
    text = json.dumps(calls, ensure_ascii=False, separators=(",", ":"))
    trigger = TRIGGER if mode == "after_trigger" else None
    constraint = OutputConstraint(text, trigger=trigger, param="tools")
    return Outputs(tools, constraint, kind, len(tools), mode)


def _tools(wire: Sequence[Tool], fields: Fields) -> tuple[ToolDefinition, ...]:
    seen: set[str] = set()
    out = []
    for i, tool in enumerate(wire):
        if tool.name in seen:
            raise InvalidRequest(
                "tool function names must be unique.", param=fields.tool_name.format(i=i)
            )
        seen.add(tool.name)
        parameters = (
            _NO_PARAMETERS
            if tool.parameters is None
            else _checked(tool.parameters, fields.tool_parameters.format(i=i))
        )
        out.append(ToolDefinition(tool.name, tool.description or "", parameters))
    return tuple(out)


def _checked(schema: dict[str, object], param: str) -> str:
    try:
        return check_schema(schema, param=param)
    except InvalidGenerationRequest as exc:
        raise InvalidRequest(str(exc), param=exc.param) from None
