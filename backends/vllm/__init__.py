"""vLLM engine (safetensors models, GPUs or the vLLM CPU build) through `AsyncLLM`.

Importing this package does not import vLLM or torch (an optional extra): `start()` does.
"""

from .engine import VllmEngine, VllmOptions

__all__ = ["VllmEngine", "VllmOptions"]
