"""Choices (`n > 1`) on the vLLM engine (CPU build) over the tiny random Llama: deltas routed to
their choice, each choice finishing on its own with its own usage, seeds that make choices
distinct and reproducible, stop strings per choice, and a cancel that ends every choice."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any, cast

import pytest

from backends.errors import EngineOverloaded, InvalidGenerationRequest
from backends.types import GenerationDelta, GenerationRequest, SamplingParams
from backends.vllm import VllmEngine

pytestmark = pytest.mark.engine

PROMPT = "The old river city builds a quiet bridge"


@pytest.fixture(scope="module")
def eos(tiny_llama: Path) -> int:
    from transformers import AutoTokenizer

    token_id: int = AutoTokenizer.from_pretrained(tiny_llama).eos_token_id
    return token_id


@pytest.fixture(scope="module")
def engine(vllm_engine: VllmEngine) -> VllmEngine:
    """The session's engine (tests/integration/conftest.py)."""
    return vllm_engine


def sampled(eos: int, seed: int | None = 11, temperature: float = 1.0) -> SamplingParams:
    """Sampling with EOS banned, so that every choice runs to its length or stop string."""
    return SamplingParams(temperature=temperature, seed=seed, logit_bias=((eos, -100.0),))


def req(n: int, max_tokens: int | None, sampling: SamplingParams, **kw: Any) -> GenerationRequest:
    kw.setdefault("logprobs", 0)
    return GenerationRequest(
        request_id="choices", prompt=PROMPT, n=n, max_tokens=max_tokens, sampling=sampling, **kw
    )


async def run(engine: VllmEngine, request: GenerationRequest) -> dict[int, list[GenerationDelta]]:
    """Every delta, by choice; each choice's deltas end with (only) its final one."""
    handle = await engine.submit(request)
    choices: dict[int, list[GenerationDelta]] = defaultdict(list)
    async for delta in handle:
        assert delta.index not in choices or choices[delta.index][-1].finish_reason is None
        choices[delta.index].append(delta)
    assert sorted(choices) == list(range(request.n))
    for deltas in choices.values():
        assert deltas[-1].finish_reason is not None and deltas[-1].usage is not None
        assert all(d.finish_reason is None and d.usage is None for d in deltas[:-1])
    return dict(choices)


def ids(deltas: list[GenerationDelta]) -> list[int]:
    return [lp.token_id for d in deltas for lp in d.logprobs]


def text(deltas: list[GenerationDelta]) -> str:
    return "".join(d.text for d in deltas)


async def wait_idle(engine: VllmEngine) -> None:
    """Bounded poll until vLLM's scheduler reports nothing running and an empty KV cache."""
    for _ in range(1000):
        load = engine.load()
        if load.running == load.waiting == 0 and load.kv_usage == 0.0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the engine did not go idle: {engine.load()}")


async def test_four_choices_finish_each_with_its_usage(engine: VllmEngine, eos: int) -> None:
    handle_prompt = len(engine.tokenize_prompt(req(1, 1, sampled(eos)))[0])
    choices = await run(engine, req(4, 12, sampled(eos), logprobs=2))
    total = 0
    for index, deltas in choices.items():
        final = deltas[-1]
        assert final.finish_reason == "length"
        assert final.usage is not None
        assert final.usage.prompt_tokens == (handle_prompt if index == 0 else 0)
        assert final.usage.completion_tokens == 12 == sum(d.n_tokens for d in deltas)
        assert len(ids(deltas)) == 12  # logprobs per choice, one entry per token
        assert all(len(lp.top) == 2 for d in deltas for lp in d.logprobs)
        total += final.usage.prompt_tokens + final.usage.completion_tokens
    assert total == handle_prompt + 4 * 12


async def test_seeded_choices_are_distinct_reproducible_and_seed_plus_index(
    engine: VllmEngine, eos: int
) -> None:
    first = await run(engine, req(4, 16, sampled(eos, seed=11)))
    second = await run(engine, req(4, 16, sampled(eos, seed=11)))
    samples = [ids(first[i]) for i in range(4)]
    assert len({tuple(s) for s in samples}) == 4
    assert samples == [ids(second[i]) for i in range(4)]
    assert [text(first[i]) for i in range(4)] == [text(second[i]) for i in range(4)]
    # vLLM seeds child i with seed + i: choice 2 is what n=1 samples with seed 13
    alone = await run(engine, req(1, 16, sampled(eos, seed=13)))
    assert ids(alone[0]) == samples[2]


