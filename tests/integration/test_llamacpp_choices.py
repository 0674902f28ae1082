"""`n > 1` on the llama.cpp engine, on the real Gemma GGUF: the prompt is prefilled once and its
cache copied to every choice; each choice then samples, stops and finishes on its own."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from backends.errors import ContextLengthExceeded
from backends.llamacpp import LlamaCppEngine, LlamaCppOptions
from backends.structured import check_schema
from backends.types import (
    ChatMessage,
    GenerationDelta,
    GenerationHandle,
    GenerationRequest,
    OutputConstraint,
    SamplingParams,
)

pytestmark = pytest.mark.engine

# The base model stops after a few tokens; banning its end tokens makes every run go to max_tokens.
NO_END = ((1, -100.0), (106, -100.0), (212, -100.0))
GREEDY = SamplingParams(temperature=0.0, logit_bias=NO_END)
# ~130 tokens: prefilled in two chunks by the session engine (batch 128)
LONG_PROMPT = "The annual report of the harbour authority covers " + ", ".join(
    f"berth {i} and its {i * 7} cranes" for i in range(20)
)


@pytest.fixture(scope="session")
async def default_engine(gguf_path: Path) -> AsyncIterator[LlamaCppEngine]:
    """The engine as the default configuration builds it (4 slots of 4096 tokens, batch 512)."""
    eng = LlamaCppEngine(str(gguf_path), LlamaCppOptions(n_threads=2))
    await eng.start()
    yield eng
    await eng.stop()


def seeded(seed: int) -> SamplingParams:
    return SamplingParams(temperature=1.0, seed=seed, logit_bias=NO_END)


def req(prompt: str, max_tokens: int, **kw: Any) -> GenerationRequest:
    kw.setdefault("sampling", GREEDY)
    return GenerationRequest(request_id="t", prompt=prompt, max_tokens=max_tokens, **kw)


async def collect(handle: GenerationHandle) -> dict[int, list[GenerationDelta]]:
    """Deltas by choice, checking that each choice ends once, with its last delta."""
    by_choice: dict[int, list[GenerationDelta]] = {}
    async for delta in handle:
        got = by_choice.setdefault(delta.index, [])
        assert not got or got[-1].finish_reason is None, f"choice {delta.index} went on"
        got.append(delta)
    assert all(d[-1].finish_reason is not None for d in by_choice.values())
    return by_choice


async def run(
    engine: LlamaCppEngine, request: GenerationRequest
) -> dict[int, list[GenerationDelta]]:
    return await collect(await engine.submit(request))


def texts(by_choice: dict[int, list[GenerationDelta]]) -> list[str]:
    return ["".join(d.text for d in by_choice[i]) for i in sorted(by_choice)]


def completion(deltas: list[GenerationDelta]) -> int:
    usage = deltas[-1].usage
    assert usage is not None
    return usage.completion_tokens


async def test_four_choices_with_indices_and_usage_counting_the_prompt_once(
    engine: LlamaCppEngine,
) -> None:
    handle = await engine.submit(req("A list of fruits:", 12, n=4, sampling=seeded(3)))
    out = await collect(handle)
    assert sorted(out) == [0, 1, 2, 3]
    for i, deltas in out.items():
        final = deltas[-1]
        assert final.finish_reason == "length"
        assert final.usage is not None
        assert final.usage.completion_tokens == 12 == sum(d.n_tokens for d in deltas)
        assert final.usage.prompt_tokens == (handle.prompt_tokens if i == 0 else 0)
    usages = [d[-1].usage for d in out.values()]
    total = sum(u.prompt_tokens + u.completion_tokens for u in usages if u is not None)
    assert total == handle.prompt_tokens + 4 * 12


async def test_seeded_choices_differ_repeat_and_are_the_single_runs_of_seed_plus_index(
    engine: LlamaCppEngine,
) -> None:
    first = texts(await run(engine, req(LONG_PROMPT, 16, n=4, sampling=seeded(11))))
    second = texts(await run(engine, req(LONG_PROMPT, 16, n=4, sampling=seeded(11))))
    assert first == second
    assert len(set(first)) == 4, "seeded choices came out equal"
    # choice i samples with seed + i, from the same prompt cache a lone request builds
    assert texts(await run(engine, req(LONG_PROMPT, 16, sampling=seeded(13)))) == [first[2]]


async def test_greedy_choices_equal_a_greedy_single_run(engine: LlamaCppEngine) -> None:
    alone = texts(await run(engine, req(LONG_PROMPT, 24)))
    assert texts(await run(engine, req(LONG_PROMPT, 24, n=2))) == alone * 2


async def test_the_prompt_is_decoded_once_for_all_choices(engine: LlamaCppEngine) -> None:
    before = engine.decoded_tokens
    handle = await engine.submit(req(LONG_PROMPT, 3, n=4))
    out = await collect(handle)
    assert handle.prompt_tokens > 100
    # the prompt once, then each choice's tokens but its last (sampled, never decoded)
    decoded = engine.decoded_tokens - before
    assert decoded == handle.prompt_tokens + sum(completion(d) - 1 for d in out.values())
    assert decoded < 2 * handle.prompt_tokens


async def test_eight_choices_run_on_the_default_four_slots(default_engine: LlamaCppEngine) -> None:
    """More choices than slots: they run in waves on copies of the one prefilled prompt (here
    longer than a prefill chunk and than Gemma's 512-token attention window)."""
    engine = default_engine
    prompt = "Minutes of the meeting: " + " ".join(f"item {i} was approved;" for i in range(120))
    alone = texts(await run(engine, req(prompt, 16)))
    before = engine.decoded_tokens
    handle = await engine.submit(req(prompt, 16, n=8))
    greedy = await collect(handle)
    assert handle.prompt_tokens > 600
    assert sorted(greedy) == list(range(8))
    assert texts(greedy) == alone * 8
    assert engine.decoded_tokens - before == handle.prompt_tokens + 8 * 15
    sampled = texts(await run(engine, req("In the year 2050, cities", 16, n=8, sampling=seeded(5))))
    assert len(set(sampled)) == 8
    load = engine.load()
    assert (load.running, load.waiting, load.kv_usage) == (0, 0, 0.0)


async def test_cancel_aborts_every_choice_and_frees_their_sequences(
    engine: LlamaCppEngine, default_engine: LlamaCppEngine
) -> None:
    for eng, n in ((engine, 4), (default_engine, 8)):  # all choices running; choices in waves
        handle = await eng.submit(req("A very long story:", 500, n=n))
        by_choice: dict[int, list[GenerationDelta]] = {}
        seen = 0
        async for delta in handle:
            by_choice.setdefault(delta.index, []).append(delta)
            seen += 1
            if seen == 2 * n:
                handle.cancel()
        assert sorted(by_choice) == list(range(n))
        assert all(d[-1].finish_reason == "abort" for d in by_choice.values())
        assert all(completion(d) < 500 for d in by_choice.values())
        load = eng.load()
        assert (load.running, load.waiting, load.kv_usage) == (0, 0, 0.0)
        after = await run(eng, req("The capital of France is", 5))
        assert completion(after[0]) == 5


async def test_constrained_choices_are_each_a_valid_document(engine: LlamaCppEngine) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no", "maybe"]}, "sure": {"type": "boolean"}},
        "required": ["answer", "sure"],
        "additionalProperties": False,
    }
    request = GenerationRequest(
        request_id="t",
        messages=(ChatMessage("user", "Will it rain tomorrow? Answer in JSON."),),
        max_tokens=60,
        n=3,
        sampling=SamplingParams(temperature=1.0, seed=2),
        constraint=OutputConstraint(check_schema(schema, param="schema")),
    )
    out = await run(engine, request)
    assert sorted(out) == [0, 1, 2]
    for deltas in out.values():
        assert deltas[-1].finish_reason == "stop"
        jsonschema.validate(json.loads("".join(d.text for d in deltas)), schema)


