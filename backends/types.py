"""Engine-facing request and result types.

The gateway translates OpenAI wire types into these once, at the edge; engines never see HTTP
or wire types.  Everything here is a frozen msgspec Struct (cheap to build, safe to share across
the engine thread).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal, Protocol

import msgspec
import numpy as np
import numpy.typing as npt

__all__ = [
    "ChatMessage",
    "EmbeddingRequest",
    "EmbeddingResult",
    "Engine",
    "EngineLoad",
    "FinishReason",
    "GenerationDelta",
    "GenerationHandle",
    "GenerationRequest",
    "MessageToolCall",
    "ModelSource",
    "OutputConstraint",
    "SamplingParams",
    "Task",
    "TokenLogprob",
    "ToolCallPiece",
    "ToolDefinition",
    "Usage",
]

FinishReason = Literal["stop", "length", "abort", "tool_calls"]
# What a deployment's engine does: generate text (chat, completions) or embed inputs.
Task = Literal["generate", "embed"]


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    """Per-request sampling.  Defaults disable every transform (plain softmax sampling)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    seed: int | None = None  # None: a fresh random seed per request
    repetition_penalty: float = 1.0  # 1.0: off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


class MessageToolCall(msgspec.Struct, frozen=True):
    """A tool call an assistant made earlier in the conversation."""

    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it


