"""gateway/openai/sampling.py: OpenAI sampling parameters -> engine SamplingParams."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.types import SamplingParams
from gateway import errors
from gateway.http.decode import decode
from gateway.openai.sampling import sampling_params, stop_strings
from gateway.openai.types import ChatCompletionRequest, CompletionRequest

CHAT = msgspec.json.Decoder(ChatCompletionRequest)
COMPLETION = msgspec.json.Decoder(CompletionRequest)


def _chat(**fields: Any) -> ChatCompletionRequest:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    body.update(fields)
    return decode(CHAT, json.dumps(body).encode())


def _completion(**fields: Any) -> CompletionRequest:
    body: dict[str, Any] = {"model": "m", "prompt": "hi"}
    body.update(fields)
    return decode(COMPLETION, json.dumps(body).encode())


@pytest.mark.parametrize("make", [_chat, _completion], ids=["chat", "completion"])
def test_defaults_disable_every_transform(make: Any) -> None:
    params = sampling_params(make())
    assert params == SamplingParams()
    assert (params.temperature, params.top_p, params.top_k) == (1.0, 1.0, 0)
    assert (params.min_p, params.repetition_penalty) == (0.0, 1.0)
    assert (params.presence_penalty, params.frequency_penalty) == (0.0, 0.0)
    assert params.seed is None
    assert params.logit_bias == ()


def test_explicit_values_are_carried_over() -> None:
    params = sampling_params(
        _chat(
            temperature=0.7,
            top_p=0.9,
            top_k=40,
            min_p=0.05,
            seed=1234,
            repetition_penalty=1.1,
            presence_penalty=0.5,
            frequency_penalty=-0.5,
            logit_bias={"5": -100, "7": 2.5},
        )
    )
    assert params == SamplingParams(
        temperature=0.7,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        seed=1234,
        repetition_penalty=1.1,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        logit_bias=((5, -100.0), (7, 2.5)),
    )


def test_temperature_zero_is_kept_and_means_greedy() -> None:
    params = sampling_params(_chat(temperature=0))
    assert params.temperature == 0.0
    assert params.greedy


@pytest.mark.parametrize("key", ["abc", "1.5", "", "0x10", "1e3"])
def test_logit_bias_key_must_be_an_integer(key: str) -> None:
    with pytest.raises(errors.InvalidRequest) as info:
        sampling_params(_chat(logit_bias={key: 1}))
    assert info.value.param == "logit_bias"
    assert info.value.status_code == 400


# Python's int() is laxer than "a token id as a decimal string": surrounding spaces, digit
# separators and non-ASCII digits would all be read as some other token id.
@pytest.mark.parametrize("key", [" 7", "1_0", "\u0663"])
def test_logit_bias_key_must_be_a_plain_decimal_token_id(key: str) -> None:
    with pytest.raises(errors.InvalidRequest) as info:
        sampling_params(_chat(logit_bias={key: 1}))
    assert info.value.param == "logit_bias"


@pytest.mark.parametrize("key", [str(2**31), str(2**32 + 5)])
def test_logit_bias_key_beyond_any_vocabulary_is_rejected(key: str) -> None:
    # The engine stores token ids as 32-bit ints; 2**32 + 5 would silently bias token 5.
    with pytest.raises(errors.InvalidRequest) as info:
        sampling_params(_chat(logit_bias={key: 1}))
    assert info.value.param == "logit_bias"


def test_logit_bias_largest_plain_token_id_is_accepted() -> None:
    assert sampling_params(_chat(logit_bias={"262143": 1})).logit_bias == ((262143, 1.0),)


@pytest.mark.parametrize("key", ["-1", "-50256"])
def test_logit_bias_key_must_not_be_negative(key: str) -> None:
    with pytest.raises(errors.InvalidRequest) as info:
        sampling_params(_chat(logit_bias={key: 1}))
    assert info.value.param == "logit_bias"


@given(seed=st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_seed_is_masked_to_32_bits(seed: int) -> None:
    masked = sampling_params(_chat(seed=seed)).seed
    assert masked is not None
    assert 0 <= masked < 2**32
    assert masked == seed % 2**32


def test_seed_examples() -> None:
    assert sampling_params(_chat(seed=-1)).seed == 2**32 - 1
    assert sampling_params(_chat(seed=2**32 + 5)).seed == 5
    assert sampling_params(_chat(seed=0)).seed == 0


@pytest.mark.parametrize(("top_k", "expected"), [(-1, 0), (0, 0), (1, 1), (50, 50)])
def test_top_k_minus_one_means_off(top_k: int, expected: int) -> None:
    assert sampling_params(_completion(top_k=top_k)).top_k == expected


@pytest.mark.parametrize(
    ("stop", "expected"),
    [
        (None, ()),
        ("\n", ("\n",)),
        ("abc", ("abc",)),  # one string is one stop, not three characters
        (["a", "bc"], ("a", "bc")),
        ([], ()),
    ],
)
def test_stop_strings(stop: Any, expected: tuple[str, ...]) -> None:
    assert stop_strings(stop) == expected


def test_stop_strings_from_a_decoded_request() -> None:
    assert stop_strings(_chat(stop="END").stop) == ("END",)
    assert stop_strings(_completion(stop=["x", "y"]).stop) == ("x", "y")
    assert stop_strings(_chat().stop) == ()