async def test_stop_strings_end_each_choice_on_its_own(engine: LlamaCppEngine) -> None:
    full = texts(await run(engine, req("My favourite words are", 24, n=3, sampling=seeded(21))))
    out = await run(
        engine, req("My favourite words are", 24, n=3, sampling=seeded(21), stop=("e",))
    )
    got = texts(out)
    for i, text in enumerate(full):
        if "e" in text:
            assert got[i] == text[: text.index("e")]
            assert out[i][-1].finish_reason == "stop"
        else:
            assert got[i] == text and out[i][-1].finish_reason == "length"
    assert any(out[i][-1].finish_reason == "stop" for i in out)
    assert len({completion(d) for d in out.values()}) > 1, "the choices did not stop apart"


async def test_a_large_n_waits_in_line_and_is_not_overtaken(engine: LlamaCppEngine) -> None:
    """n = 4 needs all four slots: a later n = 1 request does not take a free one first."""
    running = await engine.submit(req("The river", 300))
    stream = aiter(running)
    await anext(stream)
    wide = await engine.submit(req("Colours:", 4, n=4))
    late = await engine.submit(req("Numbers:", 4))
    decoded = engine.decoded_tokens
    # the step under way when they arrived, then one that began with admitting what it could
    while engine.decoded_tokens < decoded + 2:
        await anext(stream)
    load = engine.load()
    assert (load.running, load.waiting) == (1, 5)
    running.cancel()
    async for _ in stream:
        pass
    assert sorted(await collect(wide)) == [0, 1, 2, 3]
    assert completion((await collect(late))[0]) == 4


async def test_context_budget_is_per_choice_as_for_one(engine: LlamaCppEngine) -> None:
    long_prompt = "word " * 900
    with pytest.raises(ContextLengthExceeded):
        await engine.submit(req(long_prompt, 200, n=2))
    handle = await engine.submit(req(long_prompt, 4096, n=2, fit_to_context=True))
    out = await collect(handle)
    room = engine.context_length - handle.prompt_tokens
    assert [completion(d) for d in out.values()] == [room, room]
