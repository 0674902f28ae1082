"""`VllmOptions`: how a vLLM engine (generating or embedding) is started and bounded."""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["VllmOptions"]


class VllmOptions(msgspec.Struct, frozen=True, kw_only=True):
    # "auto": the checkpoint's dtype, except that vLLM runs float32 checkpoints in 16 bits
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = "auto"
    max_model_len: int | None = None  # None: the model's own (max_position_embeddings)
    gpu_memory_utilization: float = 0.9  # on CPUs: the share of RAM vLLM may reserve
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    # "mp": worker processes on this node; "ray": Ray places them; None: vLLM chooses ("mp"
    # for several workers on one node)
    distributed_executor_backend: Literal["mp", "ray"] | None = None
    enforce_eager: bool = False  # True: no torch.compile (much faster start, slower steps)
    # KV-cache size in GiB; None: from gpu_memory_utilization.  Passed as the engine argument
    # `kv_cache_memory_bytes`, which vLLM's CPU worker honours (VLLM_CPU_KVCACHE_SPACE, whole
    # GiB only and process-wide, still overrides it when an operator sets it).
    kv_cache_space_gib: float | None = None
    max_num_seqs: int = 16  # sequences that run concurrently: the engine's capacity
    max_waiting: int = 64  # beyond capacity + max_waiting, submit() raises EngineOverloaded
    chat_template: str | None = None  # Jinja or a builtin name; None: the tokenizer's own
    seed: int = 0
    enable_prefix_caching: bool = True
