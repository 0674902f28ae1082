"""Tool calls read out of streamed text (backends/tool_calls.py), cut at every possible place:
what a client receives must not depend on how the engine's deltas fell."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.tool_calls import (
    MAX_PARALLEL_CALLS,
    TRIGGER,
    ToolCallParser,
    calls_schema,
    prompt_messages,
)
from backends.types import ChatMessage, GenerationDelta, MessageToolCall, ToolDefinition

CALLS = [
    {"name": "get_weather", "arguments": {"city": "Oslo", "units": ["c", "f"]}},
    {"name": "lookup", "arguments": {"q": 'a "quoted" } brace', "n": 2}},
]


def run(parts: list[str], trigger: str | None) -> tuple[str, list[dict[str, str]], str | None]:
    parser = ToolCallParser("after_trigger" if trigger else "whole")
    text, calls, reason = "", [], None
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        delta = parser.feed(GenerationDelta(text=part, finish_reason="stop" if last else None))
        text += delta.text
        for piece in delta.tool_calls:
            if piece.id is not None:
                assert piece.index == len(calls) and piece.arguments == ""
                assert piece.id.startswith("call_") and piece.name
                calls.append({"name": piece.name, "arguments": ""})
            else:
                calls[piece.index]["arguments"] += piece.arguments
        reason = delta.finish_reason
    return text, calls, reason


def cut(text: str, points: list[int]) -> list[str]:
    edges = sorted({0, len(text), *[p % (len(text) + 1) for p in points]})
    return [text[a:b] for a, b in itertools.pairwise(edges)] or [""]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=30))
def test_calls_are_the_same_however_the_text_is_cut(points: list[int]) -> None:
    output = "Let me check. " + TRIGGER + json.dumps(CALLS)
    text, calls, reason = run(cut(output, points), TRIGGER)
    assert text == "Let me check. "
    assert [c["name"] for c in calls] == ["get_weather", "lookup"]
    assert [json.loads(c["arguments"]) for c in calls] == [c["arguments"] for c in CALLS]
    assert reason == "tool_calls"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=10))
def test_without_a_trigger_the_output_is_the_call_array(points: list[int]) -> None:
    output = json.dumps(CALLS[:1], indent=1)
    text, calls, reason = run(cut(output, points), None)
    assert text == "" and reason == "tool_calls"
    assert json.loads(calls[0]["arguments"]) == CALLS[0]["arguments"]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=10))
def test_text_without_a_call_passes_through_whole(points: list[int]) -> None:
    output = "a < b and <tool is not a call"
    text, calls, reason = run(cut(output, points), TRIGGER)
    assert (text, calls, reason) == (output, [], "stop")


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=10))
def test_array_or_object_tells_calls_from_the_response(points: list[int]) -> None:
    for output, calls in ((' {"a": [1]}', 0), ("\n" + json.dumps(CALLS), 2)):
        parser = ToolCallParser("array_or_object")
        text, found = "", 0
        parts = cut(output, points)
        for i, part in enumerate(parts):
            final = i == len(parts) - 1
            delta = parser.feed(GenerationDelta(text=part, finish_reason="stop" if final else None))
            text += delta.text
            found += sum(p.id is not None for p in delta.tool_calls)
        assert found == calls
        assert text == ("" if calls else output)


def test_a_call_cut_by_the_length_limit_keeps_what_it_had() -> None:
    parser = ToolCallParser("whole")
    first = parser.feed(GenerationDelta(text='[{"name": "f", "arguments": {"a": "x'))
    last = parser.feed(GenerationDelta(text="yz", finish_reason="length"))
    assert first.tool_calls[0].name == "f"
    args = "".join(p.arguments for p in (*first.tool_calls, *last.tool_calls))
    assert args == '{"a": "xyz'
    assert last.finish_reason == "length"


def test_the_call_schema_keeps_each_tools_refs_resolvable() -> None:
    tools = [
        ToolDefinition("a", "", json.dumps({"type": "object", "properties": {}})),
        ToolDefinition(
            "b",
            "",
            json.dumps(
                {
                    "type": "object",
                    "properties": {"x": {"$ref": "#/$defs/X"}},
                    "$defs": {"X": {"type": "integer"}},
                }
            ),
        ),
    ]
    schema = calls_schema(tools, only=None, parallel=False)
    assert schema["maxItems"] == 1 and len(schema["items"]["anyOf"]) == 2
    b = schema["$defs"]["tool1"]
    assert b["properties"]["x"]["$ref"] == "#/$defs/tool1/$defs/X"
    only = calls_schema(tools, only="b", parallel=True)
    assert only["items"]["properties"]["name"] == {"const": "b"}
    assert only["maxItems"] == MAX_PARALLEL_CALLS


def test_the_prompt_writes_tools_calls_and_results_as_plain_turns() -> None:
    tools = [ToolDefinition("get_weather", "Weather now", '{"type":"object"}')]
    history = [
        ChatMessage("user", "weather?"),
        ChatMessage(
            "assistant", "", tool_calls=(MessageToolCall("call_1", "get_weather", '{"c":1}'),)
        ),
        ChatMessage("tool", "12C", tool_call_id="call_1"),
        ChatMessage("tool", "sunny", tool_call_id="call_2"),
    ]
    out = prompt_messages(history, tools)
    assert [m.role for m in out] == ["system", "user", "assistant", "user"]
    assert "get_weather" in out[0].content and TRIGGER in out[0].content
    assert out[2].content == TRIGGER + '[{"name": "get_weather", "arguments": {"c": 1}}]'
    assert "12C" in out[3].content and "sunny" in out[3].content


@pytest.mark.parametrize("trigger", [TRIGGER, None])
def test_a_delta_without_calls_is_passed_on_as_is(trigger: str | None) -> None:
    parser = ToolCallParser("after_trigger" if trigger else "whole")
    delta = GenerationDelta(text="")
    assert parser.feed(delta) is delta
