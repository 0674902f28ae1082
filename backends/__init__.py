"""Inference engines behind one small interface (`types.Engine`).

Knows nothing of HTTP, auth or audit.  Engines: `llamacpp` (GGUF on CPUs, continuous batching)
and `echo` (zero-cost, for measuring the HTTP path only).  vLLM lands with its own issue.
"""

from .errors import (
    ContextLengthExceeded,
    EngineError,
    EngineFailure,
    EngineNotReady,
    EngineOverloaded,
    InvalidGenerationRequest,
)
from .types import (
    ChatMessage,
    Engine,
    EngineLoad,
    GenerationDelta,
    GenerationHandle,
    GenerationRequest,
    SamplingParams,
    TokenLogprob,
    Usage,
)

__all__ = [
    "ChatMessage",
    "ContextLengthExceeded",
    "Engine",
    "EngineError",
    "EngineFailure",
    "EngineLoad",
    "EngineNotReady",
    "EngineOverloaded",
    "GenerationDelta",
    "GenerationHandle",
    "GenerationRequest",
    "InvalidGenerationRequest",
    "SamplingParams",
    "TokenLogprob",
    "Usage",
]