class ChatMessage(msgspec.Struct, frozen=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str
    tool_calls: tuple[MessageToolCall, ...] = ()  # assistant messages only
    tool_call_id: str | None = None  # tool messages only: the call this result answers


class ToolDefinition(msgspec.Struct, frozen=True):
    """A function the model may call: its parameters are a checked JSON schema (canonical
    JSON text, see `backends.structured`)."""

    name: str
    description: str
    parameters: str


class OutputConstraint(msgspec.Struct, frozen=True):
    """What the generated text must be, enforced while sampling (constrained decoding).

    `schema` is canonical JSON-schema text (`backends.structured.check_schema`).  Without a
    `trigger` the whole output is one JSON value valid against it; with one, the output is free
    text that may end with `trigger` followed by such a value (tool_choice "auto").
    """

    schema: str
    trigger: str | None = None
    param: str = "response_format"  # the request field an error about the schema names


class GenerationRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One sequence to generate.  Exactly one of `prompt`, `prompt_tokens`, `messages` is set.

    `prompt` is raw text: control tokens spelled in it (`<start_of_turn>`) are parsed as the
    completions API expects, or, with `parse_special` false, tokenised as plain text;
    `messages` is a conversation the engine formats with its chat template, where message
    content can never produce control tokens.
    """

    request_id: str
    prompt: str | None = None
    parse_special: bool = True  # `prompt` only (the policy's raw_prompt_special_tokens)
    prompt_tokens: tuple[int, ...] | None = None
    messages: tuple[ChatMessage, ...] | None = None
    max_tokens: int | None = None  # None: up to the end of the slot's context
    # True: `max_tokens` is a ceiling (the policy's cap, the client asked for no length), so the
    # completion may use what remains of the context up to it instead of being refused.
    fit_to_context: bool = False
    stop: tuple[str, ...] = ()
    sampling: SamplingParams = SamplingParams()
    logprobs: int | None = None  # None: off; N >= 0: chosen token plus N alternatives
    echo_prompt: bool = False  # also return the prompt's text (and logprobs when asked)
    # Isolates prefix-cache entries: requests share cached prefixes only when their salts are
    # equal.  Set by the gateway per tenant, never by a caller (a tenant could otherwise time
    # another's prompts out of the cache).  Engines without a shared prefix cache ignore it.
    cache_salt: str | None = None
    # Scheduling priority where the engine supports it (lower runs earlier; 0 is the default).
    priority: int = 0
    tools: tuple[ToolDefinition, ...] = ()  # rendered into the prompt (backends.tool_calls)
    constraint: OutputConstraint | None = None
    # Independent completions of the one prompt (choices): the prompt is prefilled once and
    # shared; each choice samples on its own (with a seed, choice i uses seed + i).  Deltas
    # carry their choice's `index`.
    n: int = 1


class TokenLogprob(msgspec.Struct, frozen=True, array_like=True):
    token_id: int
    text: bytes
    logprob: float | None  # None for the first prompt token (nothing predicts it)
    top: tuple[tuple[int, bytes, float], ...] = ()


class Usage(msgspec.Struct, frozen=True):
    prompt_tokens: int
    completion_tokens: int


class ToolCallPiece(msgspec.Struct, frozen=True):
    """A piece of a tool call, as it streams: the first piece of call `index` carries its `id`
    and `name` (and no arguments), the next ones pieces of its JSON arguments."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None


class GenerationDelta(msgspec.Struct, frozen=True, kw_only=True):
    """A step of output.  `text` is safe to send: complete UTF-8, never part of a stop string.

    `index` is the choice (0 <= index < request.n) the delta belongs to; each choice ends with
    its own delta carrying `finish_reason` and `usage` (its completion tokens; the prompt's
    tokens are counted once, on choice 0's usage, and 0 on the others).

    `tool_calls` is never set by an engine: the gateway's tool-call parsing moves a call out of
    `text` into pieces (`backends.tool_calls.ToolCallParser`).
    """

    text: str = ""
    n_tokens: int = 0
    logprobs: tuple[TokenLogprob, ...] = ()
    finish_reason: FinishReason | None = None
    usage: Usage | None = None  # set on the final delta only
    prompt_text: str | None = None  # set on the first delta when echo_prompt was asked
    prompt_logprobs: tuple[TokenLogprob, ...] = ()
    tool_calls: tuple[ToolCallPiece, ...] = ()
    index: int = 0


class EmbeddingRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Inputs to embed in one call: text (tokenised as plain text: special tokens in it are
    NOT parsed) or token ids.  The engine embeds them in as few decodes as it can."""

    request_id: str
    inputs: tuple[str | tuple[int, ...], ...]
    # Keep the first `dimensions` components, then re-normalise (only where the engine says
    # `truncatable`; the gateway refuses it elsewhere).  None: the model's full size.
    dimensions: int | None = None
    priority: int = 0


class EmbeddingResult(msgspec.Struct, frozen=True):
    """One L2-normalised float32 vector per input (row i embeds input i), and the number of
    tokens each input took (special tokens the model adds included)."""

    vectors: npt.NDArray[np.float32]  # shape (len(inputs), dimensions)
    prompt_tokens: tuple[int, ...]


class EngineLoad(msgspec.Struct, frozen=True):
    running: int
    waiting: int
    capacity: int  # sequence slots that run concurrently
    max_waiting: int
    kv_usage: float  # 0..1


class GenerationHandle(Protocol):
    """A submitted request: iterate for deltas; cancel() frees its slot at the next step."""

    @property
    def prompt_tokens(self) -> int: ...

    def __aiter__(self) -> AsyncIterator[GenerationDelta]: ...

    def cancel(self) -> None: ...


class ModelSource(Protocol):
    """Where an engine finds its weights when it starts.

    A plain path needs no source; a source exists for weights that only live in memory (a
    decrypted bundle): the engine calls `open()` in its loading thread, loads, then `release()`
    whether loading worked or not, so temporary plaintext lives no longer than the load.
    """

    def open(self) -> str:
        """Blocking: a path the engine can read now (a file, /proc/self/fd/N or a directory)."""
        ...

    def release(self) -> None:
        """Drop whatever `open()` made; the loaded engine keeps its own mapping."""
        ...


class Engine(Protocol):
    """An inference engine running in this process: it generates (`submit`) or embeds
    (`embed`), as its `task` says; the other method raises InvalidGenerationRequest."""

    name: str  # engine kind: "llama.cpp", "vllm", "echo"
    task: Task

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def submit(self, request: GenerationRequest) -> GenerationHandle:
        """Validate and enqueue; raises ContextLengthExceeded / EngineOverloaded at once."""
        ...

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult:
        """Embed every input; raises ContextLengthExceeded (with `index`) for an input longer
        than the context, InvalidGenerationRequest for a token id outside the vocabulary,
        EngineOverloaded when the queue is full."""
        ...

    def load(self) -> EngineLoad: ...

    @property
    def context_length(self) -> int: ...

    @property
    def embedding_size(self) -> int | None:
        """The length of the vectors `embed` returns (None for a generating engine)."""
        ...

    @property
    def truncatable(self) -> bool:
        """Whether shorter vectors (`dimensions`) keep their meaning (Matryoshka-trained)."""
        ...
