"""GenerationRequest -> vLLM SamplingParams arguments, and the load split (pure, no vLLM)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from backends.errors import ContextLengthExceeded, EngineOverloaded
from backends.types import GenerationRequest, SamplingParams
from backends.vllm._load import admit, split_load
from backends.vllm._params import sampling_kwargs

CTX = 1024


def kwargs(prompt_tokens: int = 10, **request: Any) -> dict[str, Any]:
    return sampling_kwargs(
        GenerationRequest(request_id="r", prompt="x", **request),
        prompt_tokens=prompt_tokens,
        context_length=CTX,
    )


DEFAULTS = {
    "n": 1,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "seed": None,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "logit_bias": None,
    "stop": None,
    "include_stop_str_in_output": False,
    "max_tokens": 16,
    "logprobs": None,
    "prompt_logprobs": None,
    "detokenize": True,
    "skip_special_tokens": True,
}


@pytest.mark.parametrize(
    ("request_fields", "expected"),
    [
        pytest.param({}, {}, id="defaults-disable-every-transform"),
        pytest.param(
            {"sampling": SamplingParams(temperature=0.0, top_k=40, top_p=0.5)},
            {"temperature": 0.0, "top_k": 40, "top_p": 0.5},
            id="greedy",
        ),
        pytest.param(
            {"sampling": SamplingParams(temperature=-1.0)},
            {"temperature": 0.0},
            id="negative-is-greedy",
        ),
        pytest.param(
            {"sampling": SamplingParams(temperature=0.001)},
            {"temperature": 0.01},
            id="tiny-temperature-raised-to-vllm-minimum",
        ),
        pytest.param(
            {"sampling": SamplingParams(temperature=0.7, top_k=0)},
            {"temperature": 0.7, "top_k": 0},
            id="top-k-off",
        ),
        pytest.param({"sampling": SamplingParams(top_k=-5)}, {"top_k": 0}, id="negative-top-k-off"),
        pytest.param(
            {"sampling": SamplingParams(seed=1234, min_p=0.05)},
            {"seed": 1234, "min_p": 0.05},
            id="seed-and-min-p",
        ),
        pytest.param(
            {
                "sampling": SamplingParams(
                    repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=-0.5
                )
            },
            {"repetition_penalty": 1.2, "presence_penalty": 0.5, "frequency_penalty": -0.5},
            id="penalties",
        ),
        pytest.param(
            {"sampling": SamplingParams(logit_bias=((5, -100.0), (7, 2.5)))},
            {"logit_bias": {5: -100.0, 7: 2.5}},
            id="logit-bias",
        ),
        pytest.param({"stop": ("\n\n", "END")}, {"stop": ["\n\n", "END"]}, id="stop"),
        pytest.param({"stop": ("", "END")}, {"stop": ["END"]}, id="empty-stop-dropped"),
        pytest.param({"stop": ("",)}, {"stop": None}, id="only-empty-stop"),
        pytest.param({"logprobs": 0}, {"logprobs": 0}, id="logprobs-chosen-only"),
        pytest.param({"logprobs": 5}, {"logprobs": 5}, id="logprobs-top-5"),
        pytest.param({"max_tokens": 7}, {"max_tokens": 7}, id="max-tokens"),
        pytest.param(
            {"max_tokens": None}, {"max_tokens": CTX - 10}, id="max-tokens-none-is-context-rest"
        ),
        pytest.param({"echo_prompt": True}, {}, id="echo-without-logprobs"),
        pytest.param(
            {"echo_prompt": True, "logprobs": 2},
            {"logprobs": 2, "prompt_logprobs": 2},
            id="echo-with-logprobs",
        ),
        pytest.param(
            {"cache_salt": "tenant-1", "priority": -3}, {}, id="salt-and-priority-not-sampling"
        ),
        pytest.param(
            {"n": 4, "sampling": SamplingParams(seed=9)},
            {"n": 4, "seed": 9},
            id="choices-are-vllm-children-seeded-by-vllm",
        ),
        pytest.param(
            {"n": 3, "sampling": SamplingParams(temperature=0.0)},
            {"n": 1, "temperature": 0.0},
            id="greedy-choices-are-one-sequence",
        ),
    ],
)
def test_mapping(request_fields: dict[str, Any], expected: dict[str, Any]) -> None:
    fields = {"max_tokens": 16, **request_fields}
    assert kwargs(**fields) == {**DEFAULTS, **expected}


@pytest.mark.parametrize(
    ("prompt_tokens", "max_tokens", "fits"),
    [
        (10, CTX - 10, True),
        (10, CTX - 9, False),
        (CTX - 1, None, True),  # one token left
        (CTX, None, False),  # no room for even one
        (CTX + 5, 1, False),
    ],
)
def test_context_length(prompt_tokens: int, max_tokens: int | None, fits: bool) -> None:
    if fits:
        assert kwargs(prompt_tokens, max_tokens=max_tokens)["max_tokens"] >= 1
        return
    with pytest.raises(ContextLengthExceeded) as info:
        kwargs(prompt_tokens, max_tokens=max_tokens)
    assert info.value.context_length == CTX
    assert info.value.prompt_tokens == prompt_tokens


@pytest.mark.parametrize(
    ("in_flight", "capacity", "reported_waiting", "expected"),
    [
        pytest.param(0, 4, 0, (0, 0), id="idle"),
        pytest.param(0, 4, 3, (0, 0), id="stale-report-after-everything-ended"),
        pytest.param(1, 4, 0, (1, 0), id="just-submitted"),
        pytest.param(4, 4, 0, (4, 0), id="full"),
        pytest.param(7, 4, 0, (4, 3), id="beyond-capacity-waits"),
        pytest.param(7, 4, 5, (2, 5), id="scheduler-holds-more-back"),
        pytest.param(2, 4, 5, (0, 2), id="never-more-waiting-than-in-flight"),
    ],
)
def test_load_split(
    in_flight: int, capacity: int, reported_waiting: int, expected: tuple[int, int]
) -> None:
    assert split_load(in_flight, capacity, reported_waiting) == expected


def test_importing_the_engine_imports_no_vllm() -> None:
    """vLLM is an optional extra and the gateway always imports backends.vllm."""
    probe = (
        "import sys, backends.vllm; "
        "heavy = ('vllm', 'torch', 'transformers', 'tokenizers'); "
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("in_flight", "sequences", "admitted"),
    [
        pytest.param(0, 1, True, id="idle"),
        pytest.param(11, 1, True, id="last-place"),
        pytest.param(12, 1, False, id="full"),
        pytest.param(8, 4, True, id="choices-fill-the-queue"),
        pytest.param(9, 4, False, id="choices-beyond-the-queue"),
        pytest.param(0, 40, True, id="larger-than-the-bound-on-an-idle-engine"),
        pytest.param(1, 40, False, id="larger-than-the-bound-beside-another"),
    ],
)
def test_admission(in_flight: int, sequences: int, admitted: bool) -> None:
    def check() -> None:
        admit(in_flight, sequences, capacity=8, max_waiting=4, mean_duration_s=2.0)

    if admitted:
        check()
        return
    with pytest.raises(EngineOverloaded) as info:
        check()
    assert info.value.retry_after_s >= 1.0
