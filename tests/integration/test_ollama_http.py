"""Ollama's API on the HTTP path, with the echo engine standing in for the model.

Every route, streamed (NDJSON, Ollama's default) and not; `options` mapped onto the sampling the
engine gets (or refused with a 400 naming the option); `format` and `tools` through the same
checks as OpenAI's; errors in Ollama's shape `{"error": "..."}` with the right statuses (a 401
without a key, 403 for the model-management routes, 404 for an unknown model); the audit's
actions and counts; and no canary in the audit log or in any error.  The unchanged `ollama`
client drives a few requests over the test client's transport.  With the real model and a real
server: tests/e2e/test_ollama_client.py.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import ollama
import pytest
from litestar import Litestar
from litestar.testing import TestClient

from backends.echo import EchoEngine
from backends.types import GenerationRequest
from gateway.app import create_app
from gateway.config import load_settings
from gateway.engines.registry import ModelRegistry, ServedModel

CANARY = "CANARY-4f7b21-ollama"
POLICY = """
name = "ollama"

[[rules]]
name = "embed-only"
teams = ["embed-only"]
roles = ["app"]
models = ["*"]
actions = ["embeddings"]

[[rules]]
name = "apps"
roles = ["app", "admin"]
models = ["*"]
max_tokens = 64
tokens_per_minute = 100000
"""
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


class Recording(EchoEngine):
    """The echo engine, keeping the last request it was given (to see the mapped options)."""

    last: GenerationRequest | None = None

    async def submit(self, request: GenerationRequest) -> Any:
        Recording.last = request
        return await super().submit(request)


class Gateway:
    def __init__(self, client: TestClient[Litestar], data_dir: Path, keys: dict[str, str]):
        self.client = client
        self.data_dir = data_dir
        self.keys = keys

    def headers(self, who: str = "app") -> dict[str, str]:
        return {"authorization": f"Bearer {self.keys[who]}"}

    def post(self, path: str, body: dict[str, Any], who: str = "app") -> Any:
        return self.client.post(path, json=body, headers=self.headers(who))

    def lines(self, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        reply = self.post(path, body)
        assert reply.status_code == 200, reply.text
        assert reply.headers["content-type"].startswith("application/x-ndjson")
        return [json.loads(line) for line in reply.text.splitlines()]

    def ollama(self, who: str = "app") -> ollama.Client:
        return ollama.Client(
            host=str(self.client.base_url),
            headers={"Authorization": f"Bearer {self.keys[who]}"},
            transport=self.client._transport,
        )

    def events(self, request_id: str) -> list[dict[str, Any]]:
        with contextlib.closing(sqlite3.connect(self.data_dir / "airgate.db")) as conn:
            rows = conn.execute("SELECT body FROM audit_events ORDER BY seq").fetchall()
        bodies = [json.loads(row[0]) for row in rows]
        return [b for b in bodies if b.get("request_id") == request_id]

    def dump(self) -> str:
        with contextlib.closing(sqlite3.connect(self.data_dir / "airgate.db")) as conn:
            return "\n".join(conn.iterdump())


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    root = tmp_path_factory.mktemp("ollama-http")
    policy = root / "policy" / "10-ollama.toml"
    policy.parent.mkdir()
    policy.write_text(POLICY)
    settings = load_settings(
        None,
        environ={},
        overrides={"data_dir": str(root / "data"), "policy.path": str(policy)},
    )
    registry = ModelRegistry(
        [
            ServedModel("echo", Recording(context_length=2048), aliases=["echo:latest"]),
            ServedModel("embedder", EchoEngine(context_length=64, task="embed")),
        ]
    )
    app = create_app(settings, registry=registry)
    with TestClient(app) as client:
        while client.get("/ready").status_code != 200:  # engines start in the background
            pass
        security = app.state["security_holder"].get()
        keys = {
            who: client.blocking_portal.call(partial(security.keys.create, "app", team=team))[0]
            for who, team in (("app", None), ("embed-only", "embed-only"))
        }
        yield Gateway(client, root / "data", keys)


def chat_body(**kw: Any) -> dict[str, Any]:
    return {"model": "echo", "messages": [{"role": "user", "content": f"hi {CANARY}"}], **kw}


# ---- chat ----------------------------------------------------------------------------------


def test_chat_streams_ndjson_by_default(gw: Gateway) -> None:
    lines = gw.lines("/api/chat", chat_body(options={"num_predict": 5}))
    *pieces, final = lines
    assert len(pieces) == 5
    assert all(p["done"] is False and p["message"]["role"] == "assistant" for p in pieces)
    assert "".join(p["message"]["content"] for p in pieces) == " tok0 tok1 tok2 tok3 tok4"
    assert final["done"] is True and final["done_reason"] == "length"
    assert final["message"] == {"role": "assistant", "content": ""}
    assert final["model"] == "echo" and final["created_at"].endswith("Z")
    assert final["eval_count"] == 5 and final["prompt_eval_count"] > 0
    assert final["load_duration"] == 0
    for name in ("total_duration", "prompt_eval_duration", "eval_duration"):
        assert isinstance(final[name], int) and final[name] >= 0, name
    assert final["total_duration"] >= final["prompt_eval_duration"] + final["eval_duration"]


def test_chat_without_streaming_is_one_object(gw: Gateway) -> None:
    reply = gw.post("/api/chat", chat_body(stream=False, options={"num_predict": 3}))
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("application/json")
    body = reply.json()
    assert body["message"] == {"role": "assistant", "content": " tok0 tok1 tok2"}
    assert body["done"] is True and body["done_reason"] == "length"
    assert body["eval_count"] == 3
    assert "context" not in body
    request_id = reply.headers["x-request-id"]
    events = gw.events(request_id)
    kinds = [e["kind"] for e in events]
    assert kinds == ["inference.admitted", "inference.completed"]
    assert {e["action"] for e in events} == {"chat.completions"}
    assert {e["route"] for e in events} == {"/api/chat"}
    assert events[0]["sampling"] == {"stream": False, "max_tokens": 3}


def test_options_map_onto_the_engine_sampling(gw: Gateway) -> None:
    options = {
        "temperature": 0.3,
        "top_p": 0.8,
        "top_k": 20,
        "min_p": 0.05,
        "seed": 7,
        "num_predict": 4,
        "stop": ["tok3"],
        "repeat_penalty": 1.2,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.25,
        "num_ctx": 1024,
        # accepted and ignored
        "num_thread": 2,
        "num_gpu": 0,
        "use_mmap": True,
        "num_batch": 64,
        "mirostat": 0,
        "tfs_z": 1.0,
    }
    reply = gw.post("/api/chat", chat_body(stream=False, options=options))
    assert reply.status_code == 200, reply.text
    assert reply.json()["message"]["content"] == " tok0 tok1 tok2 "  # stopped at the stop string
    assert reply.json()["done_reason"] == "stop"
    sent = Recording.last
    assert sent is not None
    s = sent.sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.seed) == (0.3, 0.8, 20, 0.05, 7)
    assert (s.repetition_penalty, s.presence_penalty, s.frequency_penalty) == (1.2, 0.5, 0.25)
    assert sent.max_tokens == 4 and sent.stop == ("tok3",)
    events = gw.events(reply.headers["x-request-id"])
    assert events[0]["sampling"]["repetition_penalty"] == 1.2


def test_no_num_predict_is_up_to_the_policy_cap(gw: Gateway) -> None:
    for value in (None, -1, -2):
        options = {} if value is None else {"num_predict": value}
        reply = gw.post("/api/chat", chat_body(stream=False, options=options))
        assert reply.status_code == 200, reply.text
        sent = Recording.last
        assert sent is not None and sent.max_tokens == 64 and sent.fit_to_context
        assert sent.sampling.seed is None and sent.sampling.temperature == 1.0


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"mirostat": 2}, "options.mirostat"),
        ({"tfs_z": 0.9}, "options.tfs_z"),
        ({"typical_p": 0.5}, "options.typical_p"),
        ({"repeat_last_n": 32, "repeat_penalty": 1.3}, "options.repeat_last_n"),
        ({"num_ctx": 4096}, "options.num_ctx"),
        ({"num_predict": 0}, "options.num_predict"),
        ({"temperature": 5}, "options.temperature"),
        ({"top_p": 0}, "options.top_p"),
        ({"stop": [""]}, "options.stop[0]"),
        ({"no_such_option": 1}, "options"),
    ],
)
def test_options_airgate_cannot_honour_are_a_400(
    gw: Gateway, options: dict[str, Any], param: str
) -> None:
    reply = gw.post("/api/chat", chat_body(options=options))
    assert reply.status_code == 400, reply.text
    body = reply.json()
    assert list(body) == ["error"] and isinstance(body["error"], str)
    assert param.split("[")[0].removeprefix("options.") in body["error"] or param == "options"


def test_repeat_last_n_without_a_penalty_changes_nothing(gw: Gateway) -> None:
    reply = gw.post("/api/chat", chat_body(stream=False, options={"repeat_last_n": 64}))
    assert reply.status_code == 200, reply.text


def test_format_json_and_schema_constrain_the_output(gw: Gateway) -> None:
    answer = '{"name": "Ada", "age": 36}'
    body = {"model": "echo", "messages": [{"role": "user", "content": answer}], "stream": False}
    for fmt, kind in (("json", "json_object"), (SCHEMA, "json_schema")):
        reply = gw.post("/api/chat", {**body, "format": fmt})
        assert reply.status_code == 200, reply.text
        assert json.loads(reply.json()["message"]["content"]) == {"name": "Ada", "age": 36}
        sent = Recording.last
        assert sent is not None and sent.constraint is not None
        assert sent.constraint.param == "format"
        completed = gw.events(reply.headers["x-request-id"])[-1]
        assert completed["response_format"] == kind


@pytest.mark.parametrize(
    "fmt",
    ["yaml", {"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, {"type": 3}],
)
def test_bad_format_is_a_400(gw: Gateway, fmt: Any) -> None:
    reply = gw.post("/api/chat", chat_body(format=fmt))
    assert reply.status_code == 400, reply.text
    assert list(reply.json()) == ["error"]
    assert CANARY not in reply.text


def test_tool_calls_come_back_with_arguments_as_an_object(gw: Gateway) -> None:
    call = '<tool_call>[{"name": "get_weather", "arguments": {"city": "Oslo"}}]'
    body = {"model": "echo", "messages": [{"role": "user", "content": call}], "tools": [WEATHER]}
    reply = gw.post("/api/chat", {**body, "stream": False})
    assert reply.status_code == 200, reply.text
    message = reply.json()["message"]
    assert message["tool_calls"] == [
        {"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    ]
    assert message["content"] == ""
    assert reply.json()["done_reason"] == "stop"
    completed = gw.events(reply.headers["x-request-id"])[-1]
    assert (completed["tools_count"], completed["tool_calls_count"]) == (1, 1)
    lines = gw.lines("/api/chat", body)
    calls = [c for line in lines for c in line["message"].get("tool_calls", ())]
    assert calls == message["tool_calls"]
    assert lines[-1]["done"] is True


def test_a_call_cut_by_num_predict_is_left_out(gw: Gateway) -> None:
    call = '<tool_call>[{"name": "get_weather", "arguments": {"city": "Oslo"}}]'
    body = {
        "model": "echo",
        "messages": [{"role": "user", "content": call}],
        "tools": [WEATHER],
        "options": {"num_predict": 14},  # 4 characters a piece: cut inside the arguments
    }
    reply = gw.post("/api/chat", {**body, "stream": False})
    assert reply.status_code == 200, reply.text
    assert reply.json()["done_reason"] == "length"
    assert "tool_calls" not in reply.json()["message"]
    lines = gw.lines("/api/chat", body)
    assert lines[-1]["done_reason"] == "length"
    assert not [line for line in lines if "tool_calls" in line["message"]]


def test_a_conversation_with_earlier_calls_and_results(gw: Gateway) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}],
        },
        {"role": "tool", "content": "12 C", "tool_name": "get_weather"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    reply = gw.post("/api/chat", {"model": "echo", "messages": messages, "stream": False})
    assert reply.status_code == 200, reply.text
    sent = Recording.last
    assert sent is not None and sent.messages is not None
    assert [m.role for m in sent.messages] == ["system", "user", "assistant", "tool", "user"]
    assert json.loads(sent.messages[2].tool_calls[0].arguments) == {"city": "Oslo"}


@pytest.mark.parametrize(
    ("extra", "status"),
    [
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, 400),
        ({"tools": [WEATHER, WEATHER]}, 400),
        ({"think": True}, 400),
        ({"think": "high"}, 400),
        ({"logprobs": True}, 400),
        ({"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, 400),
        ({"messages": [{"role": "wizard", "content": "x"}]}, 400),
        ({"no_such_field": CANARY}, 400),
        ({"model": f"no-such-{CANARY}"}, 404),
    ],
)
def test_chat_refusals_in_ollamas_shape(gw: Gateway, extra: dict[str, Any], status: int) -> None:
    reply = gw.post("/api/chat", chat_body(**extra))
    assert reply.status_code == status, reply.text
    assert list(reply.json()) == ["error"]
    assert CANARY not in reply.text


def test_think_false_and_keep_alive_are_accepted(gw: Gateway) -> None:
    for extra in ({"think": False}, {"keep_alive": "5m"}, {"keep_alive": -1}, {"keep_alive": 0}):
        reply = gw.post("/api/chat", chat_body(stream=False, **extra))
        assert reply.status_code == 200, (extra, reply.text)


def test_an_empty_chat_loads_the_model(gw: Gateway) -> None:
    reply = gw.post("/api/chat", {"model": "echo", "messages": []})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["done"] is True and body["done_reason"] == "load"
    assert gw.post("/api/chat", {"model": "nope"}).status_code == 404
    assert gw.post("/api/chat", {"model": "embedder"}).status_code == 400


# ---- generate ------------------------------------------------------------------------------


def test_generate_streams_and_not(gw: Gateway) -> None:
    body = {"model": "echo", "prompt": f"Once {CANARY}", "options": {"num_predict": 4}}
    *pieces, final = gw.lines("/api/generate", body)
    assert "".join(p["response"] for p in pieces) == " tok0 tok1 tok2 tok3"
    assert final["done"] is True and final["response"] == "" and final["eval_count"] == 4
    assert "context" not in final
    reply = gw.post("/api/generate", {**body, "stream": False, "system": "Be kind."})
    assert reply.status_code == 200, reply.text
    assert reply.json()["response"] == " tok0 tok1 tok2 tok3"
    sent = Recording.last
    assert sent is not None and sent.messages is not None
    assert [m.role for m in sent.messages] == ["system", "user"]
    events = gw.events(reply.headers["x-request-id"])
    assert {e["action"] for e in events} == {"completions"}


def test_generate_raw_sends_the_prompt_as_it_is(gw: Gateway) -> None:
    reply = gw.post(
        "/api/generate", {"model": "echo", "prompt": "abc", "raw": True, "stream": False}
    )
    assert reply.status_code == 200, reply.text
    sent = Recording.last
    assert sent is not None and sent.prompt == "abc" and sent.messages is None


def test_generate_with_a_schema(gw: Gateway) -> None:
    body = {"model": "echo", "prompt": '{"name": "Ada", "age": 36}', "format": SCHEMA}
    reply = gw.post("/api/generate", {**body, "stream": False})
    assert reply.status_code == 200, reply.text
    assert json.loads(reply.json()["response"]) == {"name": "Ada", "age": 36}


def test_an_empty_generate_loads_the_model(gw: Gateway) -> None:
    reply = gw.post("/api/generate", {"model": "echo"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["done_reason"] == "load" and reply.json()["response"] == ""


@pytest.mark.parametrize(
    "extra",
    [
        {"context": [1, 2, 3]},
        {"suffix": "end"},
        {"template": "{{ .Prompt }}"},
        {"images": ["aGk="]},
        {"think": True},
        {"format": "xml"},
    ],
)
def test_generate_refusals(gw: Gateway, extra: dict[str, Any]) -> None:
    reply = gw.post("/api/generate", {"model": "echo", "prompt": CANARY, **extra})
    assert reply.status_code == 400, reply.text
    assert list(reply.json()) == ["error"] and CANARY not in reply.text
    assert next(iter(extra)) in reply.json()["error"]


# ---- embeddings ----------------------------------------------------------------------------


def test_embed_one_and_many(gw: Gateway) -> None:
    reply = gw.post("/api/embed", {"model": "embedder", "input": ["alpha", "beta"]})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["model"] == "embedder" and len(body["embeddings"]) == 2
    assert len(body["embeddings"][0]) == 32
    assert body["prompt_eval_count"] > 0 and body["load_duration"] == 0
    assert isinstance(body["total_duration"], int)
    one = gw.post("/api/embed", {"model": "embedder", "input": "alpha", "truncate": False})
    assert one.json()["embeddings"][0] == body["embeddings"][0]
    short = gw.post("/api/embed", {"model": "embedder", "input": "alpha", "dimensions": 8})
    assert len(short.json()["embeddings"][0]) == 8
    events = gw.events(reply.headers["x-request-id"])
    assert [e["kind"] for e in events] == ["inference.admitted", "embedding.completed"]
    assert {e["action"] for e in events} == {"embeddings"}


def test_legacy_embeddings(gw: Gateway) -> None:
    reply = gw.post("/api/embeddings", {"model": "embedder", "prompt": "alpha"})
    assert reply.status_code == 200, reply.text
    vector = reply.json()["embedding"]
    new = gw.post("/api/embed", {"model": "embedder", "input": "alpha"}).json()
    assert vector == new["embeddings"][0]


def test_embed_refusals(gw: Gateway) -> None:
    cases: list[tuple[dict[str, Any], int]] = [
        ({"model": "embedder", "input": ["ok", ""]}, 400),
        ({"model": "embedder", "input": CANARY * 100}, 400),  # over the context
        ({"model": "embedder", "input": "x", "dimensions": 33}, 400),
        ({"model": "echo", "input": "x"}, 400),
        ({"model": f"x{CANARY}", "input": "x"}, 404),
    ]
    for body, status in cases:
        reply = gw.post("/api/embed", body)
        assert reply.status_code == status, (body, reply.text)
        assert list(reply.json()) == ["error"] and CANARY not in reply.text
    empty = gw.post("/api/embed", {"model": "embedder", "input": []})
    assert empty.status_code == 200 and empty.json()["embeddings"] == []


# ---- models --------------------------------------------------------------------------------


def test_tags_ps_show_version(gw: Gateway) -> None:
    tags = gw.client.get("/api/tags", headers=gw.headers()).json()["models"]
    assert [m["name"] for m in tags] == ["echo", "echo:latest", "embedder"]
    assert all(m["model"] == m["name"] and m["modified_at"].endswith("Z") for m in tags)
    assert "size" not in tags[0] and "digest" not in tags[0]  # unknown: not invented
    ps = gw.client.get("/api/ps", headers=gw.headers()).json()["models"]
    assert [(m["name"], m["context_length"]) for m in ps] == [("echo", 2048), ("embedder", 64)]
    show = gw.post("/api/show", {"model": "echo:latest"}).json()
    assert show["capabilities"] == ["completion", "tools"]
    assert show["model_info"]["airgate.context_length"] == 2048
    embedder = gw.post("/api/show", {"model": "embedder"}).json()
    assert embedder["capabilities"] == ["embedding"]
    assert embedder["model_info"]["airgate.embedding_length"] == 32
    assert gw.post("/api/show", {"model": "nope"}).status_code == 404
    assert gw.post("/api/show", {}).status_code == 400
    version = gw.client.get("/api/version", headers=gw.headers()).json()
    assert isinstance(version["version"], str)


def test_a_policy_hides_models_and_denies_actions(gw: Gateway) -> None:
    reply = gw.post("/api/chat", chat_body(stream=False), who="embed-only")
    assert reply.status_code == 403, reply.text
    assert list(reply.json()) == ["error"]
    reply = gw.post("/api/embed", {"model": "embedder", "input": "x"}, who="embed-only")
    assert reply.status_code == 200, reply.text


# ---- refusals, auth, errors ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/api/pull"),
        ("POST", "/api/push"),
        ("POST", "/api/create"),
        ("POST", "/api/copy"),
        ("DELETE", "/api/delete"),
        ("POST", "/api/blobs/sha256:abc"),
        ("HEAD", "/api/blobs/sha256:abc"),
    ],
)
def test_model_management_is_refused(gw: Gateway, method: str, path: str) -> None:
    reply = gw.client.request(method, path, headers=gw.headers(), json={"model": "x"})
    assert reply.status_code == 403, reply.text
    if method != "HEAD":
        assert reply.json() == {
            "error": "models enter airgate only as signed bundles: use `airgate bundle import FILE`"
        }
    # the attempt is audited, as an admin action refused to the caller
    (event,) = gw.events(reply.headers["x-request-id"])
    verb = {"/api/delete": "delete", "/api/blobs/sha256:abc": "blob_"}.get(path, path[5:])
    assert event["kind"] == "admin.action" and event["outcome"] == "denied"
    assert event["action"].startswith(f"models.{verb}") and event["http_status"] == 403
    assert event["principal"]["key_id"] and event["error_class"] == "permission_denied"
    anonymous = gw.client.request(method, path)
    assert anonymous.status_code == 401


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/api/chat"),
        ("POST", "/api/generate"),
        ("POST", "/api/embed"),
        ("GET", "/api/tags"),
        ("GET", "/api/version"),
    ],
)
def test_no_key_is_a_401_in_ollamas_shape(gw: Gateway, method: str, path: str) -> None:
    reply = gw.client.request(method, path, json=chat_body())
    assert reply.status_code == 401
    assert list(reply.json()) == ["error"]
    bad = gw.client.request(method, path, headers={"authorization": f"Bearer {CANARY}"})
    assert bad.status_code == 401 and CANARY not in bad.text


def test_unrouted_and_malformed_in_ollamas_shape(gw: Gateway) -> None:
    assert list(gw.client.get("/api/nothing", headers=gw.headers()).json()) == ["error"]
    reply = gw.client.post("/api/chat", content=b"{not json", headers=gw.headers())
    assert reply.status_code == 400 and list(reply.json()) == ["error"]
    # OpenAI's routes keep OpenAI's envelope
    reply = gw.client.post("/v1/chat/completions", content=b"{", headers=gw.headers())
    assert reply.status_code == 400 and set(reply.json()["error"]) >= {"message", "type"}


def test_no_canary_in_the_audit_log(gw: Gateway) -> None:
    gw.post("/api/chat", chat_body(stream=False, tools=[WEATHER], format=SCHEMA))
    gw.lines("/api/generate", {"model": "echo", "prompt": CANARY, "system": CANARY})
    assert CANARY not in gw.dump()


# ---- the official client -------------------------------------------------------------------


def test_the_ollama_client(gw: Gateway) -> None:
    client = gw.ollama()
    assert [m.model for m in client.list().models][:2] == ["echo", "echo:latest"]
    assert client.show("echo").capabilities == ["completion", "tools"]
    assert [m.model for m in client.ps().models] == ["echo", "embedder"]
    reply = client.chat("echo", [{"role": "user", "content": "hi"}], options={"num_predict": 2})
    assert reply.message.content == " tok0 tok1" and reply.done_reason == "length"
    pieces = list(
        client.chat(
            "echo", [{"role": "user", "content": "hi"}], stream=True, options={"num_predict": 2}
        )
    )
    assert "".join(p.message.content or "" for p in pieces) == " tok0 tok1"
    assert pieces[-1].done and pieces[-1].eval_count == 2
    generated = client.generate("echo", "hi", options={"num_predict": 3})
    assert generated.response == " tok0 tok1 tok2"
    assert len(client.embed("embedder", ["a", "b"]).embeddings) == 2
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat("nope", [{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 404
    assert caught.value.error == "the model does not exist or you do not have access to it"
    with pytest.raises(ollama.ResponseError) as refused:
        client.pull("echo")
    assert refused.value.status_code == 403
