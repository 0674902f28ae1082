"""What a protocol adapter hands the pipeline, and what the pipeline learns on the way.

An adapter (OpenAI today, Ollama tomorrow) decodes its wire format into one `InferenceRequest`:
who asks (the principal, passed explicitly), for which model, what to do, how large the prompt
is, and a protocol-neutral `Generation` (inputs, sampling, stop strings, logprobs).  The engine
request is built from it only once policy has decided (the cap, the tenant's cache salt, the
priority), never rebuilt.

`Progress` is the one record of what happened to a request (deployment, tokens, TTFT, finish,
error): written by the pipeline only, read by its audit events and trace span, and copied once,
when the request is over, into the request's log line.
"""

from __future__ import annotations

from typing import Literal, Protocol

import msgspec

from backends.tool_calls import CallMode
from backends.types import ChatMessage, OutputConstraint, SamplingParams, ToolDefinition
from policies import Action  # the audited action: what the client asked for

from ..access.auth import Principal

__all__ = [
    "Action",
    "EmbeddingInputs",
    "Generation",
    "InferenceRequest",
    "OutputKind",
    "Progress",
    "RawPrompt",
    "Record",
]

# What the output must be: free text, any JSON object, or JSON valid against a schema.
OutputKind = Literal["text", "json_object", "json_schema"]
# One raw prompt: text (special tokens parsed, as completions expect) or token ids.
RawPrompt = str | tuple[int, ...]


class Generation(msgspec.Struct, frozen=True, kw_only=True):
    """What to generate, whatever the protocol: a conversation, or raw prompts (one sequence
    each), with the sampling they share.  `max_tokens` is what the client asked (None: the
    policy's cap, decided later)."""

    messages: tuple[ChatMessage, ...] | None = None
    prompts: tuple[RawPrompt, ...] = ()
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    sampling: SamplingParams = SamplingParams()
    logprobs: int | None = None
    echo_prompt: bool = False
    # Tools the model may call (rendered into the prompt; their calls are parsed out of the
    # text), and the constraint the engine enforces while sampling (structured output, or the
    # shape of tool calls).  `output` and `tools_offered` are what the audit log counts.
    tools: tuple[ToolDefinition, ...] = ()
    constraint: OutputConstraint | None = None
    tool_calls: CallMode | None = None  # where calls are read from the text (None: nowhere)
    output: OutputKind = "text"
    tools_offered: int = 0

    @property
    def sequences(self) -> int:
        return 1 if self.messages is not None else len(self.prompts)


class EmbeddingInputs(msgspec.Struct, frozen=True, kw_only=True):
    """What an embeddings request embeds: texts or token ids (checked non-empty by the
    adapter), and the length of the vectors it wants (None: the model's)."""

    inputs: tuple[RawPrompt, ...]
    dimensions: int | None = None


class InferenceRequest(msgspec.Struct, frozen=True, kw_only=True):
    """The typed facts of one inference request, decoded by a protocol adapter: a generation
    (chat, completions, responses) or, for `action` "embeddings", `embedding`."""

    request_id: str
    principal: Principal
    action: Action
    route: str  # the route template (never the raw path)
    model: str  # as the client named it (an id or an alias)
    prompt_bytes: int  # the request body's size: policy caps it, the limiter reserves by it
    stream: bool
    generation: Generation
    # The sampling parameters the client sent (numbers and flags only), for the audit log and
    # the trace span; a parameter left out is absent.
    sampling: dict[str, bool | int | float]
    prompt_param: str  # the request field a context-length error names
    n: int = 1
    traceparent: str | None = None  # the caller's W3C trace context, to join its trace
    embedding: EmbeddingInputs | None = None


class Progress:
    """What the pipeline learns about one request as it runs (metadata only, never text)."""

    __slots__ = (
        "attempts",
        "completion_tokens",
        "deployment",
        "error_code",
        "finish_reason",
        "model",
        "prompt_tokens",
        "route_reason",
        "stream",
        "tool_calls",
        "ttft_s",
    )

    def __init__(self, model: str, stream: bool) -> None:
        self.model = model
        self.stream = stream
        self.deployment: str | None = None  # where the router sent it (the last attempt)
        self.route_reason: str | None = None
        self.attempts = 0
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.finish_reason: str | None = None
        self.ttft_s: float | None = None
        self.tool_calls: int | None = None  # calls read out of the output (tools offered)
        self.error_code: str | None = None


class Record(Protocol):
    """The request's log record, as the pipeline sees it: when the request arrived, and a
    place for its `Progress` (set once; the log line reads it when the exchange is over)."""

    started: float  # time.perf_counter() at arrival
    progress: Progress | None
