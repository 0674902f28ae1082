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
    """The prompt plus the requested completion does not fit the slot's context."""

    def __init__(self, *, prompt_tokens: int, max_tokens: int, context_length: int) -> None:
        super().__init__(
            f"This model's context length is {context_length} tokens per request, but "
            f"{prompt_tokens + max_tokens} were requested ({prompt_tokens} in the prompt, "
            f"{max_tokens} for the completion). Shorten the prompt or lower max_tokens."
        )
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.context_length = context_length


class InvalidGenerationRequest(EngineError):
    """The engine cannot run this request as given (the client's mistake)."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class EngineNotReady(EngineError):
    """The engine is not started, or is shutting down."""


class EngineFailure(EngineError):
    """The engine itself failed; the request cannot complete."""
