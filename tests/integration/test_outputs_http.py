"""Structured outputs and tool calls on the HTTP path, through the client libraries apps use.

The echo engine answers a constrained request with its last user message, so each test writes
the answer a constrained model would give and checks what the gateway makes of it: the shapes
the `openai` SDK (its `parse` and stream helpers) and LangChain decode, the audit counts, the
policy switches, and the refusals of bad schemas and tools (a 400 naming the field, nothing
audited).  Whether the engines really enforce the constraints is tested on llama.cpp and vLLM
(tests/integration/test_llamacpp_outputs.py, tests/e2e/test_outputs_e2e.py).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, Literal

import openai
import pytest
from langchain_openai import ChatOpenAI
from litestar import Litestar
from litestar.testing import TestClient
from pydantic import BaseModel

from backends.echo import EchoEngine
from gateway.app import create_app
from gateway.config import load_settings
from gateway.engines.registry import ModelRegistry, ServedModel

CANARY = "CANARY-91c2e7-tools"
POLICY = """
name = "outputs"

[[rules]]
name = "plain"
teams = ["plain"]
roles = ["app"]
models = ["*"]
tools = false
structured_outputs = false

[[rules]]
name = "apps"
roles = ["app", "admin"]
models = ["*"]
max_tokens = 4096
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

    def post(self, body: dict[str, Any], who: str = "app") -> Any:
        headers = {"authorization": f"Bearer {self.keys[who]}"}
        return self.client.post("/v1/chat/completions", json=body, headers=headers)

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
    root = tmp_path_factory.mktemp("outputs-http")
    policy = root / "policy" / "10-outputs.toml"
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
    registry = ModelRegistry([ServedModel("echo", EchoEngine(context_length=2048))])
    app = create_app(settings, registry=registry)
    with TestClient(app) as client:
        while client.get("/ready").status_code != 200:  # engines start in the background
            pass
        security = app.state["security_holder"].get()
        keys = {
            who: client.blocking_portal.call(partial(security.keys.create, "app", team=team))[0]
            for who, team in (("app", None), ("plain", "plain"))
        }
        yield Gateway(client, root / "data", keys)


class Person(BaseModel):
    name: str
    age: int
    role: Literal["admin", "user"]


class GetWeather(BaseModel):
    """Get the current weather in a city."""

    city: str
    units: Literal["c", "f"] = "c"


WEATHER_TOOL = openai.pydantic_function_tool(GetWeather)
ADA = '{"name": "Ada", "age": 36, "role": "admin"}'


def call_text(*calls: tuple[str, dict[str, Any]], trigger: bool = True) -> str:
    array = json.dumps([{"name": name, "arguments": args} for name, args in calls])
    return ("<tool_call>" if trigger else "") + array


# ---- structured outputs ------------------------------------------------------------------------


def test_parse_with_a_pydantic_model_and_no_max_tokens(gw: Gateway) -> None:
    reply = gw.sdk().chat.completions.parse(
        model="echo", messages=[{"role": "user", "content": ADA}], response_format=Person
    )
    choice = reply.choices[0]
    assert choice.message.parsed == Person(name="Ada", age=36, role="admin")
    assert choice.finish_reason == "stop" and choice.message.refusal is None
    [completed] = [
        e
        for e in gw.events(reply.id.removeprefix("chatcmpl-"))
        if e["kind"] == "inference.completed"
    ]
    assert completed["response_format"] == "json_schema"
    assert "tools_count" not in completed


def test_json_object_mode(gw: Gateway) -> None:
    reply = gw.sdk().chat.completions.create(
        model="echo",
        messages=[{"role": "user", "content": '{"ok": true}'}],
        response_format={"type": "json_object"},
    )
    assert json.loads(reply.choices[0].message.content or "") == {"ok": True}


# ---- tool calls --------------------------------------------------------------------------------


