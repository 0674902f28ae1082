"""Tool calling, the same on every engine: how tools enter the prompt, what a call looks like
when the model writes one, and how a call is read back out of the text as it streams.

The model writes its calls as `<tool_call>` followed by a JSON array:

    <tool_call>[{"name": "get_weather", "arguments": {"city": "Oslo"}}]

and the engines enforce that shape with the same constrained decoding as structured outputs:
for tool_choice "required" or a named function the whole output is the array (no trigger);
for "auto" the output is free text that may end with the trigger and an array.  Each call's
`arguments` is constrained to its function's parameter schema, `name` to the functions offered.

Tools reach the model through a generic tool prompt (a system message listing the functions
with their schemas, and how to call them); earlier calls and their results are written back
into the conversation in the same format.  Client text (descriptions, schemas, arguments,
results) only ever travels as message content, so it can never become a control token.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence
from typing import Any, Literal

import msgspec

from .types import ChatMessage, GenerationDelta, ToolCallPiece, ToolDefinition

__all__ = [
    "MAX_PARALLEL_CALLS",
    "TRIGGER",
    "CallMode",
    "ToolCallParser",
    "calls_or_response_schema",
    "calls_schema",
    "prompt_messages",
]

TRIGGER = "<tool_call>"
# Calls in one answer at most: small models decoding greedily repeat a call until the context
# is full (`[{call}, {call}, ...]`), and no app wants more than a handful at once.
MAX_PARALLEL_CALLS = 8
# Where calls are in the output: after the trigger, if any (tool_choice "auto"); the whole
# output (tool_choice "required" or a named function); or, when a response format is asked
# too, the whole output is either the call array or the response's JSON object.
CallMode = Literal["after_trigger", "whole", "array_or_object"]

_PROMPT_HEAD = (
    "You can call functions. They are listed below, one JSON object per line, each with its "
    "parameters as a JSON schema:\n"
)
_PROMPT_TAIL = (
    "\nTo call one or more of them, answer with "
    + TRIGGER
    + ' followed by a JSON array of calls, each {"name": <the function name>, "arguments": '
    "<an object valid against its parameters>}, and nothing after it. Otherwise answer "
    "normally. A function's result comes back in a <tool_response> block."
)


def calls_schema(
    tools: Sequence[ToolDefinition], *, only: str | None, parallel: bool
) -> dict[str, Any]:
    """The JSON schema of the call array: one item per call, name first, then arguments valid
    against that function's parameters (moved under `$defs` so their `$ref`s still resolve)."""
    defs: dict[str, Any] = {}
    items = []
    for i, tool in enumerate(tools):
        if only is not None and tool.name != only:
            continue
        key = f"tool{i}"
        defs[key] = _rebase(json.loads(tool.parameters), f"#/$defs/{key}")
        items.append(
            {
                "type": "object",
                "properties": {
                    "name": {"const": tool.name},
                    "arguments": {"$ref": f"#/$defs/{key}"},
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    schema: dict[str, Any] = {
        "type": "array",
        "items": items[0] if len(items) == 1 else {"anyOf": items},
        "minItems": 1,
    }
    schema["maxItems"] = MAX_PARALLEL_CALLS if parallel else 1
    schema["$defs"] = defs
    return schema


def calls_or_response_schema(calls: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    """Either the call array (`calls_schema`) or the response's object: one JSON value, told
    apart by its first character."""
    defs = dict(calls.pop("$defs", {}))
    defs["response"] = _rebase(response, "#/$defs/response")
    return {"anyOf": [calls, {"$ref": "#/$defs/response"}], "$defs": defs}


def _rebase(node: Any, base: str) -> Any:
    """Local `$ref`s of a schema that now lives at `base`."""
    if isinstance(node, dict):
        out = {k: _rebase(v, base) for k, v in node.items()}
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            out["$ref"] = base + ref[1:]
        return out
    if isinstance(node, list):
        return [_rebase(v, base) for v in node]
    return node


def prompt_messages(
    messages: Sequence[ChatMessage], tools: Sequence[ToolDefinition]
) -> list[ChatMessage]:
    """The conversation in roles every chat template knows: the tool prompt first (when tools
    are offered), earlier calls as assistant text, tool results as user turns."""
    out: list[ChatMessage] = []
    if tools:
        lines = [
            json.dumps(
                {
                    "name": t.name,
                    "description": t.description,
                    "parameters": json.loads(t.parameters),
                },
                ensure_ascii=False,
            )
            for t in tools
        ]
        out.append(ChatMessage("system", _PROMPT_HEAD + "\n".join(lines) + _PROMPT_TAIL))
    for m in messages:
        if m.role == "tool":
            result = f"<tool_response>\n{m.content}\n</tool_response>"
            if out and out[-1].role == "user" and out[-1].content.startswith("<tool_response>"):
                out[-1] = ChatMessage("user", out[-1].content + "\n" + result)
            else:
                out.append(ChatMessage("user", result))
        elif m.tool_calls:
            calls = [{"name": c.name, "arguments": _arguments(c.arguments)} for c in m.tool_calls]
            text = TRIGGER + json.dumps(calls, ensure_ascii=False)
            out.append(ChatMessage("assistant", f"{m.content}\n{text}" if m.content else text))
        else:
            out.append(ChatMessage(m.role, m.content))
    return out


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text  # as the client sent it; the model sees it as a string


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


# ---- reading calls back -------------------------------------------------------------------

_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*', re.S)
_ARRAY_OPEN = re.compile(r"\s*\[", re.S)
_NEXT = re.compile(r"\s*\}\s*([,\]])", re.S)


class ToolCallParser:
    """Moves tool calls out of a choice's text as it streams.

    Text before the trigger passes through (held back only while it could be the trigger's
    beginning); after it, each call becomes a first piece (id, name) and then pieces of its
    arguments, exactly as they were generated.  In mode "whole" the calls start at once; in
    "array_or_object" the first character decides (`[`: calls, anything else: text).  The
    final delta's `finish_reason` becomes "tool_calls" when a call was made.
    """

    def __init__(self, mode: CallMode) -> None:
        self._trigger = TRIGGER if mode == "after_trigger" else None
        self._undecided = mode == "array_or_object"
        self._in_calls = mode == "whole"
        self._held = ""  # text not yet passed on
        self._passing = False  # array_or_object mode, and the output is the response
        self._state = "open"  # open -> head -> args -> next -> done (or text: gave up)
        self._index = -1
        self._depth = 0
        self._in_string = False
        self._escape = False
        self.calls = 0

    def feed(self, delta: GenerationDelta) -> GenerationDelta:
        text, pieces = self._scan(delta.text, final=delta.finish_reason is not None)
        reason = delta.finish_reason
        if reason == "stop" and self.calls:
            reason = "tool_calls"
        if text == delta.text and not pieces and reason == delta.finish_reason:
            return delta
        return msgspec.structs.replace(
            delta, text=text, finish_reason=reason, tool_calls=tuple(pieces)
        )

    def _scan(self, text: str, *, final: bool) -> tuple[str, list[ToolCallPiece]]:
        self._held += text
        if self._undecided:
            start = self._held.lstrip()
            if not start and not final:
                return "", []
            self._undecided = False
            self._in_calls = start.startswith("[")
            if not self._in_calls:  # the response itself: text from here on
                out, self._held = self._held, ""
                self._passing = True
                return out, []
        if self._passing:
            out, self._held = self._held, ""
            return out, []
        if not self._in_calls:
            return self._before_trigger(final)
        return "", self._calls(final)

    def _before_trigger(self, final: bool) -> tuple[str, list[ToolCallPiece]]:
        assert self._trigger is not None
        found = self._held.find(self._trigger)
        if found >= 0:
            before = self._held[:found]
            self._held = self._held[found + len(self._trigger) :]
            self._in_calls = True
            return before, self._calls(final)
        if final:
            out, self._held = self._held, ""
            return out, []
        keep = _partial_suffix(self._held, self._trigger)
        out = self._held[: len(self._held) - keep]
        self._held = self._held[len(self._held) - keep :]
        return out, []

    def _calls(self, final: bool) -> list[ToolCallPiece]:
        pieces: list[ToolCallPiece] = []
        progressed = True
        while progressed and self._held and self._state != "done":
            progressed = False
            if self._state == "open":
                m = _ARRAY_OPEN.match(self._held)
                if m:
                    self._held = self._held[m.end() :]
                    self._state, progressed = "head", True
            elif self._state == "head":
                m = _HEAD.match(self._held)
                if m:
                    self._held = self._held[m.end() :]
                    self._index += 1
                    self.calls += 1
                    name = json.loads(m.group(1))
                    pieces.append(ToolCallPiece(self._index, "", new_call_id(), name))
                    self._state, progressed = "args", True
                    self._depth, self._in_string, self._escape = 0, False, False
            elif self._state == "args":
                if self._depth == 0:
                    self._held = self._held.lstrip()
                taken = self._arguments_end()
                if taken:
                    pieces.append(ToolCallPiece(self._index, self._held[:taken]))
                    self._held = self._held[taken:]
                    progressed = True
                    if self._depth == 0:
                        self._state = "next"
            elif self._state == "next":
                m = _NEXT.match(self._held)
                if m:
                    self._held = self._held[m.end() :]
                    self._state = "head" if m.group(1) == "," else "done"
                    progressed = True
        if self._state == "done":
            self._held = ""
        if final:
            self._held = ""  # a call cut by max_tokens keeps what it had (finish: length)
        return pieces

    def _arguments_end(self) -> int:
        """How much of the held text belongs to the current arguments value (all of it while
        the value is open); `_depth` is 0 again once it closed."""
        started = self._depth > 0
        for i, ch in enumerate(self._held):
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif ch == "\\":
                    self._escape = True
                elif ch == '"':
                    self._in_string = False
                continue
            if ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
                started = True
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return i + 1
            elif not started and not ch.isspace():
                started = True  # a scalar value: not what the schema allows, read to a comma
            if started and self._depth == 0 and ch in ",":
                return i
        return len(self._held)


def _partial_suffix(text: str, trigger: str) -> int:
    """The length of the longest end of `text` that begins `trigger`."""
    for n in range(min(len(text), len(trigger) - 1), 0, -1):
        if trigger.startswith(text[-n:]):
            return n
    return 0
