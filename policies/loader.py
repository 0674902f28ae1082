"""Load policy documents from TOML files into a versioned `PolicySet`.

A policy path is a directory (every `*.toml` in it, sorted by file name; names starting with `.`
are skipped) or one file.  Each file is one `PolicyDocument`, decoded with unknown keys
forbidden; the first error stops loading with a `PolicyError` naming the file and the key.
`version` hashes the parsed documents, not the bytes: comments, whitespace and spelling out a
default do not change it, any change of a value or of the order does.
"""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import msgspec

from .errors import PolicyError
from .types import PolicyDocument, PolicySet

__all__ = [
    "load_default_policy",
    "load_policy_dir",
    "loads_policy",
    "parse_document",
    "policy_files",
    "policy_set",
    "read_document",
]

DEFAULT_POLICY = "default.toml"
_encoder = msgspec.json.Encoder(order="sorted")
_FIELD = re.compile(r"field `(.*)`$")


def _join(key: str, field: str) -> str:
    return f"{key}.{field}" if key else field


def _describe(exc: msgspec.ValidationError) -> tuple[str | None, str]:
    # "Expected `int` >= 1 - at `$.rules[2].max_tokens`" -> ("rules[2].max_tokens", "Expected int
    # >= 1"); unknown and missing fields name the field itself as the key
    message, sep, where = str(exc).partition(" - at ")
    key = where.strip("`").removeprefix("$").lstrip(".") if sep else ""
    field = _FIELD.search(message)
    if message.startswith("Object contains unknown field") and field:
        return _join(key, field.group(1)), "unknown key"
    if message.startswith("Object missing required field") and field:
        return _join(key, field.group(1)), "missing required key"
    return key or None, message.replace("`", "")


def parse_document(text: str, source: str) -> PolicyDocument:
    """Decode one policy document; `source` names it in errors (a file name)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(source, f"not valid TOML: {exc}") from None
    try:
        return msgspec.convert(raw, PolicyDocument)
    except msgspec.ValidationError as exc:
        key, message = _describe(exc)
        raise PolicyError(source, message, key=key) from None


def policy_files(path: str | os.PathLike[str]) -> list[Path]:
    """The files a policy path stands for, in evaluation order."""
    root = Path(path)
    if root.is_dir():
        files = sorted(
            (f for f in root.glob("*.toml") if f.is_file() and not f.name.startswith(".")),
            key=lambda f: f.name,
        )
        if not files:
            raise PolicyError(str(root), "no *.toml policy files in this directory")
        return files
    if root.is_file():
        return [root]
    raise PolicyError(str(root), "no such file or directory")


def read_document(file: Path) -> PolicyDocument:
    """Read and decode one policy file; errors name it by its file name."""
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise PolicyError(file.name, "not UTF-8 text") from None
    except OSError as exc:
        raise PolicyError(file.name, f"cannot be read ({exc.strerror})") from None
    return parse_document(text, file.name)


def policy_set(
    documents: Sequence[PolicyDocument], sources: Sequence[str] | None = None
) -> PolicySet:
    """A `PolicySet` of `documents` in this order, with its version computed."""
    documents = tuple(documents)
    names = tuple(sources) if sources is not None else tuple("<string>" for _ in documents)
    if len(names) != len(documents):
        raise ValueError("one source name per document")
    digest = hashlib.sha256(_encoder.encode(documents)).hexdigest()
    return PolicySet(documents=documents, sources=names, version=digest[:16])


def load_policy_dir(path: str | os.PathLike[str]) -> PolicySet:
    """Load every policy document under `path` (a directory or one file)."""
    files = policy_files(path)
    return policy_set([read_document(f) for f in files], [f.name for f in files])


def loads_policy(text: str, source: str = "<string>") -> PolicySet:
    """A `PolicySet` of the one document in `text` (tests, inline configuration)."""
    return policy_set([parse_document(text, source)], [source])


def load_default_policy() -> PolicySet:
    """The policy shipped with airgate (`policies/default.toml`), used when none is configured."""
    text = resources.files(__package__ or "policies").joinpath(DEFAULT_POLICY).read_text("utf-8")
    return loads_policy(text, DEFAULT_POLICY)
