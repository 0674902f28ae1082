"""vLLM engines (safetensors models, GPUs or the vLLM CPU build) through `AsyncLLM`: `VllmEngine`
generates, `VllmEmbedder` embeds.

Importing this package does not import vLLM or torch (an optional extra): `start()` does.
"""

from ._options import VllmOptions
from .embedder import VllmEmbedder
from .engine import VllmEngine

__all__ = ["VllmEmbedder", "VllmEngine", "VllmOptions"]
