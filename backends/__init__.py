"""Inference engines behind one small interface (`types.Engine`).

Knows nothing of HTTP, auth or audit.  Engines: `vllm` (safetensors on GPUs or the vLLM CPU
build, in process through `AsyncLLM`; importing it does not import vLLM or torch), `llamacpp`
(GGUF on CPUs and laptops, continuous batching) and `echo` (zero-cost, for measuring the HTTP
path only).
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
