"""gateway/http/decode.py: a JSON body with a duplicate key is refused, and an unknown field is
named only when it is a parameter airgate knows of.

The duplicate-key check has a fast path (colon counts) and a precise one (`json.loads` over the
keys of every object); the property test below checks the two together against a reference on
JSON texts written with every spelling a key can take (escapes, `\\u003a` colons, whitespace).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway import errors
from gateway.admin.keys import CreateKey
from gateway.http.decode import KNOWN_PARAMETERS, decode
from gateway.openai.embedding_types import EmbeddingsRequest
from gateway.openai.responses_types import ResponseCreateRequest
from gateway.openai.types import ChatCompletionRequest, CompletionRequest

ANY: msgspec.json.Decoder[Any] = msgspec.json.Decoder()
CHAT = msgspec.json.Decoder(ChatCompletionRequest)
COMPLETION = msgspec.json.Decoder(CompletionRequest)
EMBEDDINGS = msgspec.json.Decoder(EmbeddingsRequest)
RESPONSES = msgspec.json.Decoder(ResponseCreateRequest)
ADMIN = msgspec.json.Decoder(CreateKey)
DUPLICATE = "duplicate key"


def _refused(decoder: msgspec.json.Decoder[Any], body: bytes) -> errors.InvalidRequest:
    with pytest.raises(errors.InvalidRequest) as info:
        decode(decoder, body)
    assert info.value.status_code == 400
    assert info.value.type == "invalid_request_error"
    return info.value


# ---- duplicate keys ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("decoder", "body"),
    [
        (ADMIN, b'{"role":"app","role":"admin"}'),
        (ADMIN, b'{"role":"app","\\u0072ole":"admin"}'),  # the same key, escaped
        (ADMIN, b'{"role" : "app" ,\n "role":"admin"}'),
        (CHAT, b'{"model":"a","messages":[{"role":"user","content":"x"}],"model":"b"}'),
        (
            CHAT,
            b'{"model":"a","messages":[{"role":"user","content":"x"}],"stream":false,'
            b'"stream":true}',
        ),
        (CHAT, b'{"model":"a","messages":[{"role":"user","role":"system","content":"x"}]}'),
        (
            CHAT,
            b'{"model":"a","messages":[{"role":"user","content":"x"}],'
            b'"response_format":{"type":"json_schema","json_schema":{"name":"s",'
            b'"schema":{"type":"object","properties":{"a":{"type":"string","type":"integer"}}}}}}',
        ),
        # the duplicate sits after a nested object, and a string hides braces and colons
        (
            CHAT,
            b'{"model":"a","messages":[{"role":"user","content":"}{\\":"}],'
            b'"metadata":{"k":"v"},"model":"b"}',
        ),
        # a colon spelled \u003a elsewhere cannot hide the duplicate
        (
            CHAT,
            b'{"model":"a","messages":[{"role":"user","content":"\\u003a\\u003A"}],"model":"b"}',
        ),
        (COMPLETION, b'{"model":"a","prompt":"x","prompt":"y"}'),
        (EMBEDDINGS, b'{"model":"a","input":"x","\\u0069nput":"y"}'),
        (RESPONSES, b'{"model":"a","input":[{"role":"user","content":"x","content":"y"}]}'),
    ],
)
def test_a_duplicate_key_at_any_depth_is_refused(
    decoder: msgspec.json.Decoder[Any], body: bytes
) -> None:
    error = _refused(decoder, body)
    assert type(error) is errors.InvalidRequest
    assert DUPLICATE in error.message
    assert error.param is None


def test_the_refusal_does_not_repeat_the_key() -> None:
    error = _refused(ANY, b'{"CANARY7f3a":1,"CANARY7f3a":2}')
    assert "CANARY7f3a" not in error.message
    assert b"CANARY7f3a" not in errors.error_body(error)


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"a","messages":[{"role":"user","content":"x"},{"role":"assistant",'
        b'"content":"y"},{"role":"user","content":"z"}]}',  # the same keys in sibling objects
        b'{"model":"a","messages":[{"role":"user","content":"\\"role\\": \\"admin\\", :::"}]}',
        b'{"model":"a","messages":[{"role":"user","content":"a\\u003ab"}]}',
        b'{"model":"a","messages":[{"role":"user","content":"\\\\\\"model\\\\\\":"}]}',
        b'{"model":"a","messages":[{"role":"user","content":"x"}],"metadata":{"model":"m"}}',
    ],
)
def test_repeated_names_in_different_objects_and_colons_in_strings_pass(body: bytes) -> None:
    decode(CHAT, body)


# Keys chosen to collide: ASCII and non-ASCII letters, a colon, a quote and a backslash.
_KEY_CHARS = st.sampled_from(["a", "b", ":", '"', "\\", "é", "\U0001f600"])
_keys = st.text(_KEY_CHARS, max_size=3)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.text(st.sampled_from(["x", ":", '"', "\\", "{", "}", "é"]), max_size=4),
)
# An object is a list of pairs, so that the same key may occur twice.
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(st.tuples(_keys, inner), max_size=4).map(lambda pairs: ("obj", pairs)),
    ),
    max_leaves=12,
)


def _string(text: str, escape: st.DataObject) -> str:
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif escape.draw(st.booleans()):
            out.append("".join(f"\\u{u:04x}" for u in _utf16(ch)))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _utf16(ch: str) -> list[int]:
    raw = ch.encode("utf-16-be")
    return [int.from_bytes(raw[i : i + 2], "big") for i in range(0, len(raw), 2)]


def _write(value: Any, escape: st.DataObject) -> tuple[str, bool]:
    """The JSON text of `value` (keys and strings escaped at random, spaces around colons at
    random) and whether an object in it repeats a key."""
    if isinstance(value, tuple):
        parts, dup = [], False
        keys = [k for k, _ in value[1]]
        dup = len(set(keys)) != len(keys)
        for key, inner in value[1]:
            text, inner_dup = _write(inner, escape)
            dup = dup or inner_dup
            gap = " " if escape.draw(st.booleans()) else ""
            parts.append(f"{_string(key, escape)}{gap}:{gap}{text}")
        return "{" + ",".join(parts) + "}", dup
    if isinstance(value, list):
        written = [_write(v, escape) for v in value]
        return "[" + ",".join(t for t, _ in written) + "]", any(d for _, d in written)
    if isinstance(value, str):
        return _string(value, escape), False
    return json.dumps(value), False


@settings(max_examples=400, deadline=None)
@given(pairs=st.lists(st.tuples(_keys, _values), max_size=5), escape=st.data())
@example(pairs=[("a", 1), ("a", 2)], escape=None)
@example(pairs=[(":", ":"), (":", "")], escape=None)
def test_duplicate_detection_matches_a_reference(
    pairs: list[tuple[str, Any]], escape: st.DataObject | None
) -> None:
    class Plain:  # no escapes at all (the examples)
        def draw(self, _: Any) -> bool:
            return False

    text, dup = _write(("obj", pairs), escape or Plain())  # type: ignore[arg-type]
    body = text.encode()
    if dup:
        assert DUPLICATE in _refused(ANY, body).message
    else:
        assert decode(ANY, body) == json.loads(text)


# ---- unknown fields ---------------------------------------------------------------------------


def _chat(**fields: Any) -> bytes:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    body.update(fields)
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("decoder", "body", "param"),
    [
        (CHAT, _chat(CANARY7f3a=1), None),
        (CHAT, _chat(stream_options={"include_usage": True, "CANARY7f3a": 1}), "stream_options"),
        (CHAT, _chat(messages=[{"role": "user", "content": "x", "CANARY7f3a": 1}]), "messages[0]"),
        (
            CHAT,
            _chat(tools=[{"type": "function", "function": {"name": "f", "CANARY7f3a": 1}}]),
            "tools[0].function",
        ),
        (COMPLETION, json.dumps({"model": "m", "prompt": "x", "CANARY7f3a": 1}).encode(), None),
        (EMBEDDINGS, json.dumps({"model": "m", "input": "x", "CANARY7f3a": 1}).encode(), None),
        (RESPONSES, json.dumps({"model": "m", "input": "x", "CANARY7f3a": 1}).encode(), None),
        (ADMIN, json.dumps({"role": "app", "CANARY7f3a": "x"}).encode(), None),
        (ADMIN, json.dumps({"role": "app", "key_id": "x"}).encode(), None),
    ],
)
def test_an_unknown_field_is_not_repeated(
    decoder: msgspec.json.Decoder[Any], body: bytes, param: str | None
) -> None:
    error = _refused(decoder, body)
    assert isinstance(error, errors.UnsupportedParameter)
    assert error.param == param
    assert "unknown field" in error.message
    assert "CANARY7f3a" not in error.message and b"CANARY7f3a" not in errors.error_body(error)


@pytest.mark.parametrize(
    ("decoder", "body", "param"),
    [
        (CHAT, _chat(functions=[{"name": "f"}]), "functions"),
        (CHAT, _chat(web_search_options={}), "web_search_options"),
        (CHAT, _chat(input="x"), "input"),  # a Responses parameter sent to chat
        (
            CHAT,
            _chat(messages=[{"role": "user", "content": "x", "audio": {}}]),
            "messages[0].audio",
        ),
        (COMPLETION, json.dumps({"model": "m", "prompt": "x", "suffix": "y"}).encode(), "suffix"),
        (EMBEDDINGS, json.dumps({"model": "m", "input": "x", "n": 2}).encode(), "n"),
    ],
)
def test_a_known_parameter_is_named(
    decoder: msgspec.json.Decoder[Any], body: bytes, param: str
) -> None:
    error = _refused(decoder, body)
    assert isinstance(error, errors.UnsupportedParameter)
    assert error.param == param
    assert f"'{param}' is not supported" in error.message


def test_known_parameters_are_plain_names() -> None:
    assert all(name.isidentifier() and name.islower() for name in KNOWN_PARAMETERS)
