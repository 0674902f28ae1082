"""llama.cpp engine (GGUF, CPUs and laptops) with continuous batching."""

from .engine import LlamaCppEngine, LlamaCppOptions, available_cores

__all__ = ["LlamaCppEngine", "LlamaCppOptions", "available_cores"]
