"""A context overflow reads as OpenAI's, so that clients recognise it.

litellm raises ContextWindowExceededError for a 400 only when the message holds one of a few
known phrases; for OpenAI-compatible servers that is "This model's maximum context length is"
(`ExceptionCheckers.is_error_str_context_window_exceeded` in
litellm/litellm_core_utils/exception_mapping_utils.py, matched on the lowercased error text;
its rate-limit check runs first, so the message must not read as one).  OpenAI says "in the
messages" on chat and "in the prompt" on legacy completions: the gateway picks the word from the
request's `prompt_param`, and the message holds nothing but numbers and our own words."""

from __future__ import annotations

import re

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends import errors as engine_errors
from gateway import errors

# litellm's test, as its source writes it (the substrings relevant to an OpenAI-shaped server)
LITELLM_CONTEXT_SUBSTRING = "this model's maximum context length is"
LITELLM_RATE_LIMIT = re.compile(r"rate[\s_\-]*limit")

OPENAI = re.compile(
    r"This model's maximum context length is (?P<n>\d+) tokens\. However, you requested "
    r"(?P<m>\d+) tokens \((?P<p>\d+) in the (?P<field>messages|prompt), (?P<c>\d+) in the "
    r"completion\)\. Please reduce the length of the (?P=field) or completion\."
)


def overflow(prompt: int = 3000, completion: int = 2000, context: int = 4096) -> Exception:
    return engine_errors.ContextLengthExceeded(
        prompt_tokens=prompt, max_tokens=completion, context_length=context
    )


def rendered(prompt_param: str, exc: Exception | None = None) -> errors.GatewayError:
    """What the gateway answers when the engine refuses a request for `prompt_param`."""
    with (
        pytest.raises(errors.ContextLengthExceeded) as info,
        errors.translate_engine_errors(prompt_param),
    ):
        raise exc or overflow()
    return info.value


def litellm_sees_context_window(text: str) -> bool:
    lowered = text.lower()
    return LITELLM_CONTEXT_SUBSTRING in lowered and not LITELLM_RATE_LIMIT.search(lowered)


@pytest.mark.parametrize(
    ("prompt_param", "expected"),
    [
        (
            "messages",
            "This model's maximum context length is 4096 tokens. However, you requested 5000 "
            "tokens (3000 in the messages, 2000 in the completion). Please reduce the length of "
            "the messages or completion.",
        ),
        (
            "prompt",
            "This model's maximum context length is 4096 tokens. However, you requested 5000 "
            "tokens (3000 in the prompt, 2000 in the completion). Please reduce the length of "
            "the prompt or completion.",
        ),
    ],
)
def test_the_endpoint_names_the_prompt_as_openai_does(prompt_param: str, expected: str) -> None:
    exc = rendered(prompt_param)
    assert exc.message == expected
    assert (exc.status_code, exc.type, exc.code) == (
        400,
        "invalid_request_error",
        "context_length_exceeded",
    )
    assert exc.param == prompt_param


@pytest.mark.parametrize("prompt_param", ["messages", "prompt"])
def test_litellm_maps_the_error_body_to_a_context_window_error(prompt_param: str) -> None:
    body = errors.error_body(rendered(prompt_param))
    message = msgspec.json.decode(body)["error"]["message"]
    assert litellm_sees_context_window(message)
    # litellm also reads the SDK exception's text, which carries the whole body
    assert litellm_sees_context_window(f"Error code: 400 - {msgspec.json.decode(body)!r}")


def test_the_engine_message_alone_opens_the_same_way() -> None:
    # logged as is, and what a caller outside the gateway sees
    assert str(overflow()).startswith("This model's maximum context length is 4096 tokens. ")
    assert litellm_sees_context_window(str(overflow()))


@given(
    prompt=st.integers(1, 10**7),
    completion=st.integers(1, 10**6),
    context=st.integers(1, 10**7),
    prompt_param=st.sampled_from(["messages", "prompt"]),
)
def test_only_numbers_and_our_words(
    prompt: int, completion: int, context: int, prompt_param: str
) -> None:
    message = rendered(prompt_param, overflow(prompt, completion, context)).message
    match = OPENAI.fullmatch(message)
    assert match is not None
    assert match["field"] == prompt_param
    assert (int(match["n"]), int(match["p"]), int(match["c"])) == (context, prompt, completion)
    assert int(match["m"]) == prompt + completion
    assert litellm_sees_context_window(message)
