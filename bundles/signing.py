"""Ed25519 signing keys and pinned trusted keys for manifests.

A public key is written `ed25519:<base64 of the 32 raw bytes>`; its key id is the first 16 hex
digits of its SHA-256.  `manifest.sig` is canonical JSON `{"algorithm", "key_id", "signature"}`;
the signature covers the exact bytes of `manifest.json`.
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .errors import BundleSignatureError, SigningKeyError

__all__ = [
    "Signature",
    "TrustedKeys",
    "create_signing_key",
    "key_id",
    "load_signing_key",
    "parse_public_key",
    "public_key_text",
    "sign_manifest",
    "signature_key_id",
    "verify_manifest",
]

_PREFIX = "ed25519:"


class Signature(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    algorithm: Literal["ed25519"] = "ed25519"
    key_id: str
    signature: str


def _raw(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(public: Ed25519PublicKey) -> str:
    return hashlib.sha256(_raw(public)).hexdigest()[:16]


def public_key_text(public: Ed25519PublicKey) -> str:
    return _PREFIX + base64.b64encode(_raw(public)).decode("ascii")


def parse_public_key(text: str) -> Ed25519PublicKey:
    text = text.strip()
    if not text.startswith(_PREFIX):
        raise SigningKeyError("a trusted key must look like ed25519:<base64>")
    try:
        raw = base64.b64decode(text[len(_PREFIX) :], validate=True)
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:  # binascii.Error included
        raise SigningKeyError("a trusted key is not a valid Ed25519 public key") from None


def create_signing_key(path: Path) -> Ed25519PublicKey:
    """Write a new private key to `path` (0600, never overwriting); returns its public key."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise SigningKeyError(f"{path} already exists; refusing to overwrite a key") from None
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public = key.public_key()
    path.with_name(path.name + ".pub").write_text(public_key_text(public) + "\n")
    return public


def load_signing_key(path: Path) -> Ed25519PrivateKey:
    try:
        if stat.S_IMODE(path.stat().st_mode) & 0o077:
            raise SigningKeyError(f"signing key {path} is readable by others; chmod 600 it")
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except FileNotFoundError:
        raise SigningKeyError(f"signing key {path} does not exist") from None
    except (ValueError, TypeError):
        raise SigningKeyError(f"{path} is not an unencrypted PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError(f"{path} is not an Ed25519 key")
    return key


class TrustedKeys:
    """The pinned public keys a loader accepts signatures from, by key id."""

    def __init__(self, keys: Iterable[Ed25519PublicKey | str]) -> None:
        parsed = [parse_public_key(k) if isinstance(k, str) else k for k in keys]
        self._by_id = {key_id(k): k for k in parsed}

    @classmethod
    def from_texts_or_files(cls, entries: Iterable[str]) -> TrustedKeys:
        """Each entry is `ed25519:<base64>` or the path of a file holding one per line."""
        keys: list[str] = []
        for entry in entries:
            if entry.startswith(_PREFIX):
                keys.append(entry)
                continue
            try:
                lines = Path(entry).read_text().splitlines()
            except OSError:
                raise SigningKeyError(f"trusted key file {entry} cannot be read") from None
            keys.extend(line for line in lines if line.strip() and not line.startswith("#"))
        return cls(keys)

    def __len__(self) -> int:
        return len(self._by_id)

    def keys(self) -> list[Ed25519PublicKey]:
        return list(self._by_id.values())

    def get(self, kid: str) -> Ed25519PublicKey | None:
        return self._by_id.get(kid)


_sig_encoder = msgspec.json.Encoder(order="sorted")


def sign_manifest(manifest_bytes: bytes, key: Ed25519PrivateKey) -> bytes:
    """The bytes of `manifest.sig` for `manifest_bytes`."""
    sig = Signature(
        key_id=key_id(key.public_key()),
        signature=base64.b64encode(key.sign(manifest_bytes)).decode("ascii"),
    )
    return _sig_encoder.encode(sig)


def signature_key_id(sig_bytes: bytes | None) -> str:
    """The key id a signature claims (unverified; "" when there is none)."""
    if sig_bytes is None:
        return ""
    try:
        return msgspec.json.decode(sig_bytes, type=Signature).key_id
    except msgspec.DecodeError:
        return ""


def verify_manifest(manifest_bytes: bytes, sig_bytes: bytes | None, trusted: TrustedKeys) -> str:
    """The signing key id if `sig_bytes` is a valid signature by a trusted key; else raises."""
    if sig_bytes is None:
        raise BundleSignatureError("the bundle has no signature (manifest.sig is missing)")
    try:
        sig = msgspec.json.decode(sig_bytes, type=Signature)
        raw = base64.b64decode(sig.signature, validate=True)
    except (msgspec.DecodeError, ValueError):  # binascii.Error is a ValueError
        raise BundleSignatureError("manifest.sig is malformed") from None
    public = trusted.get(sig.key_id)
    if public is None:
        raise BundleSignatureError(
            f"the bundle is signed by key {sig.key_id}, which is not a trusted key here"
        )
    try:
        public.verify(raw, manifest_bytes)
    except InvalidSignature:
        raise BundleSignatureError("the manifest signature is invalid") from None
    return sig.key_id
