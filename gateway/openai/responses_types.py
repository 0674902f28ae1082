"""OpenAI Responses wire types (the stateless subset we serve), as msgspec Structs.

The request forbids unknown fields, as chat's does.  Its `input` items and `tools` arrive as
raw JSON and are decoded one by one by their `type` (`responses.py`): a message may come without
`type` (OpenAI's "easy" input message), which a tagged union cannot express, and a built-in
tool or a stateful item (`item_reference`) is refused by its type, naming it, rather than as a
malformed value.  The response object, its output items and the streamed events (each with its
`sequence_number`) are encoded from the Structs below.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Raw, Struct

from .types import MaxTokens, Temperature, TopP

__all__ = [
    "AssistantInput",
    "ContentPartAdded",
    "ContentPartDone",
    "ErrorEvent",
    "FunctionCallArgumentsDelta",
    "FunctionCallArgumentsDone",
    "FunctionCallInput",
    "FunctionCallItem",
    "FunctionCallOutputInput",
    "FunctionTool",
    "IncompleteDetails",
    "InputFile",
    "InputImage",
    "InputMessage",
    "InputText",
    "ItemHead",
    "MessageItem",
    "NamedFunction",
    "OutputItem",
    "OutputItemAdded",
    "OutputItemDone",
    "OutputText",
    "OutputTextDelta",
    "OutputTextDone",
    "ResponseCompleted",
    "ResponseCreateRequest",
    "ResponseCreated",
    "ResponseError",
    "ResponseFailed",
    "ResponseInProgress",
    "ResponseIncomplete",
    "ResponseObject",
    "ResponseUsage",
    "StreamEvent",
    "TextConfig",
]

FunctionName = Annotated[str, Meta(pattern="^[A-Za-z0-9_-]{1,64}$")]
CallId = Annotated[str, Meta(min_length=1, max_length=256)]
ItemStatus = Literal["in_progress", "completed", "incomplete"]


class _Strict(Struct, forbid_unknown_fields=True, kw_only=True):
    pass


# ---- the request ------------------------------------------------------------------------------


class ItemHead(Struct):
    """What an input item or a tool is, read before the item itself (other fields ignored)."""

    type: str | None = None
    role: str | None = None


class InputText(_Strict, tag_field="type", tag="input_text"):
    text: str


class InputImage(Struct, tag_field="type", tag="input_image", kw_only=True):
    """Decoded to be refused by its type (the model reads text only)."""


class InputFile(Struct, tag_field="type", tag="input_file", kw_only=True):
    """Decoded to be refused by its type (the model reads text only)."""


class OutputTextInput(_Strict, tag_field="type", tag="output_text"):
    """An earlier answer's text, sent back as history."""

    text: str
    annotations: list[dict[str, Any]] | None = None
    logprobs: list[dict[str, Any]] | None = None


class RefusalInput(_Strict, tag_field="type", tag="refusal"):
    refusal: str


InputContent = InputText | InputImage | InputFile


class InputMessage(_Strict, tag_field="type", tag="message"):
    role: Literal["user", "system", "developer"]
    content: str | list[InputContent]
    id: str | None = None
    status: ItemStatus | None = None


class AssistantInput(_Strict, tag_field="type", tag="message"):
    """An earlier assistant turn: the easy form (a string) or a returned output message."""

    role: Literal["assistant"]
    content: str | list[OutputTextInput | RefusalInput | InputText]
    id: str | None = None
    status: ItemStatus | None = None
    phase: Literal["commentary", "final_answer"] | None = None


class FunctionCallInput(_Strict, tag_field="type", tag="function_call"):
    """An earlier call of a function tool, sent back with its result."""

    call_id: CallId
    name: FunctionName
    arguments: str
    id: str | None = None
    status: ItemStatus | None = None


class FunctionCallOutputInput(_Strict, tag_field="type", tag="function_call_output"):
    call_id: CallId
    output: str | list[InputContent]
    id: str | None = None
    status: ItemStatus | None = None


class FunctionTool(_Strict, tag_field="type", tag="function"):
    """A function tool, flat (chat nests the same fields under `function`)."""

    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None  # absent: no parameters
    strict: bool | None = None  # always enforced here (constrained decoding)


class NamedFunction(_Strict, tag_field="type", tag="function"):
    name: str


class TextFormat(_Strict, tag_field="type", tag="text"):
    pass


class JsonObjectFormat(_Strict, tag_field="type", tag="json_object"):
    pass


class JsonSchemaFormat(_Strict, tag_field="type", tag="json_schema"):
    name: FunctionName
    schema: dict[str, Any]
    description: str | None = None
    strict: bool | None = None  # always enforced here


class TextConfig(_Strict):
    format: TextFormat | JsonObjectFormat | JsonSchemaFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # a hint: accepted, not used


class Reasoning(_Strict):
    """Accepted only as "no reasoning": the models served here do not reason."""

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesStreamOptions(_Strict):
    include_obfuscation: bool | None = None  # nothing is padded here: accepted, not used


ToolChoice = Literal["none", "auto", "required"] | NamedFunction


