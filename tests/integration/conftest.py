from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backends.llamacpp import LlamaCppEngine, LlamaCppOptions


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
