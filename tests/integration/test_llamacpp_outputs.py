"""Constrained decoding on the real llama.cpp engine and the real Gemma GGUF: what the grammar
promises (every output parses and validates), what it costs (compiled once, off the decode
loop, refused when it would stall or crash it), and that its shortcut samples exactly."""

from __future__ import annotations

import asyncio
import collections
import json
from typing import Any

import jsonschema
import llama_cpp
import numpy as np
import pytest

from backends.errors import InvalidGenerationRequest
from backends.llamacpp import LlamaCppEngine
from backends.llamacpp._grammar import GrammarCache
from backends.llamacpp._sampler import _TOKEN_DATA, Sampler
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

pytestmark = pytest.mark.engine

SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer"},
            "email": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        },
        "required": ["name", "age", "email"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "sentiment": {"enum": ["positive", "negative", "neutral"]},
            "score": {"type": "number"},
            "keywords": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
        },
        "required": ["sentiment", "score", "keywords"],
    },
    {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {"$ref": "#/$defs/Line"},
                "minItems": 1,
                "maxItems": 3,
            },
            "paid": {"type": "boolean"},
        },
        "required": ["items", "paid"],
        "$defs": {
            "Line": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
                "required": ["sku", "qty"],
            }
        },
    },
    {
        "type": "object",
        "properties": {
            "date": {"type": "string", "format": "date"},
            "id": {"type": "string", "format": "uuid"},
            "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
            "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.(com|org)$"},
        },
        "required": ["date", "id", "code", "email"],
    },
    {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 5},
]
PROMPTS = ["Describe a customer.", "Review: great coffee, slow service.", "An order.", "A ticket."]


def constrained(schema: dict[str, Any] | None, prompt: str, **kw: Any) -> GenerationRequest:
    text = ANY_JSON_OBJECT if schema is None else check_schema(schema, param="schema")
    return GenerationRequest(
        request_id="constrained",
        messages=(ChatMessage("user", prompt),),
        max_tokens=kw.pop("max_tokens", 160),
        sampling=kw.pop("sampling", SamplingParams(temperature=1.0)),
        constraint=OutputConstraint(text, trigger=kw.pop("trigger", None)),
        **kw,
    )


async def generate(engine: LlamaCppEngine, request: GenerationRequest) -> tuple[str, str]:
    handle = await engine.submit(request)
    deltas: list[GenerationDelta] = [d async for d in handle]
    return "".join(d.text for d in deltas), deltas[-1].finish_reason or ""


async def test_fifty_outputs_at_temperature_one_all_validate(engine: LlamaCppEngine) -> None:
    jobs = [(SCHEMAS[i % len(SCHEMAS)], PROMPTS[i % len(PROMPTS)]) for i in range(50)]
    gate = asyncio.Semaphore(8)  # 4 slots + 4 waiting

    async def one(schema: dict[str, Any], prompt: str) -> tuple[dict[str, Any], str, str]:
        async with gate:
            text, finish = await generate(engine, constrained(schema, prompt))
        return schema, text, finish

    results = await asyncio.gather(*(one(s, p) for s, p in jobs))
    stopped = 0
    for schema, text, finish in results:
        if finish == "length":  # cut by max_tokens: the only way not to be complete
            continue
        assert finish == "stop"
        jsonschema.validate(json.loads(text), schema)
        stopped += 1
    assert stopped >= 40, [f for _, _, f in results]


async def test_json_object_mode_gives_an_object(engine: LlamaCppEngine) -> None:
    for _ in range(5):
        text, finish = await generate(engine, constrained(None, "Anything, as JSON."))
        if finish == "stop":
            assert isinstance(json.loads(text), dict)


async def test_greedy_constrained_output_is_deterministic(engine: LlamaCppEngine) -> None:
    request = constrained(SCHEMAS[1], PROMPTS[1], sampling=SamplingParams(temperature=0.0))
    first, second = await generate(engine, request), await generate(engine, request)
    assert first == second
    assert first[1] == "stop"
    jsonschema.validate(json.loads(first[0]), SCHEMAS[1])


