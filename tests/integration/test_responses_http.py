"""POST /v1/responses (stateless) on the echo engine, through the clients apps use, unchanged:
the `openai` SDK (`responses.create` streamed and not, the `responses.stream` and `parse`
helpers, a function tool round trip) and LangChain's `ChatOpenAI(use_responses_api=True)`.

Every answer is also validated against the SDK's own pydantic models (its required fields), and
every streamed event against `ResponseStreamEvent`, in order, numbered from 0.  The echo engine
answers a constrained request with its last user message (see test_outputs_http.py); its prompt
token count grows with the prompt's text, which shows that instructions and tool results reach
the engine.  What airgate cannot do statelessly is refused with a 400 naming the field; the
routes that would read a stored response answer 404.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path
from typing import Any, Literal

import openai
import pydantic
import pytest
from langchain_core.messages import AIMessageChunk, HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI
from litestar import Litestar
from litestar.testing import TestClient
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel

from backends.echo import EchoEngine
from backends.errors import EngineFailure
from backends.types import GenerationDelta, GenerationRequest
from gateway.app import create_app
from gateway.config import load_settings
from gateway.engines.registry import ModelRegistry, ServedModel

CANARY = "CANARY-5b17d3-responses"
EVENTS = pydantic.TypeAdapter(ResponseStreamEvent)


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


class Gateway:
    def __init__(self, client: TestClient[Litestar], data_dir: Path, key: str):
        self.client = client
        self.data_dir = data_dir
        self.key = key
        self.auth = {"authorization": f"Bearer {key}"}

    def sdk(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=str(self.client.base_url) + "/v1",
            api_key=self.key,
            http_client=self.client,
            max_retries=0,
        )

    def post(self, body: dict[str, Any]) -> Any:
        return self.client.post("/v1/responses", json=body, headers=self.auth)

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
    root = tmp_path_factory.mktemp("responses-http")
    settings = load_settings(None, environ={}, overrides={"data_dir": str(root / "data")})
    registry = ModelRegistry(
        [
            ServedModel("echo", EchoEngine(context_length=2048)),
            ServedModel("broken", FailingEngine()),
        ]
    )
    app = create_app(settings, registry=registry)
    with TestClient(app) as client:
        while client.get("/ready").status_code != 200:  # engines start in the background
            pass
        security = app.state["security_holder"].get()
        key = client.blocking_portal.call(partial(security.keys.create, "app"))[0]
        yield Gateway(client, root / "data", key)


def sse_events(text: str) -> list[dict[str, Any]]:
    """The events of an SSE body, each checked against its `event:` line."""
    out = []
    for block in text.strip().split("\n\n"):
        lines = block.split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        event = json.loads(lines[1].removeprefix("data: "))
        assert event["type"] == lines[0].removeprefix("event: ")
        EVENTS.validate_python(event)  # the SDK's model of this event: its required fields
        out.append(event)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out


class Person(BaseModel):
    name: str
    age: int
    role: Literal["admin", "user"]


class GetWeather(BaseModel):
    """Get the current weather in a city."""

    city: str
    units: Literal["c", "f"] = "c"


ADA = '{"name": "Ada", "age": 36, "role": "admin"}'
WEATHER = {
    "type": "function",
    "name": "GetWeather",
    "description": "Get the current weather in a city.",
    "parameters": GetWeather.model_json_schema(),
    "strict": False,
}


def bare_calls(*calls: tuple[str, dict[str, Any]]) -> str:
    return json.dumps([{"name": name, "arguments": args} for name, args in calls])


# ---- text ------------------------------------------------------------------------------------


def test_create_answers_a_stateless_response(gw: Gateway) -> None:
    reply = gw.sdk().responses.create(model="echo", input="Hello", max_output_tokens=4)
    assert reply.output_text == " tok0 tok1 tok2 tok3"
    assert reply.id.startswith("resp_") and reply.object == "response"
    assert reply.store is False and reply.status == "incomplete"  # stopped at max_output_tokens
    assert reply.incomplete_details and reply.incomplete_details.reason == "max_output_tokens"
    [message] = reply.output
    assert message.type == "message" and message.id.startswith("msg_")
    assert reply.usage and reply.usage.output_tokens == 4
    assert reply.usage.total_tokens == reply.usage.input_tokens + 4
    raw = gw.post({"model": "echo", "input": "Hello", "max_output_tokens": 4})
    Response.model_validate(raw.json())  # every field the SDK requires is there
    kinds = [e["kind"] for e in gw.events(raw.headers["x-request-id"])]
    assert kinds == ["inference.admitted", "inference.completed"]
    assert {e["action"] for e in gw.events(raw.headers["x-request-id"])} == {"responses"}


def test_an_answer_that_ends_is_completed(gw: Gateway) -> None:
    json_object: Any = {"format": {"type": "json_object"}}
    reply = gw.sdk().responses.create(model="echo", input=ADA, text=json_object)
    assert reply.status == "completed" and reply.incomplete_details is None
    assert reply.output_text == ADA and reply.output[0].status == "completed"  # type: ignore[union-attr]


def test_instructions_and_message_items_reach_the_model(gw: Gateway) -> None:
    sdk = gw.sdk()
    plain = sdk.responses.create(model="echo", input="Hello", max_output_tokens=1)
    told = sdk.responses.create(
        model="echo", input="Hello", instructions="x" * 400, max_output_tokens=1
    )
    assert plain.usage and told.usage
    assert told.usage.input_tokens >= plain.usage.input_tokens + 99
    assert told.instructions == "x" * 400  # echoed, as OpenAI does
    items = sdk.responses.create(
        model="echo",
        input=[
            {"role": "developer", "content": "y" * 400},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Hello"},
        ],
        max_output_tokens=1,
    )
    assert items.usage and items.usage.input_tokens > told.usage.input_tokens


def test_streamed_events_come_in_openai_order(gw: Gateway) -> None:
    body = {"model": "echo", "input": "Hello", "max_output_tokens": 3, "stream": True}
    resp = gw.post(body)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    events = sse_events(resp.text)
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 3,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",  # max_output_tokens reached
    ]
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    final = events[-1]["response"]
    assert final["output"][0]["content"][0]["text"] == deltas == " tok0 tok1 tok2"
    assert final["usage"]["output_tokens"] == 3 and final["store"] is False
    assert (
        events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    )


def test_the_sdk_iterates_a_stream_and_its_helper_gets_the_final_response(gw: Gateway) -> None:
    sdk = gw.sdk()
    types = [e.type for e in sdk.responses.create(model="echo", input="Hello", stream=True)]
    assert types[0] == "response.created" and types[-1] == "response.incomplete"
    json_object: Any = {"format": {"type": "json_object"}}
    with sdk.responses.stream(model="echo", input=ADA, text=json_object) as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert len(texts) > 1 and final.output_text == "".join(texts) == ADA
    assert final.usage and final.usage.output_tokens == len(texts)


def test_a_failure_after_the_first_byte_ends_the_stream_with_error_and_failed(
    gw: Gateway,
) -> None:
    resp = gw.post({"model": "broken", "input": CANARY, "stream": True})
    assert resp.status_code == 200
    events = sse_events(resp.text)
    assert [e["type"] for e in events][-3:] == [
        "response.output_text.delta",
        "error",
        "response.failed",
    ]
    assert events[-2]["code"] == "internal_error"
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
    assert CANARY not in resp.text


# ---- structured outputs and tools ------------------------------------------------------------


def test_text_format_json_schema_through_parse_and_the_stream_helper(gw: Gateway) -> None:
    sdk = gw.sdk()
    parsed = sdk.responses.parse(model="echo", input=ADA, text_format=Person)
    assert parsed.output_parsed == Person(name="Ada", age=36, role="admin")
    assert parsed.text and parsed.text.format and parsed.text.format.type == "json_schema"
    with sdk.responses.stream(model="echo", input=ADA, text_format=Person) as stream:
        final = stream.get_final_response()
    assert final.output_parsed == Person(name="Ada", age=36, role="admin")
    raw = gw.post({"model": "echo", "input": ADA, "text": {"format": {"type": "json_object"}}})
    assert json.loads(raw.json()["output"][0]["content"][0]["text"]) == json.loads(ADA)


def test_a_function_tool_round_trip(gw: Gateway) -> None:
    sdk = gw.sdk()
    question = {"role": "user", "content": bare_calls(("GetWeather", {"city": "Oslo"}))}
    first = sdk.responses.create(
        model="echo", input=[question], tools=[WEATHER], tool_choice="required"
    )
    [call] = first.output
    assert call.type == "function_call" and call.name == "GetWeather"
    assert call.call_id.startswith("call_") and (call.id or "").startswith("fc_")
    assert json.loads(call.arguments) == {"city": "Oslo"} and first.output_text == ""
    completed = next(e for e in gw.events(first.id[5:]) if e["kind"] == "inference.completed")
    assert (completed["tools_count"], completed["tool_calls_count"]) == (1, 1)
    # the call and its result go back as input items; the answer follows
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "z" * 400}
    history: list[Any] = [question, call.model_dump(exclude_none=True), result]
    second = sdk.responses.create(model="echo", input=history, tools=[WEATHER])
    assert second.status == "completed" and second.output[0].type == "message"
    short = sdk.responses.create(
        model="echo", input=[*history[:2], {**result, "output": "z"}], tools=[WEATHER]
    )
    assert second.usage and short.usage
    assert second.usage.input_tokens >= short.usage.input_tokens + 99  # the result was read


def test_streamed_function_calls(gw: Gateway) -> None:
    answer = "Let me check. <tool_call>" + bare_calls(
        ("GetWeather", {"city": "Oslo"}), ("GetWeather", {"city": "Lima"})
    )
    body = {"model": "echo", "input": answer, "tools": [WEATHER], "stream": True}
    events = sse_events(gw.post(body).text)
    types = [e["type"] for e in events]
    assert types.count("response.output_item.added") == 3  # the text, then two calls
    assert types.count("response.function_call_arguments.done") == 2
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.completed"
    message, *calls = final["output"]
    assert message["content"][0]["text"] == "Let me check. "
    for call, city in zip(calls, ("Oslo", "Lima"), strict=True):
        assert call["type"] == "function_call" and json.loads(call["arguments"]) == {"city": city}
        streamed = "".join(
            e["delta"]
            for e in events
            if e["type"] == "response.function_call_arguments.delta" and e["item_id"] == call["id"]
        )
        assert streamed == call["arguments"]
    Response.model_validate(final)
    with gw.sdk().responses.stream(
        model="echo", input=answer, tools=[openai.pydantic_function_tool(GetWeather)]
    ) as stream:
        done = stream.get_final_response()
    assert [c.name for c in done.output if c.type == "function_call"] == ["GetWeather"] * 2


# ---- LangChain, unchanged --------------------------------------------------------------------


def langchain(gw: Gateway, **kw: Any) -> ChatOpenAI:
    return ChatOpenAI(
        model="echo",
        base_url=str(gw.client.base_url) + "/v1",
        api_key=gw.key,  # type: ignore[arg-type]
        http_client=gw.client,
        max_retries=0,
        use_responses_api=True,
        **kw,
    )


def test_langchain_invoke_and_stream(gw: Gateway) -> None:
    llm = langchain(gw, max_tokens=5)
    message = llm.invoke("Hello")
    assert message.text == " tok0 tok1 tok2 tok3 tok4"
    assert message.response_metadata["id"].startswith("resp_")
    assert message.usage_metadata and message.usage_metadata["output_tokens"] == 5
    chunks = list(llm.stream("Hello"))
    assert all(isinstance(c, AIMessageChunk) for c in chunks)
    assert "".join(c.text for c in chunks) == " tok0 tok1 tok2 tok3 tok4"


def test_langchain_tool_call_round_trip(gw: Gateway) -> None:
    llm = langchain(gw).bind_tools([GetWeather], tool_choice="any")
    ask = HumanMessage(bare_calls(("GetWeather", {"city": "Oslo", "units": "f"})))
    called = llm.invoke([ask])
    [call] = called.tool_calls  # type: ignore[attr-defined]
    assert (call["name"], call["args"]) == ("GetWeather", {"city": "Oslo", "units": "f"})
    answered = langchain(gw).invoke([ask, called, ToolMessage("12 F", tool_call_id=call["id"])])
    assert answered.text


def test_langchain_structured_output(gw: Gateway) -> None:
    llm = langchain(gw).with_structured_output(Person, method="json_schema")
    assert llm.invoke(ADA) == Person(name="Ada", age=36, role="admin")


# ---- what is accepted, refused, and never kept -------------------------------------------------


def test_harmless_fields_are_accepted(gw: Gateway) -> None:
    body = {
        "model": "echo",
        "input": "x",
        "max_output_tokens": 2,
        "store": False,
        "include": [],
        "metadata": {"app": "billing"},
        "user": "u1",
        "safety_identifier": "s1",
        "prompt_cache_key": "k",
        "service_tier": "auto",
        "truncation": "auto",
        "reasoning": None,
        "parallel_tool_calls": None,
        "stream_options": None,
        "text": {"format": {"type": "text"}, "verbosity": "low"},
        "top_logprobs": 0,
        "background": False,
    }
    resp = gw.post(body)
    assert resp.status_code == 200, resp.text
    assert resp.json()["metadata"] == {"app": "billing"} and resp.json()["store"] is False


def image(url: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "input_image", "image_url": url}]}


REFUSED = [
    ({"store": True}, "store", "keeps no responses"),
    ({"previous_response_id": CANARY}, "previous_response_id", "keeps no responses"),
    ({"background": True}, "background", "keeps no responses"),
    ({"conversation": CANARY}, "conversation", "keeps no responses"),
    ({"conversation": {"id": CANARY}}, "conversation", "keeps no responses"),
    ({"prompt": {"id": CANARY}}, "prompt", None),
    ({"reasoning": {"effort": "high"}}, "reasoning.effort", None),
    ({"include": ["message.output_text.logprobs"]}, "include", None),
    ({"top_logprobs": 3}, "top_logprobs", None),
    ({"max_tool_calls": 2}, "max_tool_calls", None),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type", "built-in"),
    ({"tools": [WEATHER, {"type": "file_search", "x": CANARY}]}, "tools[1].type", None),
    ({"input": [{"type": "item_reference", "id": CANARY}]}, "input[0].type", "keeps no"),
    ({"input": [{"type": "reasoning", "id": CANARY, "summary": []}]}, "input[0].type", None),
    ({"input": [image(CANARY)]}, "input[0].content[0].type", "text"),
    ({"context_management": [{"type": CANARY}]}, "context_management", None),
    ({CANARY: 1}, None, "unknown field"),  # the client's own name is never repeated
]


@pytest.mark.parametrize(("fields", "param", "says"), REFUSED)
def test_what_cannot_be_honoured_is_refused_naming_the_field(
    gw: Gateway, fields: dict[str, Any], param: str, says: str | None
) -> None:
    resp = gw.post({"model": "echo", "input": "x", **fields})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert (error["code"], error["param"]) == ("unsupported_parameter", param)
    assert says is None or says in error["message"]
    if param != CANARY:
        assert CANARY not in resp.text


BAD = [
    ({"input": []}, "input"),
    ({"input": [{"content": "x"}]}, "input[0]"),
    ({"input": [{"role": "user", "content": 3}]}, "input[0].content"),
    ({"input": [{"role": "user", "content": "x", "type": "message", "x": 1}]}, "input[0]"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ({"input": ["just text"]}, "input[0]"),
    (
        {"tools": [{"type": "function", "name": "f", "parameters": {"type": 3}}]},
        "tools[0].parameters",
    ),
    ({"tools": [{"type": "function"}]}, "tools[0].name"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "g"}}, "tool_choice.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    (
        {"text": {"format": {"type": "json_schema", "name": "p", "schema": {"type": 1}}}},
        "text.format.schema",
    ),
    ({"text": {"format": {"type": "json_schema", "name": "p"}}}, "text.format.schema"),
    ({"temperature": 3}, "temperature"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
]


@pytest.mark.parametrize(("fields", "param"), BAD)
def test_bad_input_gets_a_400_naming_the_field(
    gw: Gateway, fields: dict[str, Any], param: str
) -> None:
    resp = gw.post({"model": "echo", "input": CANARY, **fields})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param
    assert CANARY not in resp.text
    assert gw.events(resp.headers["x-request-id"]) == []  # nothing admitted
    assert CANARY not in gw.dump()


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/responses/resp_1"),
        ("DELETE", "/v1/responses/resp_1"),
        ("GET", "/v1/responses/resp_1/input_items"),
        ("POST", "/v1/responses/resp_1/cancel"),
    ],
)
def test_nothing_stored_can_be_read_back(gw: Gateway, method: str, path: str) -> None:
    assert gw.client.request(method, path).status_code == 401  # authenticated routes
    resp = gw.client.request(method, path.replace("resp_1", CANARY), headers=gw.auth)
    assert resp.status_code == 404
    error = resp.json()["error"]
    assert error["code"] == "no_such_response" and "keeps no responses" in error["message"]
    assert CANARY not in resp.text


def test_the_sdk_sees_retrieve_as_not_found(gw: Gateway) -> None:
    with pytest.raises(openai.NotFoundError):
        gw.sdk().responses.retrieve("resp_123")
    with pytest.raises(openai.NotFoundError):
        gw.sdk().responses.delete("resp_123")
