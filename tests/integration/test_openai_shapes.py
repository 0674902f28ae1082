"""Every response body the OpenAI routes send, validated against OpenAI's own published document.

The schemas come from OpenAI's OpenAPI 3.1 document (`openai/openai-openapi`), vendored as the
small subset the routes need in `tests/openai_spec/openai-schemas.json` (its header names the
commit; `tests/openai_spec/extract.py` rewrites it from a newer one).  Its component schemas are
JSON Schema 2020-12: each body is checked with `Draft202012Validator`, made as strict as a
generated client on two points the schema alone leaves open:

- a field sent as null must be declared by the schema (and null must be allowed there): a client
  generated from the document has no slot for an undeclared field, and null is what a gateway
  sends by mistake (a `max_model_len: null`, an `Optional` field not omitted);
- every required property must be present (the schema's own `required`).

Undeclared fields with a value (such as our `max_model_len`) are extensions clients ignore, and
are allowed.  The app runs in process over the echo engine (the HTTP path, not a model); the
unit tests at the end check that the validator refuses what it must, so that a test here can
fail.
"""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from jsonschema import Draft202012Validator, ValidationError
from jsonschema.validators import extend
from litestar import Litestar
from litestar.testing import TestClient
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from backends.echo import EchoEngine
from backends.errors import EngineFailure
from backends.types import GenerationDelta, GenerationRequest
from gateway.access.keys import key_store
from gateway.app import create_app
from gateway.config import Settings, load_settings
from gateway.engines.registry import ModelRegistry, ServedModel
from gateway.openai import types as t

SCHEMAS_FILE = Path(__file__).parents[1] / "openai_spec" / "openai-schemas.json"
DOCUMENT_URI = "urn:openai-openapi"

# ---- the validator ------------------------------------------------------------------------


# The legacy API streams CreateCompletionResponse itself (the document: "both the streamed and
# non-streamed response objects share the same shape"), but there `finish_reason` is a
# required string, so a chunk before the last has no valid value for it: OpenAI's own stream
# sends null.  Streamed legacy chunks are checked against a copy that allows null there, and
# only there.
LEGACY_CHUNK = "CreateCompletionResponse (streamed, finish_reason nullable)"


def _load_registry() -> tuple[dict[str, Any], Registry[Any]]:
    doc: dict[str, Any] = json.loads(SCHEMAS_FILE.read_text(encoding="utf-8"))
    schemas = doc["components"]["schemas"]
    chunk = copy.deepcopy(schemas["CreateCompletionResponse"])
    choice = chunk["properties"]["choices"]["items"]["properties"]
    choice["finish_reason"] = {"anyOf": [choice["finish_reason"], {"type": "null"}]}
    schemas[LEGACY_CHUNK] = chunk
    resource = Resource.from_contents(doc, default_specification=DRAFT202012)
    return doc, Registry().with_resource(DOCUMENT_URI, resource)


DOCUMENT, REGISTRY = _load_registry()
_properties = Draft202012Validator.VALIDATORS["properties"]


