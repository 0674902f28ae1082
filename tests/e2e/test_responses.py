"""POST /v1/responses against a real `airgate serve` on the real Gemma model, through the
clients apps use, unchanged: the `openai` SDK (`responses.create` streamed and not, `parse`, a
function tool with tool_choice "required" and its result sent back) and pydantic-ai's
`OpenAIResponsesModel` (an agent with a tool and a structured result).

A 270M model says little that is true: the tests check what the gateway promises (well-formed
responses the clients accept, constrained outputs that validate, calls that name an offered
function with arguments valid against its parameters) and that nothing was kept."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import openai
import pytest
from pydantic import BaseModel, Field
from pydantic_ai import Agent, RunContext
from pydantic_ai.models.openai import OpenAIResponsesModel
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


WEATHER_TOOL: Any = {
    "type": "function",
    "name": "GetWeather",
    "description": "Get the current weather in a city.",
    "parameters": GetWeather.model_json_schema(),
    "strict": True,
}
HELLO = "Reply with one word: hello."


@pytest.fixture(scope="module")
def sdk(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=server.key()) as client:
        yield client


def test_create_with_instructions(sdk: openai.OpenAI) -> None:
    reply = sdk.responses.create(
        model=MODEL,
        instructions="You are terse.",
        input=HELLO,
        max_output_tokens=32,
        temperature=0,
    )
    assert reply.output_text and reply.store is False
    assert reply.status in ("completed", "incomplete")
    assert reply.usage and reply.usage.input_tokens > 0 and 0 < reply.usage.output_tokens <= 32
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(reply.id)  # nothing was kept


def test_streamed_events_add_up_to_the_final_response(sdk: openai.OpenAI) -> None:
    events = list(
        sdk.responses.create(
            model=MODEL, input=HELLO, max_output_tokens=32, temperature=0, stream=True
        )
    )
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created"
    last = events[-1]
    assert last.type in ("response.completed", "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and last.response.output_text == text


def test_parse_with_a_pydantic_model(sdk: openai.OpenAI) -> None:
    reply = sdk.responses.parse(
        model=MODEL,
        input="Describe one user of our system: name, age and role.",
        text_format=Person,
    )
    assert reply.status == "completed"
    assert isinstance(reply.output_parsed, Person)


def test_a_required_function_tool_and_its_result(sdk: openai.OpenAI) -> None:
    ask: Any = {"role": "user", "content": "What is the weather in Oslo?"}
    first = sdk.responses.create(
        model=MODEL, input=[ask], tools=[WEATHER_TOOL], tool_choice="required"
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and all(c.name == "GetWeather" for c in calls)
    for call in calls:
        GetWeather.model_validate_json(call.arguments)
    results = [
        {"type": "function_call_output", "call_id": c.call_id, "output": "12 C, clear"}
        for c in calls
    ]
    history = [ask, *(c.model_dump(exclude_none=True) for c in calls), *results]
    answer = sdk.responses.create(
        model=MODEL, input=history, tools=[WEATHER_TOOL], max_output_tokens=48, temperature=0
    )
    assert answer.status in ("completed", "incomplete") and answer.output


def test_a_streamed_required_call_through_the_stream_helper(sdk: openai.OpenAI) -> None:
    with sdk.responses.stream(
        model=MODEL,
        input="What is the weather in Lima?",
        tools=[openai.pydantic_function_tool(GetWeather)],
        tool_choice="required",
    ) as stream:
        argument_pieces = [
            e.delta for e in stream if e.type == "response.function_call_arguments.delta"
        ]
        final = stream.get_final_response()
    calls = [item for item in final.output if item.type == "function_call"]
    assert calls and "".join(argument_pieces) == "".join(c.arguments for c in calls)
    assert all(isinstance(c.parsed_arguments, GetWeather) for c in calls)


def test_pydantic_ai_responses_model_with_a_tool_and_a_structured_result(server: Server) -> None:
    model = OpenAIResponsesModel(
        MODEL, provider=OpenAIProvider(base_url=f"{server.base_url}/v1", api_key=server.key())
    )
    looked_up: list[int] = []

    async def once(ctx: RunContext[None], tool: ToolDefinition) -> ToolDefinition | None:
        # the tool may be called once (hidden afterwards): a 270M model would call it again
        # and again until the request limit
        return None if looked_up else tool

    agent = Agent(
        model,
        output_type=Person,
        instructions="Look the user up with the tool, then describe them.",
        model_settings=ModelSettings(seed=3),
    )

    @agent.tool(prepare=once)
    def lookup_user(ctx: RunContext[None], user_id: int) -> str:
        """Look a user up by id."""
        looked_up.append(user_id)
        return f"user {user_id}: Ada, 36, admin"

    result = agent.run_sync("Describe user 7.", usage_limits=UsageLimits(request_limit=4))
    assert isinstance(result.output, Person)
    assert all(isinstance(i, int) for i in looked_up)
    plain = Agent(model).run_sync(HELLO)
    assert isinstance(plain.output, str) and plain.output
