"""Signing keys held by a key provider: what signs audit checkpoints.

A `Signer` signs with a private key it may never reveal (an HSM object, a Transit key, an AWS
KMS key, or, on a laptop, a local key file).  A verifier never asks the signer: it checks a
signature against a `VerifyKey` pinned in configuration or named on the command line, parsed
from its text form:

    ed25519:<base64 of the 32 raw bytes>             key id: SHA-256(raw)[:16 hex]
    ecdsa-p256:<base64 of the DER SubjectPublicKeyInfo>   key id: SHA-256(DER)[:16 hex]

(the Ed25519 form and key id are those of bundle manifest keys).  Algorithms: `ed25519` (the
signature is the 64 raw bytes) and `ecdsa-p256-sha256` (the DER signature over SHA-256 of the
message), for the providers that cannot hold Ed25519 keys.

The signers: `LocalSigner` here; `Pkcs11Signer` (`bundles.kms.pkcs11_signer`, Ed25519 on the
token), `VaultTransitSigner` (`bundles.kms.vault_signer`, an ed25519 Transit key at the version
that was latest at open) and `AwsKmsSigner` (`bundles.kms.aws_signer`, ECC_NIST_P256: moto, the
fake AWS the tests run against, has no Ed25519 keys).  Each is imported by its module path, so
its SDK is loaded only where it is configured.  A remote signer reads its public key once, at
open, and checks every signature the provider returns against it before handing it out: a key
replaced behind an alias or a version would otherwise sign checkpoints nobody can verify.  Any
provider failure is the generic `KeyProviderError` ("could not sign"), as for the key providers.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ..errors import SigningKeyError
from ..signing import create_signing_key, load_signing_key

__all__ = [
    "Algorithm",
    "LocalSigner",
    "Signer",
    "VerifyKey",
    "parse_verify_key",
    "verify_keys_from_texts_or_files",
]

Algorithm = Literal["ed25519", "ecdsa-p256-sha256"]


@runtime_checkable
class Signer(Protocol):
    """A private key that signs.  `sign` blocks (a remote provider calls out): run it in a
    worker thread unless `local` is true."""

    alg: Algorithm
    local: bool  # signing is a cheap in-process computation

    @property
    def verify_key(self) -> VerifyKey:
        """The public half (what a verifier pins)."""
        ...

    def sign(self, message: bytes) -> bytes: ...

    def close(self) -> None: ...


class VerifyKey:
    """A pinned public key: checks signatures, never makes them."""

    __slots__ = ("_public", "alg", "key_id", "text")

    def __init__(self, public: Ed25519PublicKey | ec.EllipticCurvePublicKey) -> None:
        self._public = public
        if isinstance(public, Ed25519PublicKey):
            raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
            self.alg: Algorithm = "ed25519"
            self.text = "ed25519:" + base64.b64encode(raw).decode("ascii")
        else:
            if not isinstance(public.curve, ec.SECP256R1):
                raise SigningKeyError("only P-256 ECDSA keys are supported")
            raw = public.public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            self.alg = "ecdsa-p256-sha256"
            self.text = "ecdsa-p256:" + base64.b64encode(raw).decode("ascii")
        self.key_id = hashlib.sha256(raw).hexdigest()[:16]

    def verify(self, signature: bytes, message: bytes) -> bool:
        try:
            if isinstance(self._public, Ed25519PublicKey):
                self._public.verify(signature, message)
            else:
                self._public.verify(signature, message, ec.ECDSA(hashes.SHA256()))
        except (InvalidSignature, ValueError):
            return False
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VerifyKey) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return f"VerifyKey({self.alg}, {self.key_id})"


def parse_verify_key(text: str) -> VerifyKey:
    """A key from its text form; raises `SigningKeyError` (never echoing the text)."""
    text = text.strip()
    prefix, _, body = text.partition(":")
    try:
        raw = base64.b64decode(body, validate=True)
        if prefix == "ed25519":
            return VerifyKey(Ed25519PublicKey.from_public_bytes(raw))
        if prefix == "ecdsa-p256":
            public = serialization.load_der_public_key(raw)
            if isinstance(public, ec.EllipticCurvePublicKey):
                return VerifyKey(public)
    except (ValueError, binascii.Error, TypeError, UnsupportedAlgorithm):
        pass
    raise SigningKeyError(
        "a trusted key must be ed25519:<base64 raw key> or ecdsa-p256:<base64 DER key>"
    )


def verify_keys_from_texts_or_files(entries: list[str]) -> list[VerifyKey]:
    """Keys given inline (`ed25519:...`) or as files holding one key per line (`#` comments)."""
    keys: list[VerifyKey] = []
    for entry in entries:
        if entry.strip().startswith(("ed25519:", "ecdsa-p256:")):
            keys.append(parse_verify_key(entry))
            continue
        try:
            lines = Path(entry).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            raise SigningKeyError("a trusted key file cannot be read") from None
        keys.extend(parse_verify_key(line) for line in lines if line.strip()[:1] not in ("", "#"))
    return keys


class _SignatureMismatch(Exception):
    """A provider's signature does not verify under the key read at open (for the log only)."""


def _checked_signature(verify_key: VerifyKey, signature: bytes, message: bytes) -> bytes:
    """`signature` if it verifies under `verify_key`; a remote signer returns nothing else."""
    if not verify_key.verify(signature, message):
        raise _SignatureMismatch(f"the signature does not verify under key {verify_key.key_id}")
    return signature


class LocalSigner:
    """An Ed25519 key file (PEM, 0600): for laptops and development.  Whoever can read the
    data directory can sign with it, so production signs through an HSM or a KMS."""

    alg: Algorithm = "ed25519"
    local = True

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key
        self._verify_key = VerifyKey(key.public_key())

    @classmethod
    def from_file(cls, path: Path, *, create: bool = False) -> LocalSigner:
        if create and not path.exists():
            create_signing_key(path)
        return cls(load_signing_key(path))

    @property
    def verify_key(self) -> VerifyKey:
        return self._verify_key

    def sign(self, message: bytes) -> bytes:
        return self._key.sign(message)

    def close(self) -> None:
        return None