async def test_a_grammar_is_compiled_once_and_cloned(engine: LlamaCppEngine) -> None:
    assert engine.grammars is not None
    schema = {"type": "object", "properties": {"only_here": {"type": "boolean"}}}
    before = engine.grammars.compiles
    for _ in range(3):
        await generate(engine, constrained(schema, "x", max_tokens=12))
    assert engine.grammars.compiles == before + 1


async def test_a_grammar_too_deep_for_llama_cpp_is_refused_and_nothing_breaks(
    engine: LlamaCppEngine,
) -> None:
    """`maxLength: 20000` or `pattern: ^a{0,20000}$` become groups nested 20,000 deep, which
    crash llama.cpp's grammar parser (a segfault): they are refused before it sees them."""
    for schema in (
        {"type": "string", "maxLength": 20000},
        {"type": "string", "pattern": "^a{0,20000}$"},
    ):
        with pytest.raises(InvalidGenerationRequest, match="too complex") as refused:
            await generate(engine, constrained(schema, "x"))
        assert refused.value.param == "response_format"
    text, _ = await generate(engine, constrained(SCHEMAS[4], "numbers", max_tokens=24))
    assert text


async def test_a_slow_compile_is_refused_at_its_budget_without_stalling_generation(
    engine: LlamaCppEngine,
) -> None:
    assert engine._model is not None
    grammars = GrammarCache(engine._model, budget_s=0.0)
    big = {"type": "object", "properties": {f"p{i}": SCHEMAS[2] for i in range(60)}}
    try:
        slow = asyncio.ensure_future(grammars.sampler(OutputConstraint(json.dumps(big))))
        running = asyncio.ensure_future(generate(engine, constrained(SCHEMAS[4], "n")))
        with pytest.raises(InvalidGenerationRequest, match="did not compile within"):
            await slow
        text, _ = await running
        assert text
        # the outcome is cached: a repeat is refused at once, not compiled again
        with pytest.raises(InvalidGenerationRequest):
            await grammars.sampler(OutputConstraint(json.dumps(big)))
        assert grammars.compiles <= 1
    finally:
        await asyncio.to_thread(grammars.close)


TOOLS = (
    ToolDefinition(
        "get_weather",
        "The weather in a city now",
        check_schema(
            {
                "type": "object",
                "properties": {"city": {"type": "string"}, "units": {"enum": ["c", "f"]}},
                "required": ["city", "units"],
            },
            param="p",
        ),
    ),
    ToolDefinition("get_time", "The time in a timezone", '{"type":"object","properties":{}}'),
)


def tool_request(trigger: str | None, seed: int) -> GenerationRequest:
    schema = json.dumps(calls_schema(TOOLS, only=None, parallel=False))
    return GenerationRequest(
        request_id="tools",
        messages=(ChatMessage("user", "What is the weather in Oslo?"),),
        tools=TOOLS,
        max_tokens=96,
        sampling=SamplingParams(temperature=1.0, seed=seed),
        constraint=OutputConstraint(schema, trigger=trigger),
    )


async def test_required_tool_calls_are_valid_calls(engine: LlamaCppEngine) -> None:
    params = {t.name: json.loads(t.parameters) for t in TOOLS}
    for seed in range(6):
        parser = ToolCallParser("whole")
        handle = await engine.submit(tool_request(None, seed))
        deltas = [parser.feed(d) async for d in handle]
        if deltas[-1].finish_reason == "length":
            continue
        assert deltas[-1].finish_reason == "tool_calls"
        pieces = [p for d in deltas for p in d.tool_calls]
        [name] = [p.name for p in pieces if p.id is not None]
        arguments = json.loads("".join(p.arguments for p in pieces))
        jsonschema.validate(arguments, params[name or ""])