def _properties_with_declared_nulls(
    validator: Any, properties: dict[str, Any], instance: Any, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    """`properties`, and: a field sent as null must be one of them (or covered by
    `additionalProperties`/`patternProperties`, which the base keywords check)."""
    yield from _properties(validator, properties, instance, schema)
    if not validator.is_type(instance, "object"):
        return
    if "additionalProperties" in schema or "patternProperties" in schema:
        return
    for name, value in instance.items():
        if value is None and name not in properties:
            yield ValidationError(f"{name!r} is sent as null, but the schema does not declare it")


StrictValidator = extend(
    Draft202012Validator, {"properties": _properties_with_declared_nulls}, version="strict"
)


def _leaves(error: ValidationError) -> Iterator[ValidationError]:
    """The deepest errors: for an anyOf, why each branch failed."""
    if not error.context:
        yield error
    for sub in error.context:
        yield from _leaves(sub)


def violations(schema_name: str, instance: Any) -> list[str]:
    """Why `instance` is not a valid `schema_name` of the document (empty when it is)."""
    assert schema_name in DOCUMENT["components"]["schemas"], schema_name
    schema = {"$ref": f"{DOCUMENT_URI}#/components/schemas/{schema_name}"}
    validator = StrictValidator(schema, registry=REGISTRY)
    out = []
    for error in validator.iter_errors(instance):
        for leaf in _leaves(error):
            where = "/".join(str(p) for p in leaf.absolute_path) or "(body)"
            out.append(f"{where}: {leaf.message}")
    return out


def assert_conforms(schema_name: str, instance: Any) -> None:
    found = violations(schema_name, instance)
    sent = json.dumps(instance)
    sent = sent if len(sent) < 1500 else sent[:1500] + "..."
    assert not found, f"not a valid {schema_name}:\n  " + "\n  ".join(found) + f"\nsent: {sent}"


# ---- the app --------------------------------------------------------------------------------


class FailingEngine(EchoEngine):
    """Streams one token, then fails the way a crashed engine does."""

    name = "failing"

    async def submit(self, request: GenerationRequest) -> Any:
        inner = await super().submit(request)

        class Handle:
            prompt_tokens = inner.prompt_tokens

            def cancel(self) -> None:
                inner.cancel()

            async def __aiter__(self) -> AsyncIterator[GenerationDelta]:
                yield GenerationDelta(text=" first", n_tokens=1)
                raise EngineFailure("llama_decode failed (-3)")

        return Handle()


def _settings(data_dir: Path) -> Settings:
    return load_settings(None, environ={}, overrides={"data_dir": str(data_dir)})


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("openai-shapes-data")


@pytest.fixture(scope="module")
async def app_key(data_dir: Path) -> str:
    async with key_store(_settings(data_dir)) as store:
        key, _ = await store.create("app", name="test-openai-shapes")
        return key


@pytest.fixture(scope="module")
def client(data_dir: Path, app_key: str) -> Iterator[TestClient[Litestar]]:
    registry = ModelRegistry(
        [
            ServedModel("echo", EchoEngine(context_length=512), aliases=["echo-alias"]),
            ServedModel("broken", FailingEngine()),
        ]
    )
    with TestClient(create_app(_settings(data_dir), registry=registry)) as c:
        c.headers["Authorization"] = f"Bearer {app_key}"
        while c.get("/ready").status_code != 200:  # engines start in the background
            pass
        yield c


def ok_json(resp: Any) -> Any:
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    return resp.json()


def sse_chunks(resp: Any) -> list[Any]:
    """The JSON events of an SSE response, checked to end with `[DONE]`."""
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = [e for e in resp.text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events), events
    data = [e.removeprefix("data: ") for e in events]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


# What the openai SDK sends by default: the model and the messages, nothing else.
SDK_CHAT = {"model": "echo", "messages": [{"role": "user", "content": "Say hello"}]}


# ---- chat -----------------------------------------------------------------------------------


def test_chat_completion_as_the_sdk_sends_it(client: TestClient[Litestar]) -> None:
    body = ok_json(client.post("/v1/chat/completions", json=SDK_CHAT))
    assert_conforms("CreateChatCompletionResponse", body)


def test_chat_completion_with_logprobs(client: TestClient[Litestar]) -> None:
    for extra in ({"logprobs": True}, {"logprobs": True, "top_logprobs": 2, "max_tokens": 4}):
        body = ok_json(client.post("/v1/chat/completions", json={**SDK_CHAT, **extra}))
        assert body["choices"][0]["logprobs"] is not None, extra
        assert_conforms("CreateChatCompletionResponse", body)


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"stream_options": {"include_usage": True}},
        {"stream_options": {"include_usage": False}},
        {"logprobs": True, "stream_options": {"include_usage": True}},
    ],
    ids=["plain", "include_usage", "include_usage_false", "logprobs"],
)
def test_every_chat_chunk(client: TestClient[Litestar], extra: dict[str, Any]) -> None:
    chunks = sse_chunks(
        client.post("/v1/chat/completions", json={**SDK_CHAT, "stream": True, **extra})
    )
    assert len(chunks) > 2
    for chunk in chunks:
        assert_conforms("CreateChatCompletionStreamResponse", chunk)
    # The document: `usage` is "only present when you set stream_options.include_usage", and
    # then an object on the last chunk (whose choices are empty).
    if extra.get("stream_options", {}).get("include_usage"):
        assert chunks[-1]["choices"] == [] and isinstance(chunks[-1]["usage"], dict)
        chunks = chunks[:-1]
    assert all("usage" not in c for c in chunks), [c for c in chunks if "usage" in c]


def test_a_stream_that_fails_ends_with_an_error_event(client: TestClient[Litestar]) -> None:
    resp = client.post("/v1/chat/completions", json={**SDK_CHAT, "model": "broken", "stream": True})
    assert resp.status_code == 200
    events = [json.loads(e.removeprefix("data: ")) for e in resp.text.split("\n\n") if e]
    for chunk in events[:-1]:
        assert_conforms("CreateChatCompletionStreamResponse", chunk)
    assert_conforms("ErrorResponse", events[-1])


# A request with tools gets its last user message back from the echo engine, as the text a
# constrained model would write: here, one call.
TOOL_CALL = {
    **SDK_CHAT,
    "messages": [
        {
            "role": "user",
            "content": '<tool_call>[{"name": "get_weather", "arguments": {"city": "Oslo"}}]',
        }
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ],
}