def test_a_tool_call_comes_back_in_openai_shape(gw: Gateway) -> None:
    answer = "Checking. " + call_text(("GetWeather", {"city": "Oslo", "units": "c"}))
    reply = gw.sdk().chat.completions.create(
        model="echo", messages=[{"role": "user", "content": answer}], tools=[WEATHER_TOOL]
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Checking. "
    [call] = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "GetWeather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"city": "Oslo", "units": "c"}  # type: ignore[union-attr]
    events = gw.events(reply.id.removeprefix("chatcmpl-"))
    completed = next(e for e in events if e["kind"] == "inference.completed")
    assert (completed["tools_count"], completed["tool_calls_count"]) == (1, 1)
    assert completed["finish_reason"] == "tool_calls"
    assert all("GetWeather" not in json.dumps(e) and "Oslo" not in json.dumps(e) for e in events)


def test_parallel_calls_stream_through_the_sdk_stream_helper(gw: Gateway) -> None:
    answer = call_text(("GetWeather", {"city": "Oslo"}), ("GetWeather", {"city": "Lima"}))
    with gw.sdk().chat.completions.stream(
        model="echo", messages=[{"role": "user", "content": answer}], tools=[WEATHER_TOOL]
    ) as stream:
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls or []
    assert [c.function.parsed_arguments for c in calls] == [  # type: ignore[union-attr]
        GetWeather(city="Oslo"),
        GetWeather(city="Lima"),
    ]
    assert len({c.id for c in calls}) == 2
    assert final.choices[0].finish_reason == "tool_calls"


def test_streamed_tool_call_deltas_are_shaped_as_openai_streams_them(gw: Gateway) -> None:
    answer = call_text(("GetWeather", {"city": "Reykjavik"}))
    body = {
        "model": "echo",
        "messages": [{"role": "user", "content": answer}],
        "tools": [WEATHER_TOOL],
        "stream": True,
    }
    chunks = [
        json.loads(line[6:])
        for line in gw.post(body).text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    pieces = [d for c in chunks for d in c["choices"][0]["delta"].get("tool_calls", ())]
    first, rest = pieces[0], pieces[1:]
    assert first["index"] == 0 and first["type"] == "function" and first["id"].startswith("call_")
    assert first["function"] == {"name": "GetWeather", "arguments": ""}
    assert rest and all(set(p) == {"index", "function"} for p in rest)
    assert all(set(p["function"]) == {"arguments"} for p in rest)
    assert json.loads("".join(p["function"]["arguments"] for p in rest)) == {"city": "Reykjavik"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert not any(c["choices"][0]["delta"].get("content") for c in chunks)


def test_a_named_or_required_choice_answers_with_the_bare_call(gw: Gateway) -> None:
    for choice in ("required", {"type": "function", "function": {"name": "GetWeather"}}):
        answer = call_text(("GetWeather", {"city": "Oslo"}), trigger=False)
        reply = gw.sdk().chat.completions.create(
            model="echo",
            messages=[{"role": "user", "content": answer}],
            tools=[WEATHER_TOOL],
            tool_choice=choice,  # type: ignore[arg-type]
            parallel_tool_calls=False,
        )
        [call] = reply.choices[0].message.tool_calls or []
        assert call.function.name == "GetWeather"  # type: ignore[union-attr]
        assert reply.choices[0].message.content is None


def test_a_conversation_with_calls_and_results_is_accepted(gw: Gateway) -> None:
    reply = gw.sdk().chat.completions.create(
        model="echo",
        messages=[
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "GetWeather", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "12 C, clear"},
            {"role": "user", "content": "It is 12 C and clear."},
        ],
        tools=[WEATHER_TOOL],
        tool_choice="auto",
    )
    assert reply.choices[0].message.content == "It is 12 C and clear."
    assert reply.choices[0].finish_reason == "stop"


def test_tools_beside_a_response_format_answer_with_either(gw: Gateway) -> None:
    """As pydantic-ai's native output sends them: the model calls a tool (a JSON array) or
    answers with the response's object."""
    for answer, calls in (
        (ADA, 0),
        (call_text(("GetWeather", {"city": "Oslo"}), trigger=False), 1),
    ):
        reply = gw.sdk().chat.completions.parse(
            model="echo",
            messages=[{"role": "user", "content": answer}],
            tools=[WEATHER_TOOL],
            response_format=Person,
        )
        message = reply.choices[0].message
        assert len(message.tool_calls or []) == calls
        if calls:
            assert reply.choices[0].finish_reason == "tool_calls" and message.content is None
        else:
            assert message.parsed == Person(name="Ada", age=36, role="admin")


# ---- LangChain, unchanged ------------------------------------------------------------------


def langchain(gw: Gateway) -> ChatOpenAI:
    return ChatOpenAI(
        model="echo",
        base_url=str(gw.client.base_url) + "/v1",
        api_key=gw.keys["app"],  # type: ignore[arg-type]
        http_client=gw.client,
        max_retries=0,
    )


def test_langchain_bind_tools(gw: Gateway) -> None:
    answer = call_text(("GetWeather", {"city": "Oslo", "units": "f"}))
    message = langchain(gw).bind_tools([GetWeather]).invoke(answer)
    assert message.tool_calls[0]["name"] == "GetWeather"  # type: ignore[attr-defined]
    assert message.tool_calls[0]["args"] == {"city": "Oslo", "units": "f"}  # type: ignore[attr-defined]


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_langchain_with_structured_output(gw: Gateway, method: str) -> None:
    answer = ADA
    if method == "function_calling":  # a named tool_choice: the bare call array
        answer = call_text(("Person", json.loads(ADA)), trigger=False)
    model = langchain(gw).with_structured_output(Person, method=method)  # type: ignore[arg-type]
    assert model.invoke(answer) == Person(name="Ada", age=36, role="admin")


# ---- policy ------------------------------------------------------------------------------------


def test_the_policy_can_deny_tools_and_structured_outputs(gw: Gateway) -> None:
    sdk = gw.sdk("plain")
    with pytest.raises(openai.PermissionDeniedError) as denied:
        sdk.chat.completions.create(
            model="echo", messages=[{"role": "user", "content": "x"}], tools=[WEATHER_TOOL]
        )
    assert denied.value.code == "tools_not_allowed"
    with pytest.raises(openai.PermissionDeniedError) as denied:
        sdk.chat.completions.parse(
            model="echo", messages=[{"role": "user", "content": ADA}], response_format=Person
        )
    assert denied.value.code == "structured_outputs_not_allowed"
    plain = sdk.chat.completions.create(
        model="echo", messages=[{"role": "user", "content": "x"}], max_tokens=2
    )
    assert plain.choices[0].message.content


# ---- bad input: a 400 naming the field; nothing generated, nothing stored ------------------


def tool(parameters: Any, name: str = "f", kind: str = "function") -> dict[str, Any]:
    return {"type": kind, "function": {"name": name, "parameters": parameters}}


def schema_format(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}


RECURSIVE = {
    "$ref": "#/$defs/node",
    "$defs": {
        "node": {
            "type": "object",
            "properties": {CANARY: {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        }
    },
}
MEGABYTE = {
    "type": "object",
    "properties": {f"{CANARY}{i}": {"type": "string"} for i in range(40_000)},
}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {"response_format": schema_format({"type": CANARY})},
            "response_format.json_schema.schema",
        ),
        ({"response_format": schema_format([CANARY])}, "response_format.json_schema.schema"),
        ({"response_format": schema_format(RECURSIVE)}, "response_format.json_schema.schema"),
        ({"response_format": schema_format(MEGABYTE)}, "response_format.json_schema.schema"),
        (
            {"response_format": schema_format({"properties": {CANARY: {"minimum": 1}}})},
            "response_format.json_schema.schema",
        ),
        ({"tools": [tool({}, kind="code_interpreter")]}, "tools[0].type"),
        ({"tools": [tool({"type": CANARY})]}, "tools[0].function.parameters"),
        ({"tools": [tool(RECURSIVE)]}, "tools[0].function.parameters"),
        ({"tools": [tool({}), tool({})]}, "tools[1].function.name"),
        (
            {"tools": [tool({})], "tool_choice": {"type": "function", "function": {"name": "g"}}},
            "tool_choice.function.name",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"tools": [tool({})], "response_format": schema_format({"type": "array"})},
            "response_format",
        ),
    ],
)
def test_bad_schemas_and_tools_are_refused_naming_the_field(
    gw: Gateway, fields: dict[str, Any], param: str
) -> None:
    body = {"model": "echo", "messages": [{"role": "user", "content": CANARY}], **fields}
    resp = gw.post(body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param
    assert CANARY not in resp.text
    assert gw.events(resp.headers["x-request-id"]) == []  # nothing admitted, nothing stored
    assert CANARY not in gw.dump()


def test_keywords_that_cannot_be_enforced_are_named(gw: Gateway) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3}}}
    resp = gw.post(
        {
            "model": "echo",
            "messages": [{"role": "user", "content": "x"}],
            "response_format": schema_format(schema),
        }
    )
    assert resp.status_code == 400 and "'minimum'" in resp.json()["error"]["message"]


def test_harmless_fields_are_accepted_and_store_true_is_not(gw: Gateway) -> None:
    harmless = {
        "model": "echo",
        "messages": [{"role": "user", "content": "x", "name": "bob"}],
        "max_tokens": 2,
        "n": None,
        "stream": None,
        "logprobs": None,
        "tools": [],
        "store": False,
        "metadata": {"app": "billing"},
        "service_tier": "auto",
    }
    assert gw.post(harmless).status_code == 200
    resp = gw.post({**harmless, "store": True})
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "unsupported_parameter"
    assert resp.json()["error"]["param"] == "store"
