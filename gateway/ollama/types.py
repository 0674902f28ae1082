"""Ollama's wire types (the subset airgate serves), as msgspec Structs (docs/api.md and
`api/types.go` of the ollama repository).

Requests forbid unknown fields, as the OpenAI adapter's do: a field airgate does not know gets a
400 instead of being silently ignored.  The fields the official `ollama` client sends are all
known; those airgate cannot honour are refused by the handlers with a 400 naming them.
Responses omit what airgate does not know (a model's size on disk, its parameter count) rather
than invent it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from .options import Options

__all__ = [
    "ChatReply",
    "ChatRequest",
    "Details",
    "EmbedReply",
    "EmbedRequest",
    "EmbeddingReply",
    "Format",
    "GenerateReply",
    "GenerateRequest",
    "KeepAlive",
    "LegacyEmbeddingsRequest",
    "Line",
    "Message",
    "OutFunction",
    "OutMessage",
    "OutToolCall",
    "RunningList",
    "RunningModel",
    "ShowReply",
    "ShowRequest",
    "TagList",
    "TaggedModel",
    "Think",
    "Tool",
    "Version",
]

# "" or "json" (any JSON object), or a JSON schema (an object); absent: free text
Format = str | dict[str, Any]
# a duration ("5m", "-1") or seconds: accepted, and changes nothing (models stay resident)
KeepAlive = str | float
# true or a level ("low", "medium", "high") asks for the model's reasoning (refused: none)
Think = bool | str


class _Strict(Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class OllamaCalledFunction(_Strict):
    name: str
    arguments: dict[str, Any] = {}
    index: int | None = None  # newer servers number the calls; accepted, not used


class OllamaToolCall(_Strict):
    function: OllamaCalledFunction
    id: str | None = None  # accepted, not used (the conversation pairs calls by order)


class Message(_Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: list[str] | None = None  # refused unless empty: no model here sees images
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: str | None = None  # a tool result's function: accepted, not used
    thinking: str | None = None  # an earlier turn's reasoning: accepted, not sent to the model


class OllamaFunctionDefinition(_Strict):
    name: Annotated[str, Meta(pattern="^[A-Za-z0-9_-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None  # absent: no parameters


class Tool(_Strict):
    function: OllamaFunctionDefinition
    type: Literal["function"] = "function"


class ChatRequest(_Strict):
    model: str
    messages: list[Message] = []  # none: load the model (it is loaded already)
    tools: Annotated[list[Tool], Meta(max_length=128)] | None = None
    format: Format | None = None
    options: Options | None = None
    stream: bool | None = None  # None: true (Ollama streams by default)
    keep_alive: KeepAlive | None = None
    think: Think | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None


class GenerateRequest(_Strict):
    model: str
    prompt: str = ""  # empty, and nothing else asked: load the model
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool | None = None
    format: Format | None = None
    options: Options | None = None
    stream: bool | None = None
    keep_alive: KeepAlive | None = None
    images: list[str] | None = None
    think: Think | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None


class EmbedRequest(_Strict):
    model: str
    input: str | list[str] = ""  # empty: load the model, no vectors
    truncate: bool | None = None  # airgate never truncates (a longer input is a 400)
    options: Options | None = None
    keep_alive: KeepAlive | None = None
    dimensions: Annotated[int, Meta(ge=1)] | None = None


class LegacyEmbeddingsRequest(_Strict):
    """The legacy `/api/embeddings`: one prompt, one vector."""

    model: str
    prompt: str = ""
    options: Options | None = None
    keep_alive: KeepAlive | None = None


class ShowRequest(_Strict):
    model: str | None = None
    name: str | None = None  # the older spelling of `model`
    verbose: bool | None = None  # accepted: there is no more to show


# ---- responses ----------------------------------------------------------------------------


class Line(Struct, kw_only=True, omit_defaults=True):
    """What every reply line carries, and the summary the final one adds (ns, counts)."""

    model: str
    created_at: str
    done: bool
    done_reason: str | None = None
    total_duration: int | None = None
    load_duration: int | None = None
    prompt_eval_count: int | None = None
    prompt_eval_duration: int | None = None
    eval_count: int | None = None
    eval_duration: int | None = None


class OutFunction(Struct):
    name: str
    arguments: dict[str, Any]  # an object, not JSON text (Ollama's shape)


class OutToolCall(Struct):
    function: OutFunction


class OutMessage(Struct, omit_defaults=True):
    role: Literal["assistant"]
    content: str
    tool_calls: list[OutToolCall] | None = None  # only when the model called tools


class ChatReply(Line, kw_only=True):
    message: OutMessage


class GenerateReply(Line, kw_only=True):
    response: str


class EmbedReply(Struct):
    model: str
    embeddings: list[list[float]]
    total_duration: int
    load_duration: int
    prompt_eval_count: int


class EmbeddingReply(Struct):
    embedding: list[float]


class Details(Struct, omit_defaults=True):
    """A model's details: only what airgate knows (the weights' format from its engine)."""

    parent_model: str = ""
    format: str | None = None


class TaggedModel(Struct, omit_defaults=True):
    name: str
    model: str
    modified_at: str
    details: Details
    digest: str | None = None  # the signed bundle's manifest SHA-256, when served from one
    size: int | None = None  # the weights' bytes, from the bundle's manifest


class TagList(Struct):
    models: list[TaggedModel]


class RunningModel(Struct, omit_defaults=True):
    name: str
    model: str
    details: Details
    context_length: int
    digest: str | None = None
    size: int | None = None
    size_vram: int | None = None  # 0: all on the CPU (llama.cpp); unknown for vLLM


class RunningList(Struct):
    models: list[RunningModel]


class ShowReply(Struct, omit_defaults=True):
    details: Details
    model_info: dict[str, Any]
    capabilities: list[str]
    modified_at: str


class Version(Struct):
    version: str