def test_chat_completion_with_a_tool_call(client: TestClient[Litestar]) -> None:
    body = ok_json(client.post("/v1/chat/completions", json=TOOL_CALL))
    assert body["choices"][0]["message"].get("tool_calls"), body
    assert_conforms("CreateChatCompletionResponse", body)


def test_every_chunk_of_a_streamed_tool_call(client: TestClient[Litestar]) -> None:
    chunks = sse_chunks(client.post("/v1/chat/completions", json={**TOOL_CALL, "stream": True}))
    assert any(c["choices"][0]["delta"].get("tool_calls") for c in chunks), chunks
    for chunk in chunks:
        assert_conforms("CreateChatCompletionStreamResponse", chunk)


# ---- legacy completions ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"prompt": ["a", "b"], "max_tokens": 3},
        {"echo": True, "logprobs": 2},
    ],
    ids=["plain", "two_prompts", "echo_logprobs"],
)
def test_completion(client: TestClient[Litestar], extra: dict[str, Any]) -> None:
    request = {"model": "echo", "prompt": "Say hello", **extra}
    assert_conforms(
        "CreateCompletionResponse", ok_json(client.post("/v1/completions", json=request))
    )


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"stream_options": {"include_usage": True}},
        {"prompt": ["a", "b"], "max_tokens": 3, "stream_options": {"include_usage": True}},
        {"echo": True, "logprobs": 2},
    ],
    ids=["plain", "include_usage", "two_prompts", "echo_logprobs"],
)
def test_every_completion_chunk(client: TestClient[Litestar], extra: dict[str, Any]) -> None:
    """The legacy API streams the non-streamed shape: CreateCompletionResponse, whose `usage`
    is not nullable (so it is absent, not null, on all but the usage chunk); `finish_reason`
    is null until the last text chunk (see LEGACY_CHUNK)."""
    request = {"model": "echo", "prompt": "Say hello", "stream": True, **extra}
    chunks = sse_chunks(client.post("/v1/completions", json=request))
    assert len(chunks) > 1
    for chunk in chunks:
        assert_conforms(LEGACY_CHUNK, chunk)
    assert any(c["choices"] and c["choices"][0]["finish_reason"] for c in chunks)


# ---- models ---------------------------------------------------------------------------------


def test_models(client: TestClient[Litestar]) -> None:
    listing = ok_json(client.get("/v1/models"))
    assert_conforms("ListModelsResponse", listing)
    assert [m["id"] for m in listing["data"]] == ["echo", "echo-alias", "broken"]
    for name in ("echo", "echo-alias"):
        assert_conforms("Model", ok_json(client.get(f"/v1/models/{name}")))


# ---- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status"),
    [
        ("POST", "/v1/chat/completions", {"json": {**SDK_CHAT, "n": "x"}}, 400),
        ("POST", "/v1/chat/completions", {"json": {**SDK_CHAT, "nope": 1}}, 400),
        ("POST", "/v1/completions", {"content": b"{not json"}, 400),
        ("GET", "/v1/models", {"headers": {"Authorization": "Bearer ag_wrong"}}, 401),
        ("GET", "/v1/models/nope", {}, 404),
        ("POST", "/v1/chat/completions", {"json": {**SDK_CHAT, "model": "gpt-9"}}, 404),
        ("POST", "/v1/completions", {"json": {"model": "broken", "prompt": "x"}}, 500),
    ],
    ids=[
        "bad_field",
        "unknown_field",
        "not_json",
        "bad_key",
        "model_route_404",
        "model_not_found",
        "engine_failure",
    ],
)
def test_error_bodies(
    client: TestClient[Litestar], method: str, path: str, kwargs: dict[str, Any], status: int
) -> None:
    resp = client.request(method, path, **kwargs)
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    assert_conforms("ErrorResponse", resp.json())


# ---- the validator refuses what it must -------------------------------------------------------


CHAT = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "echo",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hi", "refusal": None},
            "finish_reason": "stop",
            "logprobs": {"content": [], "refusal": None},
        }
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}
COMPLETION_CHUNK = {
    "id": "cmpl-1",
    "object": "text_completion",
    "created": 1,
    "model": "echo",
    "choices": [{"index": 0, "text": " tok0", "finish_reason": None, "logprobs": None}],
}


