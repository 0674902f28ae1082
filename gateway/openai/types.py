"""OpenAI wire types (the subset we serve), as msgspec Structs.

Requests forbid unknown fields: a parameter we do not implement gets a 400 that names it instead
of being silently ignored.  `top_k`, `min_p` and `repetition_penalty` are accepted as vLLM-style
extensions (the OpenAI SDK sends them through `extra_body`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct

__all__ = [
    "ChatChoice",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatLogprobs",
    "ChunkChoice",
    "Completion",
    "CompletionChoice",
    "CompletionChunk",
    "CompletionLogprobs",
    "CompletionRequest",
    "Delta",
    "ImagePart",
    "Message",
    "Model",
    "ModelList",
    "Prompt",
    "ResponseMessage",
    "StreamOptions",
    "TextPart",
    "TokenInfo",
    "TopTokenInfo",
    "UsageInfo",
]

MaxTokens = Annotated[int, Meta(ge=1, le=1_048_576)]
Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, Meta(gt=0.0, le=1.0)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
Seed = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
StopList = Annotated[list[Annotated[str, Meta(min_length=1)]], Meta(max_length=16)]


class _Strict(Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class StreamOptions(_Strict):
    include_usage: bool = False


class ResponseFormat(_Strict):
    type: Literal["text"]


class TextPart(_Strict, tag_field="type", tag="text"):
    text: str


class ImagePart(_Strict, tag_field="type", tag="image_url"):
    image_url: dict[str, str]


class AudioPart(_Strict, tag_field="type", tag="input_audio"):
    input_audio: dict[str, str]


ContentPart = TextPart | ImagePart | AudioPart


class SystemMessage(_Strict, tag_field="role", tag="system"):
    content: str | list[TextPart]


class DeveloperMessage(_Strict, tag_field="role", tag="developer"):
    content: str | list[TextPart]


class UserMessage(_Strict, tag_field="role", tag="user"):
    content: str | list[ContentPart]


class AssistantMessage(_Strict, tag_field="role", tag="assistant"):
    content: str | list[TextPart]


class ToolMessage(_Strict, tag_field="role", tag="tool"):
    content: str | list[TextPart]
    tool_call_id: str


Message = SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage


class ChatCompletionRequest(_Strict):
    model: str
    messages: Annotated[list[Message], Meta(min_length=1)]
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: Annotated[int, Meta(ge=1, le=128)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | StopList | None = None
    seed: Seed | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, Annotated[float, Meta(ge=-100.0, le=100.0)]] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    response_format: ResponseFormat | None = None
    user: Annotated[str, Meta(max_length=256)] | None = None
    # vLLM-style extensions
    top_k: Annotated[int, Meta(ge=-1, le=1_000_000)] | None = None
    min_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Meta(gt=0.0, le=2.0)] | None = None


# msgspec allows one array type per union: list elements are checked for one kind in the handler.
Prompt = str | list[str | int | list[int]]


class CompletionRequest(_Strict):
    model: str
    prompt: Prompt
    max_tokens: MaxTokens | None = 16  # the OpenAI default for this endpoint
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: Annotated[int, Meta(ge=1, le=128)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | StopList | None = None
    seed: Seed | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, Annotated[float, Meta(ge=-100.0, le=100.0)]] | None = None
    logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    echo: bool = False
    user: Annotated[str, Meta(max_length=256)] | None = None
    top_k: Annotated[int, Meta(ge=-1, le=1_000_000)] | None = None
    min_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Meta(gt=0.0, le=2.0)] | None = None


# ---- responses ----------------------------------------------------------------------------


class UsageInfo(Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TopTokenInfo(Struct):
    token: str
    logprob: float
    bytes: list[int]


class TokenInfo(Struct):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopTokenInfo]


class ChatLogprobs(Struct):
    content: list[TokenInfo]


class ResponseMessage(Struct):
    role: Literal["assistant"]
    content: str


class ChatChoice(Struct):
    index: int
    message: ResponseMessage
    finish_reason: str | None
    logprobs: ChatLogprobs | None = None


class ChatCompletion(Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    object: Literal["chat.completion"] = "chat.completion"
    system_fingerprint: str | None = None


class Delta(Struct, omit_defaults=True):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(Struct):
    index: int
    delta: Delta
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None


class ChatCompletionChunk(Struct):
    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    usage: UsageInfo | None = None


class CompletionLogprobs(Struct):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(Struct):
    index: int
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None


class Completion(Struct):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    object: Literal["text_completion"] = "text_completion"


CompletionChunk = Completion  # the legacy API streams the same shape


class Model(Struct):
    id: str
    created: int
    owned_by: str
    max_model_len: int | None = None
    object: Literal["model"] = "model"


class ModelList(Struct):
    data: list[Model]
    object: Literal["list"] = "list"
