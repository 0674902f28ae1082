"""The client libraries apps are written with, unchanged and with their defaults (no
`max_tokens`, the model's default temperature), against a real `airgate serve` on the real
Gemma model: the `openai` SDK (`parse`, tools through its stream helper, `json_object`),
LangChain (`bind_tools`, `with_structured_output` with each method) and pydantic-ai (an agent
with a tool and a structured result).

A 270M model says little that is true, so the tests check what the gateway promises: the
libraries get well-formed answers they accept, every constrained output validates, and calls
name offered functions with arguments valid against their parameters."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Literal

import openai
import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field
from pydantic_ai import Agent, NativeOutput, RunContext
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.usage import UsageLimits
from server_process import MODEL, Server

pytestmark = pytest.mark.e2e


class Person(BaseModel):
    name: str = Field(max_length=24)
    age: int
    role: Literal["admin", "user", "guest"]


class GetWeather(BaseModel):
    """Get the current weather in a city."""

    city: str = Field(max_length=24)
    units: Literal["c", "f"]


HELLO = [{"role": "user", "content": "Reply with one word: hello."}]
SEED = 3
ASK = [{"role": "user", "content": "Describe one user of our system: name, age and role."}]
WEATHER = [{"role": "user", "content": "What is the weather in Oslo?"}]


@pytest.fixture(scope="module")
def sdk(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=server.key()) as client:
        yield client


def test_openai_plain_chat_without_max_tokens(sdk: openai.OpenAI) -> None:
    """The SDK's defaults: no max_tokens, the model's temperature (seeded: a 270M model at
    temperature 1 may otherwise talk until its context is full, which is allowed but slow)."""
    reply = sdk.chat.completions.create(model=MODEL, messages=HELLO, seed=SEED)
    assert reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"


def test_openai_parse_with_a_pydantic_model(sdk: openai.OpenAI) -> None:
    for _ in range(3):
        reply = sdk.chat.completions.parse(model=MODEL, messages=ASK, response_format=Person)
        choice = reply.choices[0]
        assert choice.finish_reason == "stop"
        assert isinstance(choice.message.parsed, Person)


def test_openai_json_object(sdk: openai.OpenAI) -> None:
    reply = sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Give a JSON object with a greeting."}],
        response_format={"type": "json_object"},
        max_tokens=200,
    )
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)


def test_openai_tool_call_through_the_stream_helper(sdk: openai.OpenAI) -> None:
    with sdk.chat.completions.stream(
        model=MODEL,
        messages=WEATHER,  # type: ignore[arg-type]
        tools=[openai.pydantic_function_tool(GetWeather)],
        tool_choice="required",
        parallel_tool_calls=False,
    ) as stream:
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    assert call.function.name == "GetWeather"  # type: ignore[union-attr]
    assert isinstance(call.function.parsed_arguments, GetWeather)  # type: ignore[union-attr]
    assert call.id.startswith("call_")


def langchain(server: Server) -> ChatOpenAI:
    return ChatOpenAI(model=MODEL, base_url=f"{server.base_url}/v1", api_key=server.key())  # type: ignore[arg-type]


def test_langchain_invoke_and_bind_tools(server: Server) -> None:
    assert langchain(server).bind(seed=SEED).invoke(HELLO[0]["content"]).content
    tools = langchain(server).bind_tools([GetWeather], tool_choice="any", parallel_tool_calls=False)
    [call] = tools.invoke("What is the weather in Oslo?").tool_calls  # type: ignore[attr-defined]
    assert call["name"] == "GetWeather"
    GetWeather.model_validate(call["args"])


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_with_structured_output(server: Server, method: str) -> None:
    """(`json_mode` constrains to any JSON object, which a 270M model at temperature 1 can
    make as long as its context: it is tested on the HTTP path, tests/integration.)"""
    model = langchain(server).with_structured_output(Person, method=method)  # type: ignore[arg-type]
    assert isinstance(model.invoke(ASK[0]["content"]), Person)


def lookup_agent(model: OpenAIChatModel, output: Any) -> tuple[Agent[None, Any], list[int]]:
    """An agent with a lookup tool it may call once (pydantic-ai's `prepare` hides it after:
    a 270M model would otherwise call it again and again), and the ids it was called with."""
    looked_up: list[int] = []

    async def once(ctx: RunContext[None], tool: ToolDefinition) -> ToolDefinition | None:
        return None if looked_up else tool

    agent = Agent(
        model,
        output_type=output,
        system_prompt="Look users up before describing them.",
        model_settings=ModelSettings(seed=SEED),
    )

    @agent.tool_plain(prepare=once)
    def lookup_user(user_id: int) -> str:
        """Look a user up by id."""
        looked_up.append(user_id)
        return f"user {user_id}: Ada, 36, admin"

    return agent, looked_up


def test_pydantic_ai_agent_with_a_tool_and_a_structured_result(server: Server) -> None:
    """An agent whose result is a tool call (pydantic-ai's default output) and one whose
    result is the response format beside its tools (its native output); arguments reach the
    tool validated against its signature, the result against the output type."""
    model = OpenAIChatModel(
        MODEL, provider=OpenAIProvider(base_url=f"{server.base_url}/v1", api_key=server.key())
    )
    for output in (Person, NativeOutput(Person)):
        agent, looked_up = lookup_agent(model, output)
        result = agent.run_sync("Describe user 7.", usage_limits=UsageLimits(request_limit=4))
        assert isinstance(result.output, Person)
        assert all(isinstance(i, int) for i in looked_up)
    plain = Agent(model, model_settings=ModelSettings(seed=SEED)).run_sync(HELLO[0]["content"])
    assert isinstance(plain.output, str) and plain.output