def _with(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """`base` (deep-copied) with the field at `a/0/b` set to `value`, or removed for `...`."""
    out: dict[str, Any] = json.loads(json.dumps(base))
    *parents, last = path.split("/")
    node: Any = out
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return out


def test_the_valid_examples_pass() -> None:
    assert violations("CreateChatCompletionResponse", CHAT) == []
    assert violations(LEGACY_CHUNK, COMPLETION_CHUNK) == []
    assert violations("Model", {"id": "m", "object": "model", "created": 1, "owned_by": "x"}) == []


@pytest.mark.parametrize(
    ("schema", "payload", "expected"),
    [
        # declared, but only as a string: null is refused
        (
            "CreateChatCompletionResponse",
            _with(CHAT, "system_fingerprint", None),
            "system_fingerprint: None is not of type 'string'",
        ),
        # the legacy chunk's usage is not nullable
        (
            LEGACY_CHUNK,
            _with(COMPLETION_CHUNK, "usage", None),
            "usage: None is not of type 'object'",
        ),
        # the allowance for streamed legacy chunks is theirs only
        (
            "CreateCompletionResponse",
            COMPLETION_CHUNK,
            "choices/0/finish_reason: None is not of type 'string'",
        ),
        # required: a string or null, never absent
        (
            "CreateChatCompletionResponse",
            _with(CHAT, "choices/0/message/refusal", ...),
            "choices/0/message: 'refusal' is a required property",
        ),
        (
            "CreateChatCompletionResponse",
            _with(CHAT, "choices/0/logprobs/refusal", ...),
            "choices/0/logprobs: 'refusal' is a required property",
        ),
        (
            "CreateChatCompletionStreamResponse",
            {**_with(CHAT, "object", "chat.completion.chunk"), "choices": [{"index": 0}]},
            "choices/0: 'delta' is a required property",
        ),
        # undeclared and null: the strict check, through a $ref and an array
        (
            "ListModelsResponse",
            {
                "object": "list",
                "data": [
                    {
                        "id": "m",
                        "object": "model",
                        "created": 1,
                        "owned_by": "x",
                        "max_model_len": None,
                    }
                ],
            },
            "data/0: 'max_model_len' is sent as null, but the schema does not declare it",
        ),
        (
            "ErrorResponse",
            {"error": {"message": "m", "type": "t", "param": None, "code": None, "extra": None}},
            "error: 'extra' is sent as null",
        ),
    ],
    ids=[
        "system_fingerprint_null",
        "completion_usage_null",
        "completion_finish_reason_null",
        "message_refusal_missing",
        "logprobs_refusal_missing",
        "chunk_delta_missing",
        "undeclared_null_in_model",
        "undeclared_null_in_error",
    ],
)
def test_the_validator_refuses(schema: str, payload: Any, expected: str) -> None:
    found = violations(schema, payload)
    assert any(expected in v for v in found), found


def test_an_undeclared_field_with_a_value_is_an_allowed_extension() -> None:
    model = {"id": "m", "object": "model", "created": 1, "owned_by": "x", "max_model_len": 8}
    assert violations("Model", model) == []


def test_the_vendored_file_names_its_source() -> None:
    source = DOCUMENT["source"]
    assert source["repository"] == "openai/openai-openapi"
    assert len(source["commit"]) == 40 and source["path"] and source["commit_date"]
    assert source["openapi"].startswith("3.1")


# ---- what the llama.cpp and vLLM engines add: logprobs with echo -----------------------------


def test_legacy_logprobs_of_an_echoed_prompt_differ_from_the_document_only_in_the_first_null() -> (
    None
):
    """`echo` with `logprobs` on a real engine: nothing predicts the first prompt token, so
    its logprob is null (backends.types.TokenLogprob) and `_Logprobs.add` sends
    `token_logprobs[0] = null` and `top_logprobs[0] = null`.  OpenAI's document declares
    those arrays' items as a number and an object, never null, while OpenAI's API sends null
    there too: we keep the API's behaviour, and this test pins that it is the only difference
    (the echo engine has no logprobs, so this shape is built from the gateway's own types)."""
    logprobs = t.CompletionLogprobs(
        tokens=["Say", " tok0"],
        token_logprobs=[None, -0.5],
        top_logprobs=[None, {" tok0": -0.5}],
        text_offset=[0, 3],
    )
    body = t.Completion(
        id="cmpl-1",
        created=1,
        model="m",
        choices=[t.CompletionChoice(0, "Say tok0", "length", logprobs)],
        usage=t.UsageInfo(1, 1, 2),
    )
    decoded = msgspec.json.decode(msgspec.json.encode(body))
    found = violations("CreateCompletionResponse", decoded)
    assert any("token_logprobs/0: None" in v for v in found), found
    assert any("top_logprobs/0: None" in v for v in found), found
    first = decoded["choices"][0]["logprobs"]
    first["token_logprobs"][0], first["top_logprobs"][0] = 0.0, {}
    assert_conforms("CreateCompletionResponse", decoded)
