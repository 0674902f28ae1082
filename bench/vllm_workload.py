"""What the vllm scenario sends: prompts from the generated model's own words, and bodies that run
to ``MAX_TOKENS``.

The model is ``bench.llama_model``'s generated Llama: text made of its ``WORDS`` tokenises to
about one token per word, so ``PROMPT_WORDS`` words make a ~100-token prompt. The end token and
every other special token are banned with a logit bias of -100: every request runs to
``MAX_TOKENS`` and every generated token has text (TTFT is the first).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._client import BenchError, completion_body, synthetic_prompts
from bench.llama_model import CONTROL_TOKENS, SPECIAL_TOKENS, WORDS

__all__ = [
    "LEVELS",
    "MAX_TOKENS",
    "MODEL_ID",
    "banned_tokens",
    "body",
    "make_prompts",
    "requests_at",
]

MODEL_ID = "bench-llama"
MAX_TOKENS = 64
LEVELS = (1, 8, 32)
PROMPT_WORDS = 96  # ~100 tokens with the model's tokenizer, BOS included


def make_prompts(run: int, phase: int, count: int) -> list[str]:
    """Deterministic prompts from the tokenizer's own words (about one token each), distinct
    across runs, phases and requests."""
    return synthetic_prompts(f"vllm/{run}/{phase}", WORDS, PROMPT_WORDS, count)


def requests_at(concurrency: int, quick: bool) -> int:
    """Requests per batch: two waves at full concurrency (one in --quick), at least 8 (2)."""
    return max(2, concurrency) if quick else max(8, 2 * concurrency)


def banned_tokens(model_dir: Path) -> list[int]:
    """Ids of the end token and every other special token of the model's tokenizer."""
    data = json.loads((model_dir / "tokenizer.json").read_text())
    names = set(SPECIAL_TOKENS + CONTROL_TOKENS)
    ids = sorted(t["id"] for t in data.get("added_tokens", []) if t["content"] in names)
    config = json.loads((model_dir / "config.json").read_text())
    if config.get("eos_token_id") not in ids:
        raise BenchError(f"{model_dir}: the end token is not among the special tokens")
    return ids


def body(prompt: str, banned: Sequence[int]) -> dict[str, Any]:
    """The streamed `/v1/completions` body both servers get for ``prompt``."""
    return completion_body(MODEL_ID, prompt, MAX_TOKENS, banned)
