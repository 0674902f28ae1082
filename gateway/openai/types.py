"""OpenAI wire types (the subset we serve), as msgspec Structs.

Requests forbid unknown fields: a parameter we do not implement gets a 400 that names it instead
of being silently ignored.  `top_k`, `min_p` and `repetition_penalty` are accepted as vLLM-style
extensions (the OpenAI SDK sends them through `extra_body`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

__all__ = [
    "MAX_N",
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

MAX_N = 8  # choices per request: each one takes a sequence slot of the engine
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


class TextFormat(_Strict, tag_field="type", tag="text"):
    pass


class JsonObjectFormat(_Strict, tag_field="type", tag="json_object"):
    pass


class JsonSchema(_Strict):
    name: Annotated[str, Meta(pattern="^[A-Za-z0-9_-]{1,64}$")]
    description: str | None = None
    schema: dict[str, Any] | None = None  # absent: any JSON object
    strict: bool | None = None  # always enforced here (constrained decoding)


class JsonSchemaFormat(_Strict, tag_field="type", tag="json_schema"):
    json_schema: JsonSchema


ResponseFormat = TextFormat | JsonObjectFormat | JsonSchemaFormat


class FunctionDefinition(_Strict):
    name: Annotated[str, Meta(pattern="^[A-Za-z0-9_-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None  # absent: no parameters
    strict: bool | None = None  # always enforced here


class FunctionTool(_Strict, tag_field="type", tag="function"):
    function: FunctionDefinition


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict, tag_field="type", tag="function"):
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(_Strict):
    name: str
    arguments: str


class MessageToolCall(_Strict, tag_field="type", tag="function"):
    id: str
    function: CalledFunction


class TextPart(_Strict, tag_field="type", tag="text"):
    text: str


class ImagePart(_Strict, tag_field="type", tag="image_url"):
    image_url: dict[str, str]


class AudioPart(_Strict, tag_field="type", tag="input_audio"):
    input_audio: dict[str, str]


ContentPart = TextPart | ImagePart | AudioPart


Name = Annotated[str, Meta(max_length=256)]  # a participant's name: accepted, not used


class SystemMessage(_Strict, tag_field="role", tag="system"):
    content: str | list[TextPart]
    name: Name | None = None


class DeveloperMessage(_Strict, tag_field="role", tag="developer"):
    content: str | list[TextPart]
    name: Name | None = None


class UserMessage(_Strict, tag_field="role", tag="user"):
    content: str | list[ContentPart]
    name: Name | None = None


class AssistantMessage(_Strict, tag_field="role", tag="assistant"):
    content: str | list[TextPart] | None = None  # null when the turn only called tools
    tool_calls: list[MessageToolCall] | None = None
    refusal: str | None = None
    name: Name | None = None


class ToolMessage(_Strict, tag_field="role", tag="tool"):
    content: str | list[TextPart]
    tool_call_id: Annotated[str, Meta(max_length=256)]


Message = SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage


class ChatCompletionRequest(_Strict):
    model: str
    messages: Annotated[list[Message], Meta(min_length=1)]
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: Annotated[int, Meta(ge=1, le=MAX_N)] | None = None  # None: 1
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    stop: str | StopList | None = None
    seed: Seed | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, Annotated[float, Meta(ge=-100.0, le=100.0)]] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    response_format: ResponseFormat | None = None
    tools: Annotated[list[FunctionTool], Meta(max_length=128)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    user: Annotated[str, Meta(max_length=256)] | None = None
    # Accepted and ignored: they change nothing about the answer here (README, "Accepted and
    # ignored").  `store: true` is refused: nothing is ever stored.
    store: bool | None = None
    metadata: Annotated[dict[str, str], Meta(max_length=16)] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    prompt_cache_key: Annotated[str, Meta(max_length=256)] | None = None
    safety_identifier: Annotated[str, Meta(max_length=256)] | None = None
    modalities: list[Literal["text"]] | None = None
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
    n: Annotated[int, Meta(ge=1, le=MAX_N)] | None = None  # None: 1
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    stop: str | StopList | None = None
    seed: Seed | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, Annotated[float, Meta(ge=-100.0, le=100.0)]] | None = None
    logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    echo: bool | None = None
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
    content: list[TokenInfo] | None
    refusal: list[TokenInfo] | None = None  # always sent: required (an array or null)


class ToolCallFunction(Struct):
    name: str
    arguments: str  # the arguments as JSON text, exactly as generated


class ToolCall(Struct):
    id: str
    function: ToolCallFunction
    type: Literal["function"] = "function"


class ResponseMessage(Struct, omit_defaults=True, tag_field="role", tag="assistant"):
    """`role`, `content` and `refusal` are always sent (the last two a string or null);
    `tool_calls` only when calls were made."""

    content: str | None
    refusal: None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(Struct):
    index: int
    message: ResponseMessage
    finish_reason: str | None
    logprobs: ChatLogprobs | None = None


class ChatCompletion(Struct, tag_field="object", tag="chat.completion"):
    """No `system_fingerprint`: OpenAI's document allows a string only, and we have none."""

    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo


class ToolCallFunctionDelta(Struct, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(Struct, omit_defaults=True):
    """A streamed piece of a tool call: `id`, `type` and the name come with its first piece."""

    index: int
    function: ToolCallFunctionDelta
    id: str | None = None
    type: Literal["function"] | None = None


class Delta(Struct, omit_defaults=True):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(Struct):
    index: int
    delta: Delta
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None


class ChatCompletionChunk(
    Struct, tag_field="object", tag="chat.completion.chunk", omit_defaults=True
):
    """`usage` only on the last chunk, when the client asked for it."""

    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
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


class Completion(Struct, tag_field="object", tag="text_completion", omit_defaults=True):
    """Also the streamed chunk (the legacy API streams the same shape): `usage` only where it
    is known, never as null."""

    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


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
