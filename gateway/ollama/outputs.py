"""What chat and generate share: Ollama's `format` and `tools` -> the pipeline's output facts
(through `gateway.pipeline.outputs.shape`, the OpenAI adapter's own translation: the same
schema checks, the same constraint), its conversation -> engine messages, the refusals of what
no model here can do (`think`, `logprobs`, images), and the reply's tool calls in Ollama's shape
(arguments as an object).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from backends.types import ChatMessage, GenerationDelta, MessageToolCall, ToolCallPiece

from ..errors import InternalError, InvalidRequest, UnsupportedParameter
from ..pipeline import OutputKind
from ..pipeline.outputs import Fields, Outputs, Tool, shape
from . import types as t

__all__ = [
    "OLLAMA_FIELDS",
    "done_reason",
    "messages",
    "outputs",
    "refuse_unsupported",
    "tool_calls",
]

OLLAMA_FIELDS = Fields(
    tool_name="tools[{i}].function.name",
    tool_parameters="tools[{i}].function.parameters",
    choice_name="tools",  # Ollama has no tool_choice: never named
    format="format",
    schema="format",
)


def refuse_unsupported(
    think: t.Think | None, logprobs: bool | None, top_logprobs: int | None
) -> None:
    """`think` (no model here reasons) and logprobs (not in Ollama's shape here): a 400."""
    if think not in (None, False, ""):
        raise UnsupportedParameter(
            "think is not supported: no model served here has reasoning support.", param="think"
        )
    if logprobs or top_logprobs:
        raise UnsupportedParameter(
            "logprobs are not supported on Ollama's API here: use /v1/chat/completions.",
            param="logprobs" if logprobs else "top_logprobs",
        )


def outputs(fmt: t.Format | None, tools: list[t.Tool] | None) -> Outputs:
    """The output facts of `format` ("json": any JSON object; a schema: JSON valid against it)
    and `tools` (the model may call them, as with OpenAI's tool_choice "auto")."""
    kind: OutputKind = "text"
    schema = None
    if isinstance(fmt, dict):
        kind, schema = "json_schema", fmt
    elif fmt == "json":
        kind = "json_object"
    elif fmt not in (None, ""):
        raise InvalidRequest('format must be "json" or a JSON schema object.', param="format")
    wire = [
        Tool(x.function.name, x.function.description, x.function.parameters) for x in tools or ()
    ]
    return shape(
        wire, choice=None, only=None, kind=kind, schema=schema, parallel=None, fields=OLLAMA_FIELDS
    )


def messages(wire: list[t.Message]) -> tuple[ChatMessage, ...]:
    """The conversation as engine messages; an earlier turn's calls keep their order."""
    out = []
    for i, m in enumerate(wire):
        if m.images:
            raise UnsupportedParameter(
                "images are not supported by the models served here.",
                param=f"messages[{i}].images",
            )
        if m.role == "assistant":
            calls = tuple(
                MessageToolCall(
                    c.id or f"call_{i}_{j}",
                    c.function.name,
                    json.dumps(c.function.arguments, ensure_ascii=False),
                )
                for j, c in enumerate(m.tool_calls or ())
            )
            out.append(ChatMessage("assistant", m.content, tool_calls=calls))
        elif m.tool_calls:
            raise InvalidRequest(
                "only an assistant message may carry tool_calls.",
                param=f"messages[{i}].tool_calls",
            )
        else:
            out.append(ChatMessage(m.role, m.content))
    return tuple(out)


def done_reason(delta: GenerationDelta) -> str:
    """Ollama's done_reason: "length" when the limit cut the answer, else "stop"."""
    return "length" if delta.finish_reason == "length" else "stop"


_arguments = msgspec.json.Decoder(dict[str, Any])


def tool_calls(pieces: list[ToolCallPiece], *, cut: bool) -> list[t.OutToolCall]:
    """Whole calls from their streamed pieces, arguments decoded into an object (the engine
    constrained them to the function's schema, an object).  When the length limit `cut` the
    answer, a call whose arguments were cut is left out: Ollama's shape has no room for half an
    object, and `done_reason: "length"` says the answer is incomplete."""
    names: list[str] = []
    texts: list[list[str]] = []
    for piece in pieces:
        if piece.id is not None:
            names.append(piece.name or "")
            texts.append([])
        else:
            texts[piece.index].append(piece.arguments)
    out = []
    for name, parts in zip(names, texts, strict=True):
        try:
            arguments = _arguments.decode("".join(parts) or "{}")
        except msgspec.DecodeError:
            if cut:
                continue
            raise InternalError("the model's tool call arguments are not a JSON object") from None
        out.append(t.OutToolCall(t.OutFunction(name, arguments)))
    return out
