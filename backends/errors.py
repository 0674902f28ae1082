"""Errors raised by inference engines.

    EngineError                    base; the gateway maps each subclass to an HTTP answer
    ├── EngineOverloaded           the engine's wait queue is full (retry later)
    ├── ContextLengthExceeded      prompt + max_tokens do not fit a sequence slot
    ├── InvalidGenerationRequest   a request the engine cannot run (bad token id, template)
    ├── EngineNotReady             generate() before start() or after stop()
    └── EngineFailure              llama.cpp / vLLM failed while generating

Messages never contain prompt or completion text: they are shown to clients and logged.
"""

from __future__ import annotations

__all__ = [
    "ContextLengthExceeded",
    "EngineError",
    "EngineFailure",
    "EngineNotReady",
    "EngineOverloaded",
    "InvalidGenerationRequest",
]


class EngineError(Exception):
    """Base of every engine error."""


class EngineOverloaded(EngineError):
    """The engine's bounded wait queue is full."""

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ContextLengthExceeded(EngineError):
    """The prompt plus the requested completion does not fit the slot's context.

    The message is OpenAI's own wording, word for word up to the numbers: clients recognise a
    context overflow by it (litellm maps a 400 to ContextWindowExceededError only when it reads
    "This model's maximum context length is").  OpenAI names the prompt "the messages" on chat
    and "the prompt" on legacy completions; the engine cannot tell which endpoint asked, so
    `str(exc)` says "prompt" and the gateway renders `message(<its prompt field>)`.  A prompt
    that alone fills the context is counted with the one token a completion needs at least.
    """

    def __init__(
        self,
        *,
        prompt_tokens: int,
        max_tokens: int,
        context_length: int,
        index: int | None = None,
    ) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.context_length = context_length
        self.index = index  # embeddings: which input is too long
        super().__init__(self.message("prompt"))

    def message(self, prompt_field: str) -> str:
        """OpenAI's message, naming the prompt as the endpoint's field ("messages", "prompt");
        for an embedding input, the input by its index."""
        if self.index is not None:
            return (
                f"This model's maximum context length is {self.context_length} tokens, however "
                f"{prompt_field}[{self.index}] has {self.prompt_tokens} tokens. Please reduce "
                "the length of the input."
            )
        return (
            f"This model's maximum context length is {self.context_length} tokens. However, you "
            f"requested {self.prompt_tokens + self.max_tokens} tokens ({self.prompt_tokens} in "
            f"the {prompt_field}, {self.max_tokens} in the completion). Please reduce the length "
            f"of the {prompt_field} or completion."
        )


class InvalidGenerationRequest(EngineError):
    """The engine cannot run this request as given (the client's mistake)."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class EngineNotReady(EngineError):
    """The engine is not started, or is shutting down."""


class EngineFailure(EngineError):
    """The engine itself failed; the request cannot complete."""
