"""Chat's output facts and conversation: `outputs()` turns a chat request's tools, tool choice
and `response_format` into the pipeline's output facts (`gateway.pipeline.outputs.shape`, the
translation every adapter shares); `messages()` turns its conversation into engine messages.
`CHAT_FIELDS` and `RESPONSES_FIELDS` say where OpenAI's two request shapes keep each field.
"""

from __future__ import annotations

from backends.types import ChatMessage, MessageToolCall

from ..errors import InvalidRequest, UnsupportedParameter
from ..pipeline import OutputKind
from ..pipeline.outputs import Fields, Outputs, Tool, shape
from . import types as t

__all__ = [
    "CHAT_FIELDS",
    "RESPONSES_FIELDS",
    "Fields",
    "Outputs",
    "Tool",
    "messages",
    "outputs",
    "shape",
]


CHAT_FIELDS = Fields(
    tool_name="tools[{i}].function.name",
    tool_parameters="tools[{i}].function.parameters",
    choice_name="tool_choice.function.name",
    format="response_format",
    schema="response_format.json_schema.schema",
)
RESPONSES_FIELDS = Fields(
    tool_name="tools[{i}].name",
    tool_parameters="tools[{i}].parameters",
    choice_name="tool_choice.name",
    format="text.format",
    schema="text.format.schema",
)


def outputs(body: t.ChatCompletionRequest) -> Outputs:
    """What a chat request asks of the output's shape (a 400 naming the field otherwise)."""
    fmt = body.response_format
    kind: OutputKind = "text"
    schema = None
    if isinstance(fmt, t.JsonObjectFormat):
        kind = "json_object"
    elif isinstance(fmt, t.JsonSchemaFormat):
        kind, schema = "json_schema", fmt.json_schema.schema
    choice = body.tool_choice
    only = None
    if isinstance(choice, t.NamedToolChoice):
        only, choice = choice.function.name, "required"
    tools = [
        Tool(x.function.name, x.function.description, x.function.parameters)
        for x in body.tools or ()
    ]
    return shape(
        tools,
        choice=choice,
        only=only,
        kind=kind,
        schema=schema,
        parallel=body.parallel_tool_calls,
        fields=CHAT_FIELDS,
    )


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
