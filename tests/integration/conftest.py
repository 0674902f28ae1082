from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backends.llamacpp import LlamaCppEngine, LlamaCppOptions
from backends.vllm import VllmEmbedder, VllmEngine, VllmOptions

VLLM_OPTIONS = VllmOptions(
    max_num_seqs=8,
    max_waiting=4,
    enforce_eager=True,
    kv_cache_space_gib=0.0625,
    dtype="float32",  # vLLM's "auto" runs float32 checkpoints in bfloat16 on CPUs
)


@pytest.fixture(scope="session")
async def engine(gguf_path: Path) -> AsyncIterator[LlamaCppEngine]:
    """The real llama.cpp engine on the real Gemma GGUF: 4 slots, a small batch so that
    prompts longer than 128 tokens are prefilled in several steps."""
    eng = LlamaCppEngine(
        str(gguf_path),
        LlamaCppOptions(slots=4, context_length=1024, batch_size=128, max_waiting=4, n_threads=2),
    )
    await eng.start()
    yield eng
    await eng.stop()


@pytest.fixture(scope="session")
async def vllm_engine(tiny_llama: Path) -> AsyncIterator[VllmEngine]:
    """One started vLLM engine for the session (its start is the slow part): 8 sequences,
    4 waiting, eager mode (no compile), on the tiny random-weight Llama."""
    eng = VllmEngine(str(tiny_llama), VLLM_OPTIONS)
    await eng.start()
    yield eng
    await eng.stop()


@pytest.fixture(scope="session")
async def vllm_embedder(minilm_dir: Path) -> AsyncIterator[VllmEmbedder]:
    """One started vLLM embedder for the session on all-MiniLM-L6-v2: 8 inputs a step, 8
    waiting, eager mode, a small KV-cache reservation (a 22M-parameter encoder needs little)."""
    eng = VllmEmbedder(
        str(minilm_dir),
        VllmOptions(
            max_num_seqs=8,
            max_waiting=8,
            enforce_eager=True,
            kv_cache_space_gib=0.0625,
            dtype="float32",
        ),
    )
    await eng.start()
    yield eng
    await eng.stop()
