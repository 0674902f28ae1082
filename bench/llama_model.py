"""A Llama with random weights and a trained BPE tokenizer, generated in seconds: no download.

``make_llama(directory)`` writes a Hugging Face model directory (config, float32 safetensors,
generation config, tokenizer with a chat template) that vLLM and transformers both load. The
same seed and shape give the same bytes in every file. Its defaults are the tiny model of the
engine tests (the ``tiny_llama`` fixture); ``bench_model`` builds the bigger one the vLLM benchmark
serves, once, into the bench cache.

The tokenizer is trained on sentences made of the word lists below (``WORDS``): text made of
those words tokenises to about one token per word, which is how the benchmark sizes its prompts.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "BENCH_SHAPE",
    "CHAT_TEMPLATE",
    "CONTROL_TOKENS",
    "SPECIAL_TOKENS",
    "WORDS",
    "LlamaShape",
    "bench_model",
    "bench_model_dir",
    "make_llama",
]

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]
CONTROL_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]

# Role markers are special tokens; "developer" speaks as the system.  Newlines sit next to the
# markers, so tokenising message content on its own gives the same ids as the whole text.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "<|{{ 'system' if m['role'] == 'developer' else m['role'] }}|>\n"
    "{{ m['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# vLLM's CPU attention runs these head sizes only (REFERENCE.md).
_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def _words(text: str) -> list[str]:
    return text.split()


_NOUNS = _words(
    "river city garden market teacher engine window harbor letter station forest doctor "
    "village bridge kitchen summer winter morning evening mountain valley island farmer "
    "painter story song table road house school report budget council"
)
_VERBS = _words(
    "builds finds carries opens watches writes reads sends keeps follows answers brings "
    "moves paints closes visits remembers counts checks"
)
_ADJECTIVES = _words(
    "quiet bright old small green early late careful quick heavy simple open busy warm cold"
)
_OTHER = _words("the a and then because when after before while near under over with from")
WORDS: tuple[str, ...] = (*_NOUNS, *_VERBS, *_ADJECTIVES, *_OTHER)


def _corpus(rng: random.Random, n_sentences: int = 900) -> list[str]:
    lines = []
    for _ in range(n_sentences):
        words = []
        for _ in range(rng.randint(2, 4)):
            words += [
                rng.choice(_OTHER),
                rng.choice(_ADJECTIVES),
                rng.choice(_NOUNS),
                rng.choice(_VERBS),
            ]
        sentence = " ".join(words)
        lines.append(sentence[0].upper() + sentence[1:] + rng.choice([".", "!", "?", ","]))
    # Digits and punctuation so numbers and code-ish text get merges too.
    lines += [
        f"Item {rng.randint(0, 9999)}: {rng.randint(0, 99)}% of {rng.choice(_NOUNS)}s"
        for _ in range(200)
    ]
    return lines


# The byte-level alphabet of printable ASCII, tab and newline (GPT-2 maps the bytes that are not
# printable to U+0100 + byte).  Every token is then whole UTF-8, so streamed text and decoded text
# compare exactly; text outside ASCII is not needed by the tests (it encodes to nothing).
_ASCII = [chr(b) for b in range(0x21, 0x7F)] + [chr(0x100 + b) for b in (0x09, 0x0A, 0x20)]


def _tokenizer(seed: int, max_length: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=768,
        special_tokens=SPECIAL_TOKENS + CONTROL_TOKENS,
        initial_alphabet=_ASCII,
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(random.Random(seed)), trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=max_length,
    )


def make_llama(
    directory: Path,
    *,
    seed: int = 0,
    hidden_size: int = 128,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate_size: int = 256,
    max_positions: int = 1024,
) -> Path:
    """Write the model into ``directory`` (created if needed) and return it.

    The defaults make the engine tests' tiny model (head_dim 32: the smallest vLLM's CPU
    attention runs). Raises ValueError for a shape vLLM cannot serve on CPUs.
    """
    if hidden_size % heads or heads % kv_heads:
        raise ValueError("hidden_size must divide by heads, and heads by kv_heads")
    if hidden_size // heads not in _CPU_HEAD_SIZES:
        raise ValueError(
            f"head_dim {hidden_size // heads} is not one vLLM's CPU attention runs "
            f"({', '.join(map(str, _CPU_HEAD_SIZES))})"
        )
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(seed, max_positions)
    vocab = len(tokenizer)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        # Weights ten times the usual scale: logits spread wide enough that greedy decoding
        # has clear winners, so vLLM and transformers agree token for token.
        initializer_range=0.2,
        rms_norm_eps=1e-6,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory


@dataclass(frozen=True, slots=True, kw_only=True)
class LlamaShape:
    """The parameters of ``make_llama`` that decide a model's size, and the cache name they make."""

    hidden_size: int
    layers: int
    heads: int
    kv_heads: int
    intermediate_size: int
    max_positions: int

    def name(self, seed: int) -> str:
        return (
            f"llama-h{self.hidden_size}-l{self.layers}-a{self.heads}-kv{self.kv_heads}"
            f"-i{self.intermediate_size}-p{self.max_positions}-s{seed}"
        )

    def describe(self) -> str:
        return (
            f"hidden {self.hidden_size}, {self.layers} layers, {self.heads} heads "
            f"({self.kv_heads} KV heads, head_dim {self.hidden_size // self.heads}), "
            f"intermediate {self.intermediate_size}"
        )


# Big enough that a decode step is the model's work, not Python overhead: ~26 M parameters
# (~100 MB of float32 weights), head_dim 64.
BENCH_SHAPE = LlamaShape(
    hidden_size=512, layers=8, heads=8, kv_heads=4, intermediate_size=1408, max_positions=1024
)


def bench_model_dir(cache_dir: Path, shape: LlamaShape = BENCH_SHAPE, *, seed: int = 0) -> Path:
    """Where ``bench_model`` keeps the model of ``shape``."""
    return cache_dir / "model" / shape.name(seed)


def bench_model(cache_dir: Path, shape: LlamaShape = BENCH_SHAPE, *, seed: int = 0) -> Path:
    """The model of ``shape`` under ``cache_dir/model/``, generated on first use.

    Generated into a temporary directory and renamed into place, so an interrupted run never
    leaves a half-written model behind to be served later.
    """
    target = bench_model_dir(cache_dir, shape, seed=seed)
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        make_llama(
            tmp,
            seed=seed,
            hidden_size=shape.hidden_size,
            layers=shape.layers,
            heads=shape.heads,
            kv_heads=shape.kv_heads,
            intermediate_size=shape.intermediate_size,
            max_positions=shape.max_positions,
        )
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
