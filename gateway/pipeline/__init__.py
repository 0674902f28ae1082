"""The protocol-neutral inference pipeline: request facts in, engine events out.

    facts       InferenceRequest (what an adapter decoded), Generation, Progress
    admission   policy decision -> limits -> `inference.admitted`
    completion  `inference.completed` (or failed, cancelled) and the limiter refund, once
    attempts    route, submit, retry once before the first token, deltas and their metrics
    run         Pipeline.start() and Inference.result() / .stream(): the line, end to end

Adapters (gateway/openai, later gateway/ollama) import this package; it never imports them.
"""

from .facts import Action, Generation, InferenceRequest, OutputKind, Progress, RawPrompt, Record
from .run import Inference, Pipeline, StreamEncoder

__all__ = [
    "Action",
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