async def test_auto_tool_choice_is_text_or_a_valid_call(engine: LlamaCppEngine) -> None:
    for seed in range(6):
        text, finish = await generate(engine, tool_request(TRIGGER, seed))
        if TRIGGER in text and finish == "stop":
            calls = json.loads(text.split(TRIGGER, 1)[1])
            assert len(calls) == 1 and calls[0]["name"] in {t.name for t in TOOLS}


async def test_the_refused_token_shortcut_samples_in_exact_proportion(
    engine: LlamaCppEngine,
) -> None:
    """When the grammar refuses the sampled token, other draws are checked a batch at a time
    (rejection sampling): allowed tokens must come out in proportion to their probabilities."""
    model = engine._model
    assert model is not None
    yes, no = (model.tokenize(w, add_special=False, parse_special=False)[0] for w in ("yes", "no"))
    gbnf = OutputConstraint(json.dumps({"enum": ["yes", "no"]}))
    cache = GrammarCache(model)
    try:
        view = np.zeros(model.n_vocab, dtype=_TOKEN_DATA)
        view["id"] = np.arange(model.n_vocab)
        view["p"] = 1.0
        view["p"][[yes, no]] = 0.0
        view["p"] *= 0.99 / view["p"].sum()
        view["p"][yes], view["p"][no] = 0.0075, 0.0025  # 3 : 1
        counts: collections.Counter[int | None] = collections.Counter()
        for seed in range(400):
            params = SamplingParams(temperature=1.0, seed=seed)
            sampler = Sampler(params, model.n_vocab, 8, await cache.sampler(gbnf))
            for token in model.tokenize('"', add_special=False, parse_special=False):
                llama_cpp.llama_sampler_accept(sampler.grammar, token)  # the opening quote
            counts[sampler._among_likely(view.copy())] += 1
            sampler.close()
    finally:
        await asyncio.to_thread(cache.close)
    picked = counts[yes] + counts[no]
    assert set(counts) <= {yes, no, None}
    assert picked > 300
    assert 0.65 < counts[yes] / picked < 0.85  # 0.75 expected; 400 draws: +- 0.07 is 3 sigma


async def test_a_bias_that_bans_what_the_grammar_needs_ends_the_output_instead_of_crashing(
    engine: LlamaCppEngine,
) -> None:
    """After the JSON is complete the grammar allows only the end token; a client that banned
    it with logit_bias leaves nothing both allow: the output ends there (llama.cpp would abort
    the process if its grammar accepted a token it refuses)."""
    assert engine._model is not None
    eos = engine._model.eos
    request = constrained(
        {"enum": ["yes", "no"]},
        "yes or no?",
        sampling=SamplingParams(temperature=0.0, logit_bias=((eos, -100.0),)),
        max_tokens=32,
    )
    text, finish = await generate(engine, request)
    assert json.loads(text) in ("yes", "no")
    assert finish == "stop"
    sampled = constrained(
        {"enum": ["yes", "no"]},
        "yes or no?",
        sampling=SamplingParams(temperature=1.0, seed=3, logit_bias=((eos, -100.0),)),
        max_tokens=32,
    )
    text, finish = await generate(engine, sampled)
    assert json.loads(text) in ("yes", "no") and finish == "stop"


async def test_a_grammar_llama_cpp_rejects_is_never_printed(
    engine: LlamaCppEngine, capfd: pytest.CaptureFixture[str]
) -> None:
    """On a parse error llama.cpp prints the whole grammar to stderr; a grammar holds the
    schema (client content): nothing of it may reach the process's output."""
    canary = "CANARY-5d1e-schema"
    schema = {"type": "object", "properties": {f'{canary}"q': {"type": "string"}}}
    with pytest.raises(InvalidGenerationRequest, match=r"llama\.cpp rejects"):
        await generate(engine, constrained(schema, "x"))
    out, err = capfd.readouterr()
    assert canary not in out and canary not in err
