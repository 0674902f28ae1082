"""Embeddings and `n > 1` on the HTTP path, through the client libraries apps use.

The echo engine stands in for the model (stand-in vectors, `c<j>`-marked choices): these tests
check what the gateway does with them: the wire shapes the `openai` SDK and LangChain decode
(float and base64 vectors, choices by index, usage), the refusals of bad input (a 400 naming
the field, nothing computed), the policy's per-action model lists and `max_n`, the audit
counts.  Whether real models embed well is tested on llama.cpp and vLLM (test_llamacpp_
embeddings.py, test_vllm_embeddings.py) and end to end (tests/e2e/test_embeddings_e2e.py).
"""

from __future__ import annotations

import base64
import contextlib
import json
import sqlite3
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from langchain_openai import OpenAIEmbeddings
from litestar import Litestar
from litestar.testing import TestClient

from backends.echo import EchoEngine
from gateway.app import create_app
from gateway.config import load_settings
from gateway.engines.registry import ModelRegistry, ServedModel

CANARY = "CANARY-5d0e1a-embed"
POLICY = """
name = "embeddings"

[[rules]]
name = "chat-only"
teams = ["chat-only"]
roles = ["app"]
models = ["*"]
actions = ["chat.completions", "completions"]

[[rules]]
name = "narrow"
teams = ["narrow"]
roles = ["app"]
models = ["echo"]
max_n = 2
action_models = { embeddings = ["other-embedder"] }

[[rules]]
name = "apps"
roles = ["app", "admin"]
models = ["*"]
max_tokens = 64
max_n = 8
tokens_per_minute = 100000
"""


class Gateway:
    def __init__(self, client: TestClient[Litestar], data_dir: Path, keys: dict[str, str]):
        self.client = client
        self.data_dir = data_dir
        self.keys = keys

    def sdk(self, who: str = "app") -> openai.OpenAI:
        return openai.OpenAI(
            base_url=str(self.client.base_url) + "/v1",
            api_key=self.keys[who],
            http_client=self.client,
            max_retries=0,
        )

    def post(self, path: str, body: dict[str, Any], who: str = "app") -> Any:
        headers = {"authorization": f"Bearer {self.keys[who]}"}
        return self.client.post(path, json=body, headers=headers)

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
    root = tmp_path_factory.mktemp("embeddings-http")
    policy = root / "policy" / "10-embeddings.toml"
    policy.parent.mkdir()
    policy.write_text(POLICY)
    settings = load_settings(
        None,
        environ={},
        overrides={
            "data_dir": str(root / "data"),
            "policy.path": str(policy),
            "server.max_request_bytes": 4 * 1024 * 1024,
        },
    )
    registry = ModelRegistry(
        [
            ServedModel("echo", EchoEngine(context_length=2048)),
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
            for who, team in (("app", None), ("chat-only", "chat-only"), ("narrow", "narrow"))
        }
        yield Gateway(client, root / "data", keys)


# ---- embeddings ----------------------------------------------------------------------------


def test_the_sdk_default_and_float_give_the_same_unit_vectors(gw: Gateway) -> None:
    texts = ["the first text", "a second, longer text than the first", CANARY]
    sdk = gw.sdk()
    default = sdk.embeddings.create(model="embedder", input=texts)  # the SDK asks for base64
    floats = sdk.embeddings.create(model="embedder", input=texts, encoding_format="float")
    assert [d.index for d in default.data] == [0, 1, 2]
    a = np.array([d.embedding for d in default.data])
    b = np.array([d.embedding for d in floats.data])
    assert a.shape == (3, 32)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-7)
    np.testing.assert_allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-6)
    assert not np.allclose(b[0], b[1])  # different inputs, different vectors
    assert floats.model == "embedder"
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > 3


def test_base64_is_float32_little_endian(gw: Gateway) -> None:
    reply = gw.post(
        "/v1/embeddings", {"model": "embedder", "input": "x", "encoding_format": "base64"}
    )
    assert reply.status_code == 200, reply.text
    raw = base64.b64decode(reply.json()["data"][0]["embedding"])
    vector = np.frombuffer(raw, dtype="<f4")
    floats = gw.post("/v1/embeddings", {"model": "embedder", "input": "x"}).json()
    np.testing.assert_array_equal(vector, np.array(floats["data"][0]["embedding"], dtype="<f4"))


def test_token_id_inputs(gw: Gateway) -> None:
    one = gw.post("/v1/embeddings", {"model": "embedder", "input": [1, 2, 3]}).json()
    many = gw.post("/v1/embeddings", {"model": "embedder", "input": [[1, 2, 3], [4, 5]]}).json()
    assert len(one["data"]) == 1 and len(many["data"]) == 2
    assert one["data"][0]["embedding"] == many["data"][0]["embedding"]
    assert many["usage"]["prompt_tokens"] == 5  # token ids count as themselves


