"""The OpenAPI operations of the OpenAI routes (the route table pairs them with the handlers)."""

from __future__ import annotations

from ..http.openapi import Operation
from . import types as t

__all__ = ["CHAT", "COMPLETIONS", "LIST_MODELS", "RETRIEVE_MODEL"]

_GENERATE_ERRORS = ("400", "401", "403", "404", "413", "429", "503")

CHAT = Operation(
    "post",
    "Create a chat completion",
    _GENERATE_ERRORS,
    request=t.ChatCompletionRequest,
    response=t.ChatCompletion,
    described="The result, or an SSE stream when stream=true",
    streams=True,
)
COMPLETIONS = Operation(
    "post",
    "Create a text completion",
    _GENERATE_ERRORS,
    request=t.CompletionRequest,
    response=t.Completion,
    described="The result, or an SSE stream when stream=true",
    streams=True,
)
LIST_MODELS = Operation("get", "List models", ("401",), response=t.ModelList, described="Models")
RETRIEVE_MODEL = Operation(
    "get",
    "Retrieve a model",
    ("401", "404"),
    response=t.Model,
    described="The model",
    path_params=("model",),
)