async def test_unseeded_choices_are_distinct(engine: VllmEngine, eos: int) -> None:
    choices = await run(engine, req(3, 16, sampled(eos, seed=None)))
    assert len({tuple(ids(d)) for d in choices.values()}) == 3


async def test_greedy_choices_are_identical(engine: VllmEngine, eos: int) -> None:
    greedy = sampled(eos, seed=None, temperature=0.0)
    single = await run(engine, req(1, 16, greedy))
    pair = await run(engine, req(2, 16, greedy))
    assert ids(pair[0]) == ids(pair[1]) == ids(single[0])
    assert text(pair[0]) == text(pair[1]) == text(single[0])
    solo, u0, u1 = single[0][-1].usage, pair[0][-1].usage, pair[1][-1].usage
    assert solo is not None and u0 is not None and u1 is not None
    assert (u0.prompt_tokens, u0.completion_tokens) == (solo.prompt_tokens, 16)
    assert (u1.prompt_tokens, u1.completion_tokens) == (0, 16)
    # one sequence in the engine, copied to both choices
    handle = await engine.submit(req(2, None, greedy))
    assert engine.load().running == 1
    handle.cancel()
    assert {d.finish_reason for d in [d async for d in handle] if d.finish_reason} == {"abort"}
    await wait_idle(engine)


async def test_stop_strings_apply_to_each_choice(engine: VllmEngine, eos: int) -> None:
    full = await run(engine, req(4, 40, sampled(eos, seed=5)))
    texts = [text(full[i]) for i in range(4)]
    first = texts[0]
    # A stop string from the middle of choice 0, at its first occurrence there.
    start = next(
        i for i in range(len(first) // 3, len(first) - 3) if first.find(first[i : i + 3]) == i
    )
    stop = first[start : start + 3]
    stopped = await run(engine, req(4, 40, sampled(eos, seed=5), stop=(stop,)))
    assert stopped[0][-1].finish_reason == "stop"
    for i in range(4):
        got, final = text(stopped[i]), stopped[i][-1]
        assert stop not in got
        if stop in texts[i]:
            assert final.finish_reason == "stop"
            assert got == texts[i][: texts[i].index(stop)]
        else:
            assert final.finish_reason == "length"
            assert got == texts[i]
        assert final.usage is not None
        assert final.usage.completion_tokens == sum(d.n_tokens for d in stopped[i])


async def test_cancel_mid_way_ends_every_choice_and_frees_the_engine(
    engine: VllmEngine, eos: int
) -> None:
    await wait_idle(engine)
    # Up to the end of the context with EOS banned: ~1000 steps per choice unless aborted.
    handle = await engine.submit(req(4, None, sampled(eos)))
    assert engine.load().running == 4  # each choice is a sequence
    seen: list[GenerationDelta] = []
    async for delta in handle:
        seen.append(delta)
        if len(seen) == 6:
            handle.cancel()
    finals = {d.index: d for d in seen if d.finish_reason is not None}
    assert sorted(finals) == [0, 1, 2, 3]
    assert {d.finish_reason for d in finals.values()} == {"abort"}
    for index, final in finals.items():
        assert final.usage is not None
        assert final.usage.completion_tokens == sum(d.n_tokens for d in seen if d.index == index)
        assert final.usage.completion_tokens < engine.context_length - handle.prompt_tokens
    await wait_idle(engine)


async def test_a_consumer_that_stops_reading_cancels_every_choice(
    engine: VllmEngine, eos: int
) -> None:
    await wait_idle(engine)
    handle = await engine.submit(req(3, None, sampled(eos)))
    stream = cast(AsyncGenerator[GenerationDelta, None], aiter(handle))
    await anext(stream)
    await stream.aclose()
    await wait_idle(engine)


async def test_choices_count_against_the_engine_bound(engine: VllmEngine, eos: int) -> None:
    await wait_idle(engine)
    with pytest.raises(InvalidGenerationRequest) as info:
        await engine.submit(req(0, 4, sampled(eos)))
    assert info.value.param == "n"
    handle = await engine.submit(req(8, None, sampled(eos)))  # 8 running of 8 + 4
    try:
        with pytest.raises(EngineOverloaded):
            await engine.submit(req(5, None, sampled(eos)))
    finally:
        handle.cancel()
    assert {d.finish_reason for d in [d async for d in handle] if d.finish_reason} == {"abort"}
    await wait_idle(engine)
