"""llama.cpp engines (GGUF, CPUs and laptops): generation with continuous batching, and
embeddings with inputs packed across requests; `bert_gguf` converts sentence-transformers BERT
models to GGUF."""

from .embedder import LlamaCppEmbedder, LlamaCppEmbedderOptions
from .engine import LlamaCppEngine, LlamaCppOptions, available_cores

__all__ = [
    "LlamaCppEmbedder",
    "LlamaCppEmbedderOptions",
    "LlamaCppEngine",
    "LlamaCppOptions",
    "available_cores",
]
