"""Constrained decoding on the real vLLM engine (its CPU build, xgrammar) over a random-weight
Llama: whatever such a model would write, what comes out must be what the schema allows."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jsonschema
import pytest

from backends.structured import ANY_JSON_OBJECT, check_schema
from backends.tool_calls import TRIGGER, ToolCallParser, calls_schema
from backends.types import (
    ChatMessage,
    GenerationDelta,
    GenerationRequest,
    OutputConstraint,
    SamplingParams,
    ToolDefinition,
)
from backends.vllm import VllmEngine

pytestmark = pytest.mark.engine

SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer"},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        },
        "required": ["name", "age", "tags"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "when": {"type": "string", "format": "date"},
            "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"},
        },
        "required": ["ok", "when", "code"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 4},
]
TOOLS = (
    ToolDefinition(
        "lookup",
        "Find an order",
        check_schema(
            {
                "type": "object",
                "properties": {"order": {"type": "integer"}, "full": {"type": "boolean"}},
                "required": ["order", "full"],
                "additionalProperties": False,
            },
            param="p",
        ),
    ),
)


async def generate(
    engine: VllmEngine, constraint: OutputConstraint, seed: int, *, tools: Any = ()
) -> list[GenerationDelta]:
    request = GenerationRequest(
        request_id=f"so-{seed}",
        messages=(ChatMessage("user", "Answer in JSON."),),
        max_tokens=128,
        sampling=SamplingParams(temperature=1.0, seed=seed),
        constraint=constraint,
        tools=tools,
    )
    handle = await engine.submit(request)
    return [d async for d in handle]


async def test_fifty_outputs_at_temperature_one_all_validate(vllm_engine: VllmEngine) -> None:
    gate = asyncio.Semaphore(8)

    async def one(i: int) -> tuple[dict[str, Any], list[GenerationDelta]]:
        schema = SCHEMAS[i % len(SCHEMAS)]
        constraint = OutputConstraint(check_schema(schema, param="s"))
        async with gate:
            return schema, await generate(vllm_engine, constraint, i)

    done = 0
    for schema, deltas in await asyncio.gather(*(one(i) for i in range(50))):
        if deltas[-1].finish_reason == "length":
            continue
        assert deltas[-1].finish_reason == "stop"
        jsonschema.validate(json.loads("".join(d.text for d in deltas)), schema)
        done += 1
    assert done >= 25


async def test_json_object_mode(vllm_engine: VllmEngine) -> None:
    finished = 0
    for seed in range(6):
        deltas = await generate(vllm_engine, OutputConstraint(ANY_JSON_OBJECT), seed)
        if deltas[-1].finish_reason == "stop":
            assert isinstance(json.loads("".join(d.text for d in deltas)), dict)
            finished += 1
    assert finished


async def test_required_tool_calls_are_valid(vllm_engine: VllmEngine) -> None:
    schema = json.dumps(calls_schema(TOOLS, only="lookup", parallel=False))
    params = json.loads(TOOLS[0].parameters)
    checked = 0
    for seed in range(6):
        parser = ToolCallParser("whole")
        deltas = [
            parser.feed(d)
            for d in await generate(vllm_engine, OutputConstraint(schema), seed, tools=TOOLS)
        ]
        if deltas[-1].finish_reason == "length":
            continue
        assert deltas[-1].finish_reason == "tool_calls"
        pieces = [p for d in deltas for p in d.tool_calls]
        assert [p.name for p in pieces if p.id] == ["lookup"]
        jsonschema.validate(json.loads("".join(p.arguments for p in pieces)), params)
        checked += 1
    assert checked


async def test_auto_tool_choice_after_the_trigger_is_a_valid_call(
    vllm_engine: VllmEngine,
) -> None:
    schema = json.dumps(calls_schema(TOOLS, only=None, parallel=True))
    for seed in range(6):
        constraint = OutputConstraint(schema, trigger=TRIGGER)
        deltas = await generate(vllm_engine, constraint, seed, tools=TOOLS)
        text = "".join(d.text for d in deltas)
        if TRIGGER in text and deltas[-1].finish_reason == "stop":
            calls = json.loads(text.split(TRIGGER, 1)[1])
            assert calls and all(c["name"] == "lookup" for c in calls)
