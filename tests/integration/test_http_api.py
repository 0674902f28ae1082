"""The HTTP layer in-process (Litestar test client) over the echo engine and a failing engine.

Every app opens its access stack on this module's own data dir, where one app key is created
first; the client sends it on every request (one test checks what a caller without it gets).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgspec
import openai
import pytest
from litestar import Litestar
from litestar.testing import TestClient

from backends.echo import EchoEngine
from backends.errors import EngineFailure
from backends.types import EngineLoad, GenerationDelta, GenerationRequest
from gateway.access.auth import ApiKeyRecord
from gateway.access.keys import key_store
from gateway.app import create_app
from gateway.config import Settings, load_settings
from gateway.engines.registry import ModelRegistry, ServedModel

CANARY = "CANARY-7f3a9d-do-not-log"


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

    def load(self) -> EngineLoad:
        return EngineLoad(0, 0, 1, 0, 0.0)


class NeverLoads(EchoEngine):
    """An engine still loading: `start()` returns only when the app's shutdown cancels it."""

    async def start(self) -> None:
        await asyncio.Event().wait()


def settings_for(data_dir: Path, **server: Any) -> Settings:
    overrides = {"data_dir": str(data_dir), **{f"server.{k}": v for k, v in server.items()}}
    return load_settings(None, environ={}, overrides=overrides)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This module's data dir: audit database, API keys, audit signing key."""
    return tmp_path_factory.mktemp("http-api-data")


@pytest.fixture(scope="module")
async def app_key(data_dir: Path) -> tuple[str, ApiKeyRecord]:
    """An app key in the module's database: (the key, its record)."""
    async with key_store(settings_for(data_dir)) as store:
        return await store.create("app", name="test-http-api")


def bearer(key: tuple[str, ApiKeyRecord]) -> str:
    return f"Bearer {key[0]}"


def make_app(data_dir: Path, **server: Any) -> Litestar:
    registry = ModelRegistry(
        [
            ServedModel("echo", EchoEngine(context_length=512), aliases=["echo-alias"]),
            ServedModel("broken", FailingEngine()),
        ]
    )
    return create_app(settings_for(data_dir, **server), registry=registry)


@pytest.fixture
def client(data_dir: Path, app_key: tuple[str, ApiKeyRecord]) -> Iterator[TestClient[Litestar]]:
    with TestClient(make_app(data_dir, max_request_bytes=64 * 1024)) as c:
        c.headers["Authorization"] = bearer(app_key)
        ready = c.get("/ready")
        while ready.status_code != 200:  # engines start in the background
            ready = c.get("/ready")
        yield c


def chat(**kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "echo",
        "messages": [{"role": "user", "content": CANARY}],
        "max_tokens": 4,
    }
    body.update(kw)
    return body