class ResponseCreateRequest(_Strict):
    model: str
    input: str | Annotated[list[Raw], Meta(min_length=1, max_length=4096)]
    instructions: str | None = None
    tools: Annotated[list[Raw], Meta(max_length=128)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stream: bool | None = None
    stream_options: ResponsesStreamOptions | None = None
    # Accepted and ignored: they change nothing about the answer here.  `truncation: "auto"`
    # is accepted too: an input that does not fit is refused (context_length_exceeded), never
    # cut, so nothing changes silently.
    metadata: Annotated[dict[str, str], Meta(max_length=16)] | None = None
    user: Annotated[str, Meta(max_length=256)] | None = None
    safety_identifier: Annotated[str, Meta(max_length=256)] | None = None
    prompt_cache_key: Annotated[str, Meta(max_length=256)] | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    reasoning: Reasoning | None = None  # refused when it asks for reasoning
    include: Annotated[list[str], Meta(max_length=16)] | None = None  # refused unless empty
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None  # refused unless 0
    # Refused: airgate keeps no responses, and runs no tools of its own.
    store: bool | None = None
    previous_response_id: str | None = None
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    max_tool_calls: int | None = None


# ---- the response ----------------------------------------------------------------------------


class OutputText(Struct, tag_field="type", tag="output_text"):
    text: str
    annotations: list[Any] = []
    logprobs: list[Any] = []


class MessageItem(Struct, tag_field="type", tag="message"):
    id: str
    status: ItemStatus
    content: list[OutputText]
    role: Literal["assistant"] = "assistant"


class FunctionCallItem(Struct, tag_field="type", tag="function_call"):
    id: str
    call_id: str
    name: str
    arguments: str
    status: ItemStatus


OutputItem = MessageItem | FunctionCallItem


class InputTokensDetails(Struct, frozen=True):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(Struct, frozen=True):
    reasoning_tokens: int = 0


class ResponseUsage(Struct):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: InputTokensDetails = InputTokensDetails()
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()


class IncompleteDetails(Struct):
    reason: Literal["max_output_tokens"]


class ResponseError(Struct):
    """`code` is one of OpenAI's response error codes; `type` and `param` are ours."""

    code: Literal["server_error", "rate_limit_exceeded", "invalid_prompt"]
    message: str
    type: str
    param: str | None = None


class ResponseObject(Struct, tag_field="object", tag="response"):
    """The response, with what the request set echoed as OpenAI echoes it.  `store` is always
    false: airgate keeps nothing to retrieve."""

    id: str
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    model: str
    output: list[OutputItem]
    usage: ResponseUsage | None
    error: ResponseError | None
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    max_output_tokens: int | None
    temperature: float
    top_p: float
    tools: list[FunctionTool]
    tool_choice: ToolChoice
    parallel_tool_calls: bool
    text: TextConfig
    metadata: dict[str, str]
    truncation: Literal["auto", "disabled"]
    store: bool = False
    background: bool = False
    previous_response_id: None = None
    reasoning: None = None
    user: str | None = None


# ---- streamed events (every one numbered in order: `sequence_number`) -------------------------


class _Event(Struct, tag_field="type", kw_only=True):
    sequence_number: int


class ResponseCreated(_Event, tag="response.created"):
    response: ResponseObject


class ResponseInProgress(_Event, tag="response.in_progress"):
    response: ResponseObject


class ResponseCompleted(_Event, tag="response.completed"):
    response: ResponseObject


class ResponseIncomplete(_Event, tag="response.incomplete"):
    response: ResponseObject


class ResponseFailed(_Event, tag="response.failed"):
    response: ResponseObject


class OutputItemAdded(_Event, tag="response.output_item.added"):
    output_index: int
    item: OutputItem


class OutputItemDone(_Event, tag="response.output_item.done"):
    output_index: int
    item: OutputItem


class ContentPartAdded(_Event, tag="response.content_part.added"):
    item_id: str
    output_index: int
    content_index: int
    part: OutputText


class ContentPartDone(_Event, tag="response.content_part.done"):
    item_id: str
    output_index: int
    content_index: int
    part: OutputText


class OutputTextDelta(_Event, tag="response.output_text.delta"):
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any] = []


class OutputTextDone(_Event, tag="response.output_text.done"):
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any] = []


class FunctionCallArgumentsDelta(_Event, tag="response.function_call_arguments.delta"):
    item_id: str
    output_index: int
    delta: str


class FunctionCallArgumentsDone(_Event, tag="response.function_call_arguments.done"):
    item_id: str
    output_index: int
    arguments: str


class ErrorEvent(_Event, tag="error"):
    code: str | None
    message: str
    param: str | None


StreamEvent = (
    ResponseCreated
    | ResponseInProgress
    | ResponseCompleted
    | ResponseIncomplete
    | ResponseFailed
    | OutputItemAdded
    | OutputItemDone
    | ContentPartAdded
    | ContentPartDone
    | OutputTextDelta
    | OutputTextDone
    | FunctionCallArgumentsDelta
    | FunctionCallArgumentsDone
    | ErrorEvent
)