def test_langchain_embeddings(gw: Gateway) -> None:
    lc = OpenAIEmbeddings(
        model="embedder",
        base_url=str(gw.client.base_url) + "/v1",
        api_key=gw.keys["app"],  # type: ignore[arg-type]
        http_client=gw.client,
        check_embedding_ctx_length=False,
        tiktoken_enabled=False,
        max_retries=0,
    )
    docs = lc.embed_documents(["alpha", "beta"])
    query = lc.embed_query("alpha")
    assert len(docs) == 2 and len(docs[0]) == 32
    np.testing.assert_allclose(docs[0], query, atol=1e-7)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": []}, "input"),
        ({"input": ["x"] * 10_000}, "input"),
        ({"input": ""}, "input"),
        ({"input": ["ok", ""]}, "input[1]"),
        ({"input": [[1, 2], []]}, "input[1]"),
        ({"input": ["ok", 3]}, "input[1]"),
        ({"input": [[1, -2]]}, "input[0]"),
        ({"input": [[5, 99_999_999]]}, "input"),  # outside the vocabulary (the engine checks)
        ({"input": "x", "dimensions": 0}, "dimensions"),
        ({"input": "x", "dimensions": 33}, "dimensions"),  # longer than the model's vectors
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x", "truncate": True}, "truncate"),
        ({"input": CANARY * 100}, "input[0]"),  # over the context (64 tokens)
        ({"input": ["ok", CANARY * 100]}, "input[1]"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(gw: Gateway, body: dict[str, Any], param: str) -> None:
    reply = gw.post("/v1/embeddings", {"model": "embedder", **body})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param
    assert CANARY not in reply.text
    if param.startswith("input[") and "CANARY" in json.dumps(body):
        assert "maximum context length is 64 tokens" in error["message"]
        assert error["code"] == "context_length_exceeded"


def test_shorter_vectors_where_the_model_allows(gw: Gateway) -> None:
    reply = gw.sdk().embeddings.create(
        model="embedder", input="x", dimensions=8, encoding_format="float"
    )
    vector = np.array(reply.data[0].embedding)
    assert vector.shape == (8,)
    assert abs(np.linalg.norm(vector) - 1.0) < 1e-6


def test_the_audit_holds_counts_only(gw: Gateway) -> None:
    reply = gw.post(
        "/v1/embeddings",
        {"model": "embedder", "input": [CANARY, CANARY + " two"], "dimensions": 16},
    )
    assert reply.status_code == 200
    rid = reply.headers["x-request-id"]
    kinds = [e["kind"] for e in gw.events(rid)]
    assert kinds == ["inference.admitted", "embedding.completed"]
    done = gw.events(rid)[-1]
    assert done["action"] == "embeddings"
    assert done["inputs_count"] == 2
    assert done["prompt_tokens"] == reply.json()["usage"]["prompt_tokens"]
    assert done["sampling"] == {"dimensions": 16}
    assert CANARY not in gw.dump()


def test_models_do_what_they_are_for(gw: Gateway) -> None:
    chat = gw.post(
        "/v1/chat/completions",
        {"model": "embedder", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "model"
    embed = gw.post("/v1/embeddings", {"model": "echo", "input": "hi"})
    assert embed.status_code == 400 and embed.json()["error"]["param"] == "model"


def test_policies_allow_models_per_action(gw: Gateway) -> None:
    refused = gw.post("/v1/embeddings", {"model": "embedder", "input": "hi"}, who="chat-only")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "action_not_allowed"
    chat = gw.post(
        "/v1/chat/completions",
        {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        who="chat-only",
    )
    assert chat.status_code == 200
    # `narrow` may chat with echo, and embed only with the models its action_models name
    narrow = gw.post("/v1/embeddings", {"model": "embedder", "input": "hi"}, who="narrow")
    assert narrow.status_code == 403
    assert narrow.json()["error"]["code"] == "model_not_allowed"


# ---- n > 1 -------------------------------------------------------------------------------------


def test_chat_choices_through_the_sdk(gw: Gateway) -> None:
    reply = gw.sdk().chat.completions.create(
        model="echo", messages=[{"role": "user", "content": "hi"}], n=3, max_tokens=4
    )
    assert [c.index for c in reply.choices] == [0, 1, 2]
    texts = [c.message.content for c in reply.choices]
    assert texts[0] == " tok0 tok1 tok2 tok3"
    assert texts[1] == " c1tok0 c1tok1 c1tok2 c1tok3"
    assert all(c.finish_reason == "length" for c in reply.choices)
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 12
    single = gw.sdk().chat.completions.create(
        model="echo", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert single.usage is not None
    assert reply.usage.prompt_tokens == single.usage.prompt_tokens  # the prompt counts once


def test_streamed_choices_keep_their_index(gw: Gateway) -> None:
    stream = gw.sdk().chat.completions.create(
        model="echo",
        messages=[{"role": "user", "content": "hi"}],
        n=2,
        max_tokens=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts = ["", ""]
    roles: list[int] = []
    finished: list[int] = []
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.role:
                roles.append(choice.index)
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished.append(choice.index)
    assert sorted(roles) == [0, 1] and sorted(finished) == [0, 1]
    assert texts == [" tok0 tok1 tok2", " c1tok0 c1tok1 c1tok2"]
    assert usage is not None and usage.completion_tokens == 6


def test_completions_choices_per_prompt(gw: Gateway) -> None:
    reply = gw.sdk().completions.create(model="echo", prompt=["a", "b"], n=2, max_tokens=2)
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    assert [c.text for c in reply.choices] == [" tok0 tok1", " c1tok0 c1tok1"] * 2
    assert reply.usage is not None and reply.usage.completion_tokens == 8


def test_n_beyond_the_policy_cap_is_a_400(gw: Gateway) -> None:
    body = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "n": 3}
    reply = gw.post("/v1/chat/completions", body, who="narrow")
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "n"
    echo = gw.post("/v1/completions", {"model": "echo", "prompt": "x", "n": 2, "echo": True})
    assert echo.status_code == 400 and echo.json()["error"]["param"] == "echo"


def test_the_limiter_reserves_every_choice(gw: Gateway) -> None:
    body = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}
    one = gw.post("/v1/chat/completions", body)
    eight = gw.post("/v1/chat/completions", {**body, "n": 8})
    assert one.status_code == eight.status_code == 200
    left_one = int(one.headers["x-ratelimit-remaining-tokens"])
    left_eight = int(eight.headers["x-ratelimit-remaining-tokens"])
    # the reservation when admitted: 8 x 50 tokens against 1 x 50 (and the prompt's bytes)
    assert left_one - left_eight >= 7 * 50 - 50
