"""The OpenAPI operations of Ollama's routes (the route table pairs them with the handlers).

Their errors are Ollama's `{"error": "..."}`, and their streams NDJSON, Ollama's default: a
request that leaves `stream` out is answered line by line.
"""

from __future__ import annotations

from ..errors import OllamaError
from ..http.openapi import GENERATION_ERRORS, Operation
from . import types as t

__all__ = ["CHAT", "EMBED", "EMBEDDINGS", "GENERATE", "PS", "SHOW", "TAGS", "VERSION"]

_NDJSON = "application/x-ndjson"

CHAT = Operation(
    "post",
    "Ollama: chat (NDJSON lines unless stream is false)",
    GENERATION_ERRORS,
    request=t.ChatRequest,
    response=t.ChatReply,
    described="The reply, or NDJSON lines (the default)",
    streams=True,
    stream_media=_NDJSON,
    error=OllamaError,
)
GENERATE = Operation(
    "post",
    "Ollama: generate (NDJSON lines unless stream is false)",
    GENERATION_ERRORS,
    request=t.GenerateRequest,
    response=t.GenerateReply,
    described="The reply, or NDJSON lines (the default)",
    streams=True,
    stream_media=_NDJSON,
    error=OllamaError,
)
EMBED = Operation(
    "post",
    "Ollama: embed one input or several",
    GENERATION_ERRORS,
    request=t.EmbedRequest,
    response=t.EmbedReply,
    described="One vector per input",
    error=OllamaError,
)
EMBEDDINGS = Operation(
    "post",
    "Ollama: embed one prompt (the older route)",
    GENERATION_ERRORS,
    request=t.LegacyEmbeddingsRequest,
    response=t.EmbeddingReply,
    described="The vector",
    error=OllamaError,
)
TAGS = Operation(
    "get", "Ollama: the models you may use", ("401",), response=t.TagList, error=OllamaError
)
PS = Operation(
    "get", "Ollama: the models loaded now", ("401",), response=t.RunningList, error=OllamaError
)
SHOW = Operation(
    "post",
    "Ollama: one model's details and capabilities",
    ("400", "401", "404", "413"),
    request=t.ShowRequest,
    response=t.ShowReply,
    error=OllamaError,
)
VERSION = Operation(
    "get", "airgate's version (Ollama's route)", ("401",), response=t.Version, error=OllamaError
)
