"""Ollama's API end to end: a real `airgate serve` (one for the module) on the real Gemma model
and the default embedding model, driven by the unchanged official `ollama` client with its
defaults (only `host` and the bearer header given): list, show, ps, chat and generate streamed
and not, embed, a tool given as a Python function, `format` as a JSON schema.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import numpy as np
import ollama
import pytest
from server_process import MODEL, Server

EMBEDDER = "all-minilm-l6-v2"
SEED = 7
HELLO = [{"role": "user", "content": "Write one sentence about the sea."}]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer"},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def client(server: Server) -> ollama.Client:
    return ollama.Client(host=server.base_url, headers=server.auth())


def options(**kw: Any) -> dict[str, Any]:
    return {"temperature": 0, "seed": SEED, "num_predict": 24, **kw}


def test_list_show_and_ps(client: ollama.Client) -> None:
    names = [m.model for m in client.list().models]
    assert MODEL in names and EMBEDDER in names
    listed = next(m for m in client.list().models if m.model == MODEL)
    assert listed.details is not None and listed.details.format == "gguf"
    assert listed.digest and len(listed.digest) == 64  # the signed bundle's manifest digest
    # the Gemma 3 270M GGUF is about 292 MB (its manifest's plaintext size)
    assert listed.size is not None and 200_000_000 < listed.size < 400_000_000
    shown = client.show(MODEL)
    assert shown.capabilities == ["completion", "tools"]
    assert shown.modelinfo is not None and shown.modelinfo["airgate.context_length"] == 2048
    assert client.show(EMBEDDER).capabilities == ["embedding"]
    running = {m.model: m for m in client.ps().models}
    assert running[MODEL].context_length == 2048
    assert running[MODEL].size == listed.size and running[MODEL].size_vram == 0  # all on the CPU
    with pytest.raises(ollama.ResponseError) as caught:
        client.show("no-such-model")
    assert caught.value.status_code == 404


def test_chat_not_streamed(client: ollama.Client) -> None:
    reply = client.chat(MODEL, HELLO, options=options())  # the client's default: stream=False
    assert reply.done and reply.done_reason in ("stop", "length")
    assert reply.message.role == "assistant" and reply.message.content
    assert reply.eval_count and 0 < reply.eval_count <= 24
    assert reply.prompt_eval_count and reply.prompt_eval_count > 5
    assert reply.total_duration and reply.eval_duration is not None
    assert reply.prompt_eval_duration and reply.total_duration > reply.prompt_eval_duration
    assert reply.load_duration == 0


def test_chat_streamed_matches_not_streamed(client: ollama.Client) -> None:
    whole = client.chat(MODEL, HELLO, options=options())
    pieces = list(client.chat(MODEL, HELLO, options=options(), stream=True))
    assert len(pieces) > 2 and all(not p.done for p in pieces[:-1])
    final = pieces[-1]
    assert final.done and final.eval_count == whole.eval_count
    assert "".join(p.message.content or "" for p in pieces) == whole.message.content


def test_generate_streamed_and_not(client: ollama.Client) -> None:
    prompt = "The capital of France is"
    whole = client.generate(MODEL, prompt, options=options(num_predict=8))
    assert whole.done and whole.response and whole.eval_count
    assert whole.context is None  # never returned: no state is kept
    pieces = list(client.generate(MODEL, prompt, options=options(num_predict=8), stream=True))
    assert "".join(p.response or "" for p in pieces) == whole.response
    assert pieces[-1].done and pieces[-1].done_reason == whole.done_reason
    raw = client.generate(MODEL, prompt, raw=True, options=options(num_predict=4))
    assert raw.done and raw.eval_count


def test_embed(client: ollama.Client) -> None:
    texts = ["The cat sat on the mat.", "A kitten rested on the rug.", "Stock markets fell."]
    reply = client.embed(EMBEDDER, texts)
    vectors = np.array(reply.embeddings)
    assert vectors.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    similar, unrelated = vectors[0] @ vectors[1], vectors[0] @ vectors[2]
    assert similar > unrelated
    assert reply.prompt_eval_count and reply.prompt_eval_count > 10
    legacy = client.embeddings(EMBEDDER, texts[0])
    np.testing.assert_allclose(legacy.embedding, vectors[0], atol=1e-6)


def get_weather(city: str) -> str:
    """Get the current weather in a city.

    Args:
      city: The name of the city

    Returns:
      str: The weather
    """
    return f"sunny in {city}"


def test_a_tool_given_as_a_python_function(client: ollama.Client) -> None:
    """Ollama has no tool_choice: the model decides (airgate's "auto").  A 270M base model
    calls a tool when the conversation shows it how (one earlier call and its result); the
    call it writes is constrained to the function's signature."""
    earlier = {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [earlier]},
        {"role": "tool", "content": get_weather("Paris"), "tool_name": "get_weather"},
        {"role": "assistant", "content": "It is sunny in Paris."},
        {"role": "user", "content": "What is the weather in Oslo?"},
    ]
    reply = client.chat(MODEL, messages, tools=[get_weather], options=options(num_predict=64))
    calls = reply.message.tool_calls or []
    assert calls, reply.message.content
    assert reply.done_reason == "stop"
    for call in calls:
        assert call.function.name == "get_weather"
        assert set(call.function.arguments) == {"city"}
        assert isinstance(call.function.arguments["city"], str)
    streamed = list(
        client.chat(
            MODEL, messages, tools=[get_weather], options=options(num_predict=64), stream=True
        )
    )
    assert [c for p in streamed for c in p.message.tool_calls or ()] == calls
    # the result goes back into the conversation, and the model answers
    messages += [
        reply.message.model_dump(exclude_none=True),
        {
            "role": "tool",
            "content": get_weather(**calls[0].function.arguments),
            "tool_name": "get_weather",
        },
    ]
    assert client.chat(MODEL, messages, tools=[get_weather], options=options()).done


def test_format_is_a_json_schema(client: ollama.Client) -> None:
    messages = [{"role": "user", "content": "Describe a person called Ada, aged 36, as JSON."}]
    reply = client.chat(MODEL, messages, format=PERSON, options=options(num_predict=64))
    person = json.loads(reply.message.content or "")
    jsonschema.validate(person, PERSON)
    streamed = client.generate(
        MODEL,
        "Ada is 36 years old. Ada as JSON:",
        format=PERSON,
        options=options(num_predict=64),
        stream=True,
    )
    jsonschema.validate(json.loads("".join(p.response or "" for p in streamed)), PERSON)
    shown = 'Ada is 36 years old. As JSON: {"name": "Ada", "age": 36}\nBob is 40. As JSON:'
    anything = client.generate(MODEL, shown, format="json", options=options(num_predict=48))
    assert anything.done_reason == "stop", anything.response
    assert isinstance(json.loads(anything.response), dict)


def test_errors_reach_the_client_in_ollamas_shape(server: Server, client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(MODEL, HELLO, options={"mirostat": 2})
    assert caught.value.status_code == 400 and "mirostat" in caught.value.error
    with pytest.raises(ollama.ResponseError) as refused:
        client.pull(MODEL)
    assert refused.value.status_code == 403 and "signed bundles" in refused.value.error
    anonymous = ollama.Client(host=server.base_url)
    with pytest.raises(ollama.ResponseError) as unauthenticated:
        anonymous.list()
    assert unauthenticated.value.status_code == 401
    assert isinstance(unauthenticated.value.error, str)  # Ollama's shape, not a dict
