"""The key-provider interface every KMS backend implements, and its one error seam.

A provider wraps the bundle's random data key (DEK) under a key-encryption key it holds and
never reveals.  The wrap is bound to a *context* (the bundle id and purpose): unwrapping with any
other context fails.  Every foreign failure (SDK error, network, bad tag, wrong PIN) leaves a
provider as one `KeyUnwrapError` / `KeyProviderError` whose message says nothing; the log line
names the provider, the operation and the foreign exception's type.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import ClassVar, Protocol, runtime_checkable

import msgspec

from ..errors import BundleError, KeyProviderError, KeyUnwrapError

__all__ = [
    "DEK_BYTES",
    "KeyProvider",
    "WrappedKey",
    "b64d",
    "b64e",
    "canonical_context",
    "parse_recipient",
    "provider_errors",
]

DEK_BYTES = 32
_log = logging.getLogger("airgate.kms")


class WrappedKey(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One recipient's wrap of the DEK, as stored in the manifest (no secrets in it)."""

    provider: str  # "local" | "pkcs11" | "vault-transit" | "aws-kms"
    key_ref: str  # the provider's name for the key-encryption key
    key_version: str  # which version of that key wrapped this DEK
    algorithm: str  # how (e.g. "AES-256-GCM", "AES-KWP", "vault-transit", "aws-kms")
    wrapped: str  # the provider's ciphertext of the DEK (base64 or the provider's own text)
    context: dict[str, str]  # bound into the wrap; ids only, never secrets


@runtime_checkable
class KeyProvider(Protocol):
    """Envelope-encryption operations of one KMS.  Blocking; call from a worker thread."""

    name: ClassVar[str]

    def generate_data_key(
        self, key_ref: str, context: Mapping[str, str]
    ) -> tuple[bytearray, WrappedKey]:
        """A fresh random DEK and its wrap under `key_ref`'s current version."""
        ...

    def wrap(self, key_ref: str, dek: bytes | bytearray, context: Mapping[str, str]) -> WrappedKey:
        """Wrap an existing DEK (adding a recipient to a bundle)."""
        ...

    def unwrap(self, wrapped: WrappedKey, context: Mapping[str, str]) -> bytearray:
        """The DEK, if `wrapped` was made by this provider for exactly `context`."""
        ...

    def rewrap(
        self, wrapped: WrappedKey, context: Mapping[str, str], key_ref: str | None = None
    ) -> WrappedKey:
        """The same DEK wrapped under the current version of `key_ref` (default: the same key)."""
        ...

    def close(self) -> None:
        """Release sessions and connections."""
        ...


def parse_recipient(text: str) -> tuple[str, str]:
    """`"vault-transit:airgate-bundles"` -> `("vault-transit", "airgate-bundles")`."""
    provider, sep, ref = text.partition(":")
    if not sep or not provider or not ref:
        raise KeyProviderError(f"recipient {text!r} must look like <provider>:<key-ref>")
    return provider, ref


def canonical_context(context: Mapping[str, str]) -> bytes:
    """The context as canonical JSON bytes (sorted keys), for AAD and derivation."""
    return msgspec.json.encode(dict(sorted(context.items())))


def b64e(data: bytes | bytearray) -> str:
    return base64.b64encode(bytes(data)).decode("ascii")


def b64d(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


@contextmanager
def provider_errors(provider: str, operation: str) -> Iterator[None]:
    """Turn any failure inside a provider call into the generic error for `operation`.

    The log gets the provider, the operation and the foreign exception's type and text (SDK
    messages name keys and HTTP statuses, not key material); the raised error gets neither.
    """
    try:
        yield
    except BundleError as exc:
        _log.warning("kms %s %s failed: %s", provider, operation, type(exc).__name__)
        if operation == "unwrap":
            raise KeyUnwrapError() from None
        raise KeyProviderError(f"key provider {provider!r} could not {operation}") from None
    except Exception as exc:
        _log.warning("kms %s %s failed: %s: %.300s", provider, operation, type(exc).__name__, exc)
        if operation == "unwrap":
            raise KeyUnwrapError() from None
        raise KeyProviderError(f"key provider {provider!r} could not {operation}") from None
