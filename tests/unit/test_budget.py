"""backends/budget.py: how many tokens a request may generate, one rule for every engine.

An explicit max_tokens must fit with the prompt; the policy's cap on a request that asked for no
length (`fit_to_context`) is a ceiling that shrinks to what remains of the context."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.budget import completion_budget
from backends.errors import ContextLengthExceeded
from backends.types import GenerationRequest

CTX = 4096


def budget(prompt: int, max_tokens: int | None, *, fit: bool = False, default: int | None = None):
    req = GenerationRequest(request_id="r", prompt="x", max_tokens=max_tokens, fit_to_context=fit)
    return completion_budget(req, prompt_tokens=prompt, context_length=CTX, default=default)


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "fit", "expected"),
    [
        (10, 4096, True, CTX - 10),  # the default policy's cap on a 4096 context: fits now
        (10, 100, True, 100),  # a cap below the room stays the cap
        (10, None, False, CTX - 10),  # no cap at all: the rest of the context
        (CTX - 1, 4096, True, 1),  # one token of room
        (10, CTX - 10, False, CTX - 10),  # an explicit demand that fits exactly
    ],
)
def test_what_fits(prompt: int, max_tokens: int | None, fit: bool, expected: int) -> None:
    assert budget(prompt, max_tokens, fit=fit) == expected


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "fit"),
    [
        (10, CTX - 9, False),  # an explicit max_tokens the context cannot hold is refused
        (10, 4096, False),  # the same cap, asked for by the client
        (CTX, 4096, True),  # a prompt that leaves no room: refused even with a ceiling
        (CTX, None, False),
        (CTX + 5, 1, False),
    ],
)
def test_what_is_refused(prompt: int, max_tokens: int | None, fit: bool) -> None:
    with pytest.raises(ContextLengthExceeded) as info:
        budget(prompt, max_tokens, fit=fit)
    assert info.value.prompt_tokens == prompt
    assert info.value.context_length == CTX
    # every refusal opens with OpenAI's sentence, the prompt that alone fills the context too
    assert str(info.value).startswith(
        f"This model's maximum context length is {CTX} tokens. However, you requested "
        f"{prompt + info.value.max_tokens} tokens ({prompt} in the prompt, "
    )


@pytest.mark.parametrize("prompt", [CTX, CTX + 5])
def test_a_prompt_that_fills_the_context_is_counted_with_one_completion_token(prompt: int) -> None:
    with pytest.raises(ContextLengthExceeded) as info:
        budget(prompt, None)
    assert info.value.max_tokens == 1
    assert info.value.message("messages") == (
        f"This model's maximum context length is {CTX} tokens. However, you requested "
        f"{prompt + 1} tokens ({prompt} in the messages, 1 in the completion). "
        "Please reduce the length of the messages or completion."
    )


def test_an_engine_default_applies_only_without_max_tokens() -> None:
    assert budget(10, None, default=16) == 16
    assert budget(10, 40, default=16) == 40


@given(prompt=st.integers(1, CTX - 1), cap=st.integers(1, 10 * CTX))
def test_a_ceiling_never_overflows_and_never_exceeds_itself(prompt: int, cap: int) -> None:
    got = budget(prompt, cap, fit=True)
    assert 1 <= got <= cap
    assert prompt + got <= CTX
