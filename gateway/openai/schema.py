"""The OpenAPI operations of the OpenAI routes (the route table pairs them with the handlers)."""

from __future__ import annotations

from ..http.openapi import GENERATION_ERRORS, Operation
from . import embedding_types as et
from . import responses_types as r
from . import types as t

__all__ = [
    "CANCEL_RESPONSE",
    "CHAT",
    "COMPLETIONS",
    "CREATE_RESPONSE",
    "EMBEDDINGS",
    "LIST_INPUT_ITEMS",
    "LIST_MODELS",
    "RETRIEVE_MODEL",
    "RETRIEVE_RESPONSE",
]


CHAT = Operation(
    "post",
    "Create a chat completion",
    GENERATION_ERRORS,
    request=t.ChatCompletionRequest,
    response=t.ChatCompletion,
    described="The result, or an SSE stream when stream=true",
    streams=True,
)
COMPLETIONS = Operation(
    "post",
    "Create a text completion",
    GENERATION_ERRORS,
    request=t.CompletionRequest,
    response=t.Completion,
    described="The result, or an SSE stream when stream=true",
    streams=True,
)
EMBEDDINGS = Operation(
    "post",
    "Create embeddings",
    GENERATION_ERRORS,
    request=et.EmbeddingsRequest,
    response=et.EmbeddingList,
    described="One vector per input",
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
CREATE_RESPONSE = Operation(
    "post",
    "Create a model response (stateless: store is always false)",
    GENERATION_ERRORS,
    request=r.ResponseCreateRequest,
    response=r.ResponseObject,
    described="The response, or an SSE stream of response events when stream=true",
    streams=True,
)
# airgate keeps no responses: what would read one always answers 404
RETRIEVE_RESPONSE = Operation(
    "get",
    "Retrieve a response (none is kept: always 404)",
    ("401", "404"),
    response=r.ResponseObject,
    path_params=("response_id",),
)
LIST_INPUT_ITEMS = Operation(
    "get",
    "List a response's input items (none is kept: always 404)",
    ("401", "404"),
    response=r.ResponseObject,
    path_params=("response_id",),
)
CANCEL_RESPONSE = Operation(
    "post",
    "Cancel a background response (none runs: always 404)",
    ("401", "404"),
    response=r.ResponseObject,
    path_params=("response_id",),
)
