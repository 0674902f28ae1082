"""A tiny Llama with random weights and a trained BPE tokenizer, built in seconds for engine tests.

`make_tiny_llama(directory)` writes a Hugging Face model directory (config, float32 safetensors,
generation config, tokenizer with a chat template) that vLLM and transformers both load.  The
same seed gives the same bytes in every file.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

__all__ = ["CHAT_TEMPLATE", "CONTROL_TOKENS", "make_tiny_llama"]

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


def _tokenizer(seed: int) -> Any:
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
        model_max_length=1024,
    )


def make_tiny_llama(directory: Path, *, seed: int = 0) -> Path:
    """Write the model into `directory` (created if needed) and return it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(seed)
    vocab = len(tokenizer)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,  # head_dim 32: the smallest vLLM's CPU attention runs
        num_key_value_heads=2,
        max_position_embeddings=1024,
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
