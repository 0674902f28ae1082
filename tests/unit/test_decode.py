"""gateway/http/decode.py and gateway/errors.py: request bodies -> Structs or OpenAI errors.

The privacy rule under test: an error message may name a parameter, never repeat a value the
client sent (a prompt must never come back in an error, nor reach a log through one).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gateway import errors
from gateway.http.decode import decode
from gateway.openai.types import ChatCompletionRequest, CompletionRequest

CHAT = msgspec.json.Decoder(ChatCompletionRequest)
COMPLETION = msgspec.json.Decoder(CompletionRequest)


def _chat(**fields: Any) -> bytes:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    body.update(fields)
    return json.dumps(body).encode()


def _completion(**fields: Any) -> bytes:
    body: dict[str, Any] = {"model": "m", "prompt": "hi"}
    body.update(fields)
    return json.dumps(body).encode()


def _error(decoder: msgspec.json.Decoder[Any], body: bytes) -> errors.InvalidRequest:
    with pytest.raises(errors.InvalidRequest) as info:
        decode(decoder, body)
    assert info.value.status_code == 400
    return info.value


# ---- decoding --------------------------------------------------------------------------------


def test_valid_chat_request_decodes() -> None:
    request = decode(CHAT, _chat(max_tokens=5, temperature=0.5, stop=["\n"], top_k=40))
    assert isinstance(request, ChatCompletionRequest)
    assert request.model == "m"
    assert (request.max_tokens, request.temperature, request.stop, request.top_k) == (
        5,
        0.5,
        ["\n"],
        40,
    )


def test_fields_clients_send_as_null_or_harmless_decode() -> None:
    """What OpenAI accepts and changes nothing here: null for n, stream and logprobs, an empty
    tool list, a participant name, store false, metadata and a service tier."""
    body = _chat(
        n=None,
        stream=None,
        logprobs=None,
        tools=[],
        store=False,
        metadata={"team": "x"},
        service_tier="auto",
        parallel_tool_calls=None,
        messages=[{"role": "user", "content": "x", "name": "bob"}],
    )
    request = decode(CHAT, body)
    assert isinstance(request, ChatCompletionRequest)
    assert (request.n, request.stream, request.logprobs, request.tools) == (None, None, None, [])


def test_valid_completion_request_decodes_with_openai_default_max_tokens() -> None:
    request = decode(COMPLETION, _completion(prompt=[[1, 2, 3]]))
    assert isinstance(request, CompletionRequest)
    assert request.prompt == [[1, 2, 3]]
    assert request.max_tokens == 16


@pytest.mark.parametrize("body", [b"{", b"", b"not json", b'{"model": "m",}', b"\xff\xfe"])
@pytest.mark.parametrize("decoder", [CHAT, COMPLETION], ids=["chat", "completion"])
def test_malformed_json(decoder: msgspec.json.Decoder[Any], body: bytes) -> None:
    error = _error(decoder, body)
    assert type(error) is errors.InvalidRequest
    assert error.param is None
    assert "JSON" in error.message


@pytest.mark.parametrize("body", [b"[]", b'"text"', b"1", b"null"])
def test_body_that_is_not_an_object(body: bytes) -> None:
    error = _error(CHAT, body)
    assert error.param is None
    assert "JSON object" in error.message


@pytest.mark.parametrize(
    ("decoder", "body", "param"),
    [
        (CHAT, _chat(functions=[{"name": "f"}]), "functions"),
        (CHAT, _chat(audio={"voice": "x"}), "audio"),
        (COMPLETION, _completion(suffix="x"), "suffix"),
        (
            CHAT,
            _chat(stream_options={"include_usage": True, "include_obfuscation": 1}),
            "stream_options.include_obfuscation",
        ),
        (
            CHAT,
            _chat(messages=[{"role": "user", "content": "x", "audio": "bob"}]),
            "messages[0].audio",
        ),
        (
            CHAT,
            _chat(tools=[{"type": "function", "function": {"name": "f", "type": 1}}]),
            "tools[0].function.type",
        ),
        (
            CHAT,
            _chat(
                messages=[{"role": "user", "content": [{"type": "text", "text": "x", "detail": 1}]}]
            ),
            "messages[0].content[0].detail",
        ),
    ],
)
def test_known_unsupported_field_is_named(
    decoder: msgspec.json.Decoder[Any], body: bytes, param: str
) -> None:
    error = _error(decoder, body)
    assert isinstance(error, errors.UnsupportedParameter)
    assert error.code == "unsupported_parameter"
    assert error.param == param
    assert param in error.message


@pytest.mark.parametrize(
    ("decoder", "body", "param"),
    [
        (CHAT, json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode(), "model"),
        (CHAT, json.dumps({"model": "m"}).encode(), "messages"),
        (COMPLETION, json.dumps({"model": "m"}).encode(), "prompt"),
        (CHAT, _chat(messages=[{"content": "x"}]), "messages[0].role"),
        (CHAT, _chat(messages=[{"role": "tool", "content": "x"}]), "messages[0].tool_call_id"),
    ],
)
def test_missing_required_field_is_named(
    decoder: msgspec.json.Decoder[Any], body: bytes, param: str
) -> None:
    error = _error(decoder, body)
    assert type(error) is errors.InvalidRequest
    assert error.param == param
    assert f"'{param}'" in error.message


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (_chat(max_tokens="ten"), "max_tokens"),
        (_chat(max_tokens=1.5), "max_tokens"),
        (_chat(max_tokens=-1), "max_tokens"),
        (_chat(max_tokens=0), "max_tokens"),
        (_chat(max_tokens=10**9), "max_tokens"),
        (_chat(max_completion_tokens=0), "max_completion_tokens"),
        (_chat(temperature=3), "temperature"),
        (_chat(temperature=-0.1), "temperature"),
        (_chat(top_p=0), "top_p"),
        (_chat(n=0), "n"),
        (_chat(top_logprobs=21), "top_logprobs"),
        (_chat(stop=[""]), "stop[0]"),
        (_chat(stop=["a"] * 17), "stop"),
        (_chat(messages=[]), "messages"),
        (_chat(messages=[{"role": "robot", "content": "x"}]), "messages[0].role"),
        (_chat(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
        (_chat(response_format={"type": "xml"}), "response_format.type"),
        (_chat(tools=[{"type": "retrieval", "function": {"name": "f"}}]), "tools[0].type"),
        (
            _chat(tools=[{"type": "function", "function": {"name": "a b"}}]),
            "tools[0].function.name",
        ),
        (_chat(tool_choice="sometimes"), "tool_choice"),
        (_chat(service_tier="gold"), "service_tier"),
        (_chat(logit_bias={"1": 101}), "logit_bias[...]"),
    ],
)
def test_bad_value_is_named(body: bytes, param: str) -> None:
    error = _error(CHAT, body)
    assert type(error) is errors.InvalidRequest
    assert error.param == param
    assert f"'{param}'" in error.message
    assert "`" not in error.message


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (_completion(max_tokens=0), "max_tokens"),
        (_completion(logprobs=21), "logprobs"),
        (_completion(prompt=[[1, "x"]]), "prompt[0][1]"),
        (_completion(prompt={"a": 1}), "prompt"),
    ],
)
def test_bad_completion_value_is_named(body: bytes, param: str) -> None:
    assert _error(COMPLETION, body).param == param


# ---- privacy: errors never repeat what the client sent -----------------------------------------

# Each shape puts the canary where the decoder will reject it (or right next to what it rejects).
_SHAPES: dict[str, tuple[msgspec.json.Decoder[Any], Callable[[str], bytes]]] = {
    "role value": (CHAT, lambda c: _chat(messages=[{"role": c, "content": "x"}])),
    "content type tag": (
        CHAT,
        lambda c: _chat(messages=[{"role": "user", "content": [{"type": c, "text": "x"}]}]),
    ),
    "enum value": (CHAT, lambda c: _chat(response_format={"type": c})),
    "content beside a bad role": (
        CHAT,
        lambda c: _chat(messages=[{"role": "robot", "content": c}]),
    ),
    "content beside an unknown field": (
        CHAT,
        lambda c: _chat(messages=[{"role": "user", "content": c, "nickname": "x"}]),
    ),
    "tool type tag": (
        CHAT,
        lambda c: _chat(tools=[{"type": c, "function": {"name": "f"}}]),
    ),
    "tool name": (
        CHAT,
        lambda c: _chat(tools=[{"type": "function", "function": {"name": c + " !"}}]),
    ),
    "tool description beside a bad name": (
        CHAT,
        lambda c: _chat(
            tools=[{"type": "function", "function": {"name": "a b", "description": c}}]
        ),
    ),
    "tool_choice value": (CHAT, lambda c: _chat(tool_choice=c)),
    "content of a tool message without its id": (
        CHAT,
        lambda c: _chat(messages=[{"role": "tool", "content": c}]),
    ),
    "stop string where a list entry must be": (CHAT, lambda c: _chat(stop=[c, 1])),
    "stop of the wrong type": (CHAT, lambda c: _chat(stop={"s": c})),
    "string for max_tokens": (CHAT, lambda c: _chat(max_tokens=c)),
    "string for temperature": (CHAT, lambda c: _chat(temperature=c)),
    "over-long user tag": (CHAT, lambda c: _chat(user=c * 300)),
    "logit_bias value": (CHAT, lambda c: _chat(logit_bias={"1": c})),
    "image url value": (
        CHAT,
        lambda c: _chat(
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": c}]}]
        ),
    ),
    "model of the wrong type": (CHAT, lambda c: _chat(model=[c])),
    "prompt token list with text": (COMPLETION, lambda c: _completion(prompt=[[1, c]])),
    "prompt object": (COMPLETION, lambda c: _completion(prompt={"text": c})),
    "echo as text": (COMPLETION, lambda c: _completion(echo=c)),
    "prompt beside a bad seed": (COMPLETION, lambda c: _completion(prompt=c, seed=2**64)),
}


def _assert_private(decoder: msgspec.json.Decoder[Any], body: bytes, canary: str) -> None:
    error = _error(decoder, body)
    assert canary not in error.message
    assert canary not in (error.param or "")
    assert canary.encode() not in errors.error_body(error)


@pytest.mark.parametrize("shape", list(_SHAPES))
def test_error_never_repeats_a_plain_canary(shape: str) -> None:
    decoder, build = _SHAPES[shape]
    _assert_private(decoder, build("CANARY7f3a"), "CANARY7f3a")


# Values that imitate the shape of msgspec's own messages: quotes and its " - at " separator.
@pytest.mark.parametrize(
    "value",
    ["it's CANARY7f3a", 'say "CANARY7f3a"', "x - at $.CANARY7f3a", "CANARY7f3a' - at `$.model"],
)
@pytest.mark.parametrize("shape", ["role value", "content type tag", "enum value"])
def test_error_never_repeats_a_quoted_canary(shape: str, value: str) -> None:
    decoder, build = _SHAPES[shape]
    _assert_private(decoder, build(value), "CANARY7f3a")


_canary_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=0, max_size=12
)


@given(
    shape=st.sampled_from(sorted(_SHAPES)),
    before=_canary_text,
    after=_canary_text,
)
@example(shape="enum value", before="'", after="")
@example(shape="role value", before="x - at ", after="")
def test_error_never_repeats_the_canary_whatever_surrounds_it(
    shape: str, before: str, after: str
) -> None:
    canary = "CANARY7f3a"
    decoder, build = _SHAPES[shape]
    _assert_private(decoder, build(before + canary + after), canary)


# ---- the error envelope and the status of each error class -------------------------------------


def test_error_body_is_the_openai_envelope() -> None:
    body = msgspec.json.decode(
        errors.error_body(errors.UnsupportedParameter("no tools here", param="tools"))
    )
    assert body == {
        "error": {
            "message": "no tools here",
            "type": "invalid_request_error",
            "param": "tools",
            "code": "unsupported_parameter",
        }
    }


def test_error_body_keeps_null_param_and_code() -> None:
    body = msgspec.json.decode(errors.error_body(errors.InvalidRequest("bad")))
    assert body == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": None, "code": None}
    }


@pytest.mark.parametrize(
    ("cls", "status", "type_", "code"),
    [
        (errors.GatewayError, 500, "server_error", None),
        (errors.InvalidRequest, 400, "invalid_request_error", None),
        (errors.UnsupportedParameter, 400, "invalid_request_error", "unsupported_parameter"),
        (errors.ContextLengthExceeded, 400, "invalid_request_error", "context_length_exceeded"),
        (errors.NotFound, 404, "invalid_request_error", "not_found"),
        (errors.ModelNotFound, 404, "invalid_request_error", "model_not_found"),
        (errors.MethodNotAllowed, 405, "invalid_request_error", "method_not_allowed"),
        (errors.RequestTooLarge, 413, "invalid_request_error", "request_too_large"),
        (errors.Overloaded, 429, "rate_limit_error", "engine_overloaded"),
        (errors.ServiceUnavailable, 503, "server_error", "service_unavailable"),
        (errors.InternalError, 500, "server_error", "internal_error"),
    ],
)
def test_error_classes_carry_status_type_and_code(
    cls: type[errors.GatewayError], status: int, type_: str, code: str | None
) -> None:
    exc = cls("message", param="p")
    assert (exc.status_code, exc.type, exc.code) == (status, type_, code)
    assert msgspec.json.decode(errors.error_body(exc)) == {
        "error": {"message": "message", "type": type_, "param": "p", "code": code}
    }


def test_error_classes_follow_the_documented_tree() -> None:
    assert issubclass(errors.UnsupportedParameter, errors.InvalidRequest)
    assert issubclass(errors.ContextLengthExceeded, errors.InvalidRequest)
    assert issubclass(errors.ModelNotFound, errors.NotFound)
    for name in errors.__all__:
        obj = getattr(errors, name)
        if isinstance(obj, type):
            assert issubclass(obj, errors.GatewayError), name