def assert_envelope(
    resp: Any, status: int, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"]
    if code is not None:
        assert err["code"] == code
    if param is not None:
        assert err["param"] == param
    assert CANARY not in resp.text
    return err


def test_chat_non_stream_shape_and_usage(client: TestClient[Litestar]) -> None:
    resp = client.post("/v1/chat/completions", json=chat())
    assert resp.status_code == 200
    body = resp.json()
    assert body["object"] == "chat.completion"
    message = body["choices"][0]["message"]
    assert message == {"role": "assistant", "content": " tok0 tok1 tok2 tok3", "refusal": None}
    assert body["choices"][0]["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["completion_tokens"] == 4 and usage["total_tokens"] == usage["prompt_tokens"] + 4
    assert resp.headers["x-request-id"]


def test_no_max_tokens_uses_what_remains_of_the_context(
    client: TestClient[Litestar], app_key: tuple[str, ApiKeyRecord]
) -> None:
    """The official SDK leaves max_tokens out by default.  The default policy's cap (4096) is
    then a ceiling, not a demand: on the echo engine's 512-token context the completion gets
    what the prompt leaves, instead of a context_length_exceeded for prompt + 4096."""
    sdk = openai.OpenAI(
        base_url=str(client.base_url) + "/v1", api_key=app_key[0], http_client=client
    )
    reply = sdk.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hi"}])
    usage = reply.usage
    assert usage is not None
    assert reply.choices[0].finish_reason == "length"
    assert usage.prompt_tokens + usage.completion_tokens == 512
    chunks = list(
        sdk.chat.completions.create(
            model="echo",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == 512
    # an explicit max_tokens is the client's demand: refused when it cannot fit
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(
            model="echo", messages=[{"role": "user", "content": "hi"}], max_tokens=600
        )
    assert info.value.code == "context_length_exceeded"


def test_request_id_is_the_servers_and_the_clients_is_only_echoed(
    client: TestClient[Litestar],
) -> None:
    resp = client.post("/v1/chat/completions", json=chat(), headers={"x-request-id": "abc-123"})
    server_id = resp.headers["x-request-id"]
    assert server_id != "abc-123"
    assert resp.headers["x-client-request-id"] == "abc-123"
    assert resp.json()["id"] == f"chatcmpl-{server_id}"
    again = client.post("/v1/chat/completions", json=chat(), headers={"x-request-id": "abc-123"})
    assert again.headers["x-request-id"] != server_id
    bad = client.post("/v1/chat/completions", json=chat(), headers={"x-request-id": "a b;" * 40})
    assert "x-client-request-id" not in bad.headers


def sse_events(text: str) -> list[str]:
    assert text.endswith("\n\n")
    events = [e for e in text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    return [e[len("data: ") :] for e in events]


def test_chat_stream_with_usage(client: TestClient[Litestar]) -> None:
    resp = client.post(
        "/v1/chat/completions", json=chat(stream=True, stream_options={"include_usage": True})
    )
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = sse_events(resp.text)
    assert events[-1] == "[DONE]"
    chunks = [msgspec.json.decode(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert content == " tok0 tok1 tok2 tok3"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4


def test_stream_without_include_usage_has_no_usage_chunk(client: TestClient[Litestar]) -> None:
    events = sse_events(client.post("/v1/chat/completions", json=chat(stream=True)).text)
    chunks = [msgspec.json.decode(e) for e in events[:-1]]
    assert all("usage" not in c for c in chunks)  # omitted, never null
    assert all(c["choices"] for c in chunks)


def test_stop_string_ends_with_stop(client: TestClient[Litestar]) -> None:
    body = client.post("/v1/chat/completions", json=chat(max_tokens=10, stop=[" tok2"])).json()
    assert body["choices"][0]["message"]["content"] == " tok0 tok1"
    assert body["choices"][0]["finish_reason"] == "stop"


def test_completions_with_a_list_of_prompts(client: TestClient[Litestar]) -> None:
    body = client.post(
        "/v1/completions", json={"model": "echo", "prompt": ["a", "b", "c"], "max_tokens": 2}
    ).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert all(c["text"] == " tok0 tok1" for c in body["choices"])
    assert body["usage"]["completion_tokens"] == 6


def test_completions_stream_merges_choices(client: TestClient[Litestar]) -> None:
    resp = client.post(
        "/v1/completions",
        json={
            "model": "echo",
            "prompt": ["a", "b"],
            "max_tokens": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    chunks = [msgspec.json.decode(e) for e in sse_events(resp.text)[:-1]]
    texts = {0: "", 1: ""}
    for c in chunks[:-1]:
        for choice in c["choices"]:
            texts[choice["index"]] += choice["text"]
    assert texts == {0: " tok0 tok1 tok2", 1: " tok0 tok1 tok2"}
    assert chunks[-1]["usage"]["completion_tokens"] == 6


def test_aliases_and_models_routes(client: TestClient[Litestar]) -> None:
    ids = [m["id"] for m in client.get("/v1/models").json()["data"]]
    assert ids == ["echo", "echo-alias", "broken"]
    assert client.get("/v1/models/echo-alias").json()["id"] == "echo-alias"
    assert client.post("/v1/chat/completions", json=chat(model="echo-alias")).status_code == 200
    assert_envelope(client.get("/v1/models/nope"), 404, "model_not_found")


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        (b"{not json", 400, None, None),
        (b"[1, 2]", 400, None, None),
        (msgspec.json.encode(chat(max_tokens="ten")), 400, None, "max_tokens"),
        (msgspec.json.encode(chat(max_tokens=-1)), 400, None, "max_tokens"),
        (msgspec.json.encode(chat(max_tokens=10**9)), 400, None, "max_tokens"),
        # within the policy's max_tokens cap (4096), past the echo engine's context (512)
        (msgspec.json.encode(chat(max_tokens=1000)), 400, "context_length_exceeded", "messages"),
        (msgspec.json.encode(chat(n=9)), 400, None, "n"),  # at most 8 choices
        (msgspec.json.encode(chat(store=True)), 400, "unsupported_parameter", "store"),
        (msgspec.json.encode(chat(temperature=5)), 400, None, "temperature"),
        (msgspec.json.encode(chat(model="gpt-9")), 404, "model_not_found", "model"),
        (msgspec.json.encode(chat(messages=[])), 400, None, "messages"),
        (msgspec.json.encode(chat(messages=[{"role": CANARY, "content": "x"}])), 400, None, None),
        (
            msgspec.json.encode(
                chat(
                    messages=[
                        {
                            "role": "user",
                            "content": [{"type": "image_url", "image_url": {"url": CANARY}}],
                        }
                    ]
                )
            ),
            400,
            "unsupported_parameter",
            None,
        ),
        (
            msgspec.json.encode(
                chat(messages=[{"role": "user", "content": "x"}], function_call={"name": CANARY})
            ),
            400,
            "unsupported_parameter",
            "function_call",
        ),
        (msgspec.json.encode(chat(stop=[CANARY, 3])), 400, None, None),
        (msgspec.json.encode(chat(logit_bias={CANARY: 1})), 400, None, "logit_bias"),
        (msgspec.json.encode(chat(top_logprobs=2)), 400, None, "top_logprobs"),
        (
            msgspec.json.encode({"messages": [{"role": "user", "content": CANARY}]}),
            400,
            None,
            "model",
        ),
    ],
)
def test_bad_chat_requests_get_the_openai_envelope(
    client: TestClient[Litestar], body: bytes, status: int, code: str | None, param: str | None
) -> None:
    resp = client.post(
        "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert_envelope(resp, status, code, param)


def test_bad_completion_prompts(client: TestClient[Litestar]) -> None:
    for prompt in ([], ["a", 1], [[1, 2], "b"], ["p"] * 17):
        assert_envelope(
            client.post("/v1/completions", json={"model": "echo", "prompt": prompt}),
            400,
            param="prompt",
        )


def test_body_over_the_limit_is_413(client: TestClient[Litestar]) -> None:
    resp = client.post(
        "/v1/chat/completions", json=chat(messages=[{"role": "user", "content": CANARY * 10_000}])
    )
    assert_envelope(resp, 413, "request_too_large")


def test_unknown_route_and_wrong_method(client: TestClient[Litestar]) -> None:
    assert_envelope(client.get("/v1/nothing"), 404, "not_found")
    assert_envelope(client.get("/v1/chat/completions"), 405, "method_not_allowed")


def test_engine_failure_after_first_token_is_one_sse_error_event(
    client: TestClient[Litestar],
) -> None:
    resp = client.post("/v1/chat/completions", json=chat(model="broken", stream=True))
    assert resp.status_code == 200
    events = sse_events(resp.text)
    assert "[DONE]" not in events
    last = msgspec.json.decode(events[-1])
    assert last["error"]["code"] == "internal_error"
    assert "llama_decode" not in last["error"]["message"]
    contents = [msgspec.json.decode(e)["choices"][0]["delta"].get("content") for e in events[:-1]]
    assert " first" in contents


def test_engine_failure_without_stream_is_500_envelope(client: TestClient[Litestar]) -> None:
    assert_envelope(
        client.post("/v1/chat/completions", json=chat(model="broken")), 500, "internal_error"
    )


def test_a_client_gone_before_a_whole_answer_is_a_499_not_an_exception(
    client: TestClient[Litestar],
) -> None:
    """The client hangs up while a non-streamed answer is generated: the generation is
    aborted and the request ends as a 499 (in the log and the metrics), not as an exception
    out of the app (which uvicorn logs as an error with a traceback)."""
    body = msgspec.json.encode(chat(max_tokens=400))  # 400 loop turns: the hang-up comes first
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "headers": [
            (b"content-type", b"application/json"),
            (b"authorization", client.headers["Authorization"].encode()),
            (b"content-length", str(len(body)).encode()),
        ],
    }
    sent: list[dict[str, Any]] = []
    messages = iter(
        [{"type": "http.request", "body": body, "more_body": False}, {"type": "http.disconnect"}]
    )

    async def receive() -> dict[str, Any]:
        return next(messages)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def call() -> None:
        await client.app(scope, receive, send)  # type: ignore[arg-type]

    client.blocking_portal.call(call)  # an exception out of the app would be raised here
    assert (sent[0]["type"], sent[0]["status"]) == ("http.response.start", 499), sent[:2]
    metrics = client.get("/metrics").text
    assert 'airgate_requests_total{route="/v1/chat/completions",status="499"} 1.0' in metrics


def test_health_ready_metrics_and_openapi(client: TestClient[Litestar]) -> None:
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").status_code == 200
    client.post("/v1/chat/completions", json=chat())
    metrics = client.get("/metrics").text
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        'airgate_requests_total{route="/v1/chat/completions",status="200"}',
    ):
        assert name in metrics
    doc = client.get("/openapi.json").json()
    assert set(doc["paths"]) >= {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
        "/v1/models/{model}",
    }
    assert "ChatCompletionRequest" in doc["components"]["schemas"]
    # Ollama's routes: NDJSON streams and Ollama's error shape; its refused routes left out
    chat_op = doc["paths"]["/api/chat"]["post"]
    assert set(chat_op["responses"]["200"]["content"]) == {
        "application/json",
        "application/x-ndjson",
    }
    assert chat_op["responses"]["400"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/OllamaError"
    }
    assert doc["paths"]["/v1/models"]["get"]["responses"]["200"]["content"]["application/json"][
        "schema"
    ] == {"$ref": "#/components/schemas/ModelList"}
    assert "/api/pull" not in doc["paths"] and "/admin/keys" not in doc["paths"]
    refs = set(re.findall(r'"\$ref": ?"#/components/schemas/([^"]+)"', json.dumps(doc)))
    assert refs <= set(doc["components"]["schemas"])  # every reference resolves


def test_ready_is_503_until_engines_are_loaded(
    data_dir: Path, app_key: tuple[str, ApiKeyRecord]
) -> None:
    registry = ModelRegistry([ServedModel("echo", NeverLoads())])
    with TestClient(create_app(settings_for(data_dir), registry=registry)) as client:
        client.headers["Authorization"] = bearer(app_key)
        assert_envelope(client.get("/ready"), 503, "service_unavailable")
        assert_envelope(
            client.post("/v1/chat/completions", json=chat()), 503, "service_unavailable"
        )


def test_requests_without_a_valid_key_are_401(client: TestClient[Litestar]) -> None:
    key = client.headers.pop("Authorization")
    for resp in (
        client.post("/v1/chat/completions", json=chat()),
        client.get("/v1/models"),
        client.get("/metrics"),
        client.get("/v1/nothing"),  # unrouted paths reveal nothing to anonymous callers
        client.get("/v1/models", headers={"Authorization": key + "x"}),
        client.get("/v1/models", headers={"Authorization": "Basic dXNlcjpwYXNz"}),
    ):
        assert_envelope(resp, 401, "invalid_api_key")
        assert resp.headers["www-authenticate"] == "Bearer"
    for public in ("/health", "/ready", "/openapi.json"):
        assert client.get(public).status_code == 200, public


def test_no_content_in_logs(
    client: TestClient[Litestar],
    app_key: tuple[str, ApiKeyRecord],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("DEBUG")
    client.post("/v1/chat/completions", json=chat(stop=[CANARY]))
    client.post("/v1/chat/completions", json=chat(model="broken", stream=True))
    client.post("/v1/chat/completions", json=chat(model="broken"))
    client.post("/v1/chat/completions", json=chat(max_tokens="x"))
    client.post("/v1/completions", json={"model": "echo", "prompt": CANARY, "echo": True})
    lines = [r for r in caplog.records if r.name == "airgate.request"]
    assert len(lines) == 5
    # the caller is named by its key id; the key itself reaches no log record
    key, record = app_key
    assert all(getattr(r, "fields", {}).get("key_id") == record.key_id for r in lines)
    for secret in (CANARY, key):
        assert all(
            secret not in r.getMessage() and secret not in str(getattr(r, "fields", ""))
            for r in caplog.records
        )
        assert all(secret not in (r.exc_text or "") for r in caplog.records)
