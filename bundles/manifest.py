"""The bundle manifest: what was sealed, how, for whom, and until when.

Stored as canonical JSON (sorted keys, no insignificant whitespace, UTF-8, integers only) so the
Ed25519 signature covers exactly one byte string, and a reader can refuse any other spelling.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from .errors import BundleFormatError
from .kms import WrappedKey

__all__ = [
    "FORMAT",
    "BundlePolicy",
    "CryptoParams",
    "FileEntry",
    "Manifest",
    "ModelInfo",
    "decode_manifest",
    "encode_manifest",
    "file_associated_data",
    "key_context",
    "parse_timestamp",
    "timestamp",
]

FORMAT = "airgate-bundle/1"
AEAD = "AES256-GCM-HKDF-SHA256-STREAM"
KEY_PURPOSE = "airgate-bundle-dek"

Sha256 = Annotated[str, Meta(pattern=r"^[0-9a-f]{64}$")]
Size = Annotated[int, Meta(ge=0)]
# relative, "/"-separated, no empty, hidden or ".." parts: safe to join under a directory
_PART = r"[A-Za-z0-9_][A-Za-z0-9_.+-]*"
RelPath = Annotated[str, Meta(min_length=1, max_length=255, pattern=rf"^{_PART}(/{_PART})*$")]
Timestamp = Annotated[str, Meta(pattern=r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")]


class _Strict(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class ModelInfo(_Strict, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: Annotated[str, Meta(min_length=1, max_length=128)]
    version: Annotated[str, Meta(min_length=1, max_length=64)]
    architecture: str = ""
    weight_format: Literal["gguf", "safetensors"]
    quantisation: str = ""
    chat_template: str | None = None  # a builtin name ("gemma") or Jinja source
    # e.g. {"context_length": 4096}: defaults an operator's config may still override
    engine_hints: dict[str, int | str | bool] = {}


class CryptoParams(_Strict, frozen=True, kw_only=True, forbid_unknown_fields=True):
    aead: Literal["AES256-GCM-HKDF-SHA256-STREAM"] = "AES256-GCM-HKDF-SHA256-STREAM"
    segment_size: Annotated[int, Meta(ge=4096, le=4 << 20)]
    key_bytes: Literal[32] = 32


class FileEntry(_Strict, frozen=True, kw_only=True, forbid_unknown_fields=True):
    path: RelPath  # path of the plaintext file inside the model; ciphertext is `<path>.enc`
    plaintext_size: Size
    ciphertext_size: Size
    plaintext_sha256: Sha256
    ciphertext_sha256: Sha256


class BundlePolicy(_Strict, frozen=True, kw_only=True, forbid_unknown_fields=True):
    allowed_engines: list[Literal["llama.cpp", "vllm"]]
    # a laptop may use the bundle at most this many days after it was created
    max_offline_days: Annotated[int, Meta(ge=1)] | None = None


class Manifest(_Strict, frozen=True, kw_only=True, forbid_unknown_fields=True):
    format: Literal["airgate-bundle/1"] = "airgate-bundle/1"
    bundle_id: Annotated[str, Meta(pattern=r"^[0-9a-f]{32}$")]
    created: Timestamp
    not_before: Timestamp | None = None
    not_after: Timestamp | None = None
    model: ModelInfo
    crypto: CryptoParams
    files: Annotated[list[FileEntry], Meta(min_length=1)]
    key_wraps: Annotated[list[WrappedKey], Meta(min_length=1)]
    policy: BundlePolicy


_encoder = msgspec.json.Encoder(order="sorted")
_decoder = msgspec.json.Decoder(Manifest)


def encode_manifest(manifest: Manifest) -> bytes:
    """The canonical bytes of `manifest` (what is signed and stored)."""
    return _encoder.encode(manifest)


def decode_manifest(data: bytes) -> Manifest:
    """Parse canonical manifest bytes; anything else is a format error."""
    try:
        manifest = _decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise BundleFormatError(f"manifest.json is not a valid v1 manifest: {exc}") from None
    except msgspec.DecodeError:
        raise BundleFormatError("manifest.json is not JSON") from None
    if _encoder.encode(manifest) != data:
        raise BundleFormatError("manifest.json is not in canonical form")
    paths = [f.path for f in manifest.files]
    if len(set(paths)) != len(paths):
        raise BundleFormatError("manifest.json names a file twice")
    return manifest


def key_context(bundle_id: str) -> dict[str, str]:
    """The context every key wrap of a bundle is bound to."""
    return {"bundle_id": bundle_id, "purpose": KEY_PURPOSE}


def file_associated_data(bundle_id: str, path: str) -> bytes:
    """Associated data (HKDF info) of one payload file: a file key opens only that file."""
    return f"{FORMAT}|{bundle_id}|{path}".encode()


def timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_timestamp(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
