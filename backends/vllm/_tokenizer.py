"""The model's tokenizer, held in memory: prompts are tokenised here, never by vLLM.

Loaded from the model directory while it exists (a decrypted bundle's directory is removed once
the engine has loaded).  Five encodings are needed:

- a completion prompt: special-token text is parsed (or, when the policy says so, is plain
  text), BOS added as the tokenizer does (once);
- chat-template text: special-token text parsed, nothing added (the template writes BOS);
- message content: special-token text is plain text, so a user who types `<|end|>` gets those
  characters, never the control token (prompt-format injection);
- an input to embed: plain text, with the special tokens the model adds (`[CLS] … [SEP]`);
- and, for SentencePiece-style tokenizers that prefix a word marker to the start of the input,
  segments after the first must not get that prefix again.

A tokenizer.json may ask for truncation and padding (sentence-transformers' all-MiniLM-L6-v2
truncates to 128 tokens and pads to 128): both are switched off, so that a long input is
counted (and refused) rather than silently cut.

Each variant is its own Rust `tokenizers.Tokenizer`, so encoding is thread-safe (no shared flag
is flipped per call).
"""

from __future__ import annotations

import copy
import json
import re
from functools import cache
from typing import Any

__all__ = ["Tokenizer"]

_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


class Tokenizer:
    """Encodes prompts and names token bytes.  Build with `Tokenizer.load(directory)`."""

    def __init__(self, hf: Any) -> None:
        backend = getattr(hf, "backend_tokenizer", None)
        if backend is None:
            raise ValueError("the vLLM engine needs a fast tokenizer (a tokenizer.json)")
        from tokenizers import Tokenizer as RustTokenizer

        spec = json.loads(backend.to_str())
        rest = _without_start_prefix(spec)
        self._special_first = RustTokenizer.from_str(json.dumps(spec))
        self._special_rest = (
            RustTokenizer.from_str(json.dumps(rest)) if rest is not None else self._special_first
        )
        self._plain_first = RustTokenizer.from_str(json.dumps(spec))
        self._plain_rest = (
            RustTokenizer.from_str(json.dumps(rest)) if rest is not None else self._plain_first
        )
        for tok in (self._plain_first, self._plain_rest):
            tok.encode_special_tokens = True
        for tok in (self._special_first, self._special_rest, self._plain_first, self._plain_rest):
            tok.no_truncation()
            tok.no_padding()
        self.bos_token: str = hf.bos_token or ""
        self.eos_token: str = hf.eos_token or ""
        self.bos_id: int | None = hf.bos_token_id
        self.n_vocab: int = len(hf)
        self.chat_template: str | None = _default_template(hf.chat_template)
        self._adds_bos = self.bos_id is not None and self._special_first.encode(
            "", add_special_tokens=True
        ).ids[:1] == [self.bos_id]
        added = {i: t.content for i, t in hf.added_tokens_decoder.items()}
        self._pieces = _token_bytes(spec, self._plain_first, added)

    @classmethod
    def load(cls, directory: str) -> Tokenizer:
        """Blocking: read the tokenizer files in `directory` (local only, no remote code)."""
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(
            directory, local_files_only=True, trust_remote_code=False, use_fast=True
        )
        return cls(hf)

    def encode_prompt(self, text: str, *, parse_special: bool = True) -> list[int]:
        """A completion prompt: special tokens parsed (`parse_special`) or plain text, BOS added
        as the tokenizer does.

        A prompt that itself starts with the BOS text gets no second BOS (when parsed).
        """
        if not parse_special:
            plain: list[int] = self._plain_first.encode(text, add_special_tokens=True).ids
            return plain
        ids: list[int] = self._special_first.encode(text, add_special_tokens=True).ids
        if self._adds_bos and ids[1:2] == [self.bos_id]:
            del ids[0]
        return ids

    def encode_segment(self, text: str, *, content: bool, first: bool) -> list[int]:
        """One chat-template segment; `content` segments never produce control tokens."""
        if content:
            tok = self._plain_first if first else self._plain_rest
        else:
            tok = self._special_first if first else self._special_rest
        ids: list[int] = tok.encode(text, add_special_tokens=False).ids
        return ids

    def encode_input(self, text: str) -> list[int]:
        """An input to embed: special-token text is plain text, the model's own special tokens
        are added."""
        ids: list[int] = self._plain_first.encode(text, add_special_tokens=True).ids
        return ids

    def decode(self, ids: list[int]) -> str:
        """Token ids -> text, special tokens kept (the echo of a token prompt)."""
        text: str = self._plain_first.decode(ids, skip_special_tokens=False)
        return text

    def piece(self, token_id: int) -> bytes:
        """The bytes a token stands for (may be part of a UTF-8 sequence)."""
        if 0 <= token_id < len(self._pieces):
            return self._pieces[token_id]
        return b""


def _default_template(template: object) -> str | None:
    if isinstance(template, dict):  # several named templates: the default one
        template = template.get("default")
    return template if isinstance(template, str) and template else None


def _without_start_prefix(spec: dict[str, Any]) -> dict[str, Any] | None:
    """The tokenizer spec without a word-marker prefix at the start of the input, or None when
    it has none (byte-level BPE and most modern tokenizers)."""
    rest = copy.deepcopy(spec)
    changed = False

    def visit(node: Any) -> Any:
        nonlocal changed
        if isinstance(node, dict):
            kind = node.get("type")
            if kind == "Prepend":  # Llama-2-style normaliser: "▁" before every input
                changed = True
                return None
            if kind == "Metaspace" and node.get("prepend_scheme", "always") != "never":
                changed = True
                node = {**node, "prepend_scheme": "never", "add_prefix_space": False}
            if kind == "Sequence":
                for key in ("normalizers", "pretokenizers"):
                    if key in node:
                        items = [visit(item) for item in node[key]]
                        node = {**node, key: [i for i in items if i is not None]}
            return node
        return node

    for key in ("normalizer", "pre_tokenizer"):
        if rest.get(key) is not None:
            rest[key] = visit(rest[key])
    return rest if changed else None


def _decoder_kinds(node: Any) -> set[str]:
    if not isinstance(node, dict):
        return set()
    kinds = {str(node.get("type"))}
    for child in node.get("decoders", ()):
        kinds |= _decoder_kinds(child)
    return kinds


@cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: printable stand-in character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _token_bytes(spec: dict[str, Any], tok: Any, added: dict[int, str]) -> list[bytes]:
    """Every token's bytes, computed once (logprobs name tokens by their bytes)."""
    kinds = _decoder_kinds(spec.get("decoder"))
    size = max(tok.get_vocab_size(with_added_tokens=True), max(added, default=-1) + 1)
    pieces: list[bytes] = []
    byte_level = "ByteLevel" in kinds
    byte_fallback = "ByteFallback" in kinds or "Metaspace" in kinds or "Replace" in kinds
    table = _byte_decoder()
    for i in range(size):
        token = tok.id_to_token(i)
        if byte_fallback and token and _BYTE_TOKEN.fullmatch(token):
            pieces.append(bytes([int(token[3:5], 16)]))  # SentencePiece byte token <0xAB>
        elif i in added:
            pieces.append(added[i].encode())
        elif token is None:
            pieces.append(b"")
        elif byte_level:
            pieces.append(
                bytes(table[c] for c in token) if all(c in table for c in token) else token.encode()
            )
        elif byte_fallback:
            pieces.append(token.replace("\u2581", " ").encode())
        else:
            pieces.append(tok.decode([i], skip_special_tokens=False).encode())
    return pieces
