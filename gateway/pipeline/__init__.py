"""The protocol-neutral inference pipeline: request facts in, engine events out.

    facts       InferenceRequest (what an adapter decoded), Generation, Progress
    admission   policy decision -> limits -> `inference.admitted`
    completion  `inference.completed` (or failed, cancelled) and the limiter refund, once
    attempts    route, submit, retry once before the first token, deltas and their metrics
    run         Pipeline.start() and Inference.result() / .stream(): the line, end to end
    embedding   Pipeline.embed(): the same line for embeddings (one engine call, no stream)
    outputs     tools, tool choice and output format -> output facts (every adapter's shape())

Adapters (gateway/openai, gateway/ollama) import this package; it never imports them.
"""

from .embedding import Embedded
from .facts import (
    Action,
    EmbeddingInputs,
    Generation,
    InferenceRequest,
    OutputKind,
    Progress,
    RawPrompt,
    Record,
)
from .run import Inference, Pipeline, StreamEncoder

__all__ = [
    "Action",
    "Embedded",
    "EmbeddingInputs",
    "Generation",
    "Inference",
    "InferenceRequest",
    "OutputKind",
    "Pipeline",
    "Progress",
    "RawPrompt",
    "Record",
    "StreamEncoder",
]
