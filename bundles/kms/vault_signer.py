"""`vault-transit` signing keys: an ed25519 Transit key signs audit checkpoints.

The key is a plain (not derived, not exportable) Transit key of type `ed25519`.  A signer reads
`GET {mount}/keys/<name>` once, at open: the key's latest version then is the version it signs
with for its whole life (`key_version` in every `{mount}/sign/<name>` call), and that version's
`public_key` (base64 of the 32 raw bytes) is its `VerifyKey`.  Rotating the key in Transit
therefore never makes a running signer produce signatures its pinned key does not verify; the
next signer opened signs with the new version, under a new key id to pin.

Transit signs the message itself (pure Ed25519; `input` is its base64) and answers
`vault:v<N>:<base64 signature>`; N must be the pinned version.  The token needs `read` on
`{mount}/keys/<name>` and `update` on `{mount}/sign/<name>`; `create_signing_key` also needs
`create` on `{mount}/keys/<name>`.  The HTTP client is the key provider's (`vault._client`).
"""

from __future__ import annotations

import ssl
import threading
from typing import Any, ClassVar

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ..errors import KeyProviderError
from ._base import b64d, b64e, provider_errors
from .signer import Algorithm, VerifyKey, _checked_signature
from .vault import _MOUNT, _NAME, _checked_name, _client, _get, _post, _string, _TransitError

__all__ = ["VaultTransitSigner", "create_signing_key"]

_PROVIDER = "vault-transit"
_KEY_TYPE = "ed25519"


def _paths(mount: str, key_ref: str) -> tuple[str, str]:
    """(keys path, sign path) of `key_ref`; KeyProviderError for a name that is no segment."""
    try:
        mount = _checked_name(mount.strip("/"), _MOUNT, "mount")
        name = _checked_name(key_ref, _NAME, "key")
    except _TransitError as exc:
        raise KeyProviderError(str(exc)) from None
    return f"{mount}/keys/{name}", f"{mount}/sign/{name}"


def _open_client(
    address: str, token: str, namespace: str | None, ca_cert: str | None, timeout_s: float
) -> httpx.Client:
    try:
        return _client(address, token, namespace, ca_cert, timeout_s)
    except (OSError, ssl.SSLError, ValueError):
        raise KeyProviderError(
            f"vault-transit: address {address!r} or CA file {ca_cert!r} is unusable"
        ) from None


def _pinned_key(data: dict[str, Any] | None) -> tuple[int, VerifyKey]:
    """(latest version, its public key) from a `keys/<name>` answer."""
    if data is None:
        raise _TransitError("no such transit key")
    if data.get("type") != _KEY_TYPE:
        raise _TransitError(f"the transit key is of type {data.get('type')!r}, not ed25519")
    version, versions = data.get("latest_version"), data.get("keys")
    if not isinstance(version, int) or version < 1 or not isinstance(versions, dict):
        raise _TransitError("transit answer lacks latest_version or keys")
    entry = versions.get(str(version))
    if not isinstance(entry, dict):
        raise _TransitError(f"transit answer lacks version {version}")
    raw = b64d(_string(entry, "public_key"))
    return version, VerifyKey(Ed25519PublicKey.from_public_bytes(raw))


def create_signing_key(
    address: str,
    token: str,
    key_ref: str,
    *,
    mount: str = "transit",
    namespace: str | None = None,
    ca_cert: str | None = None,
    timeout_s: float = 10.0,
) -> str:
    """Create the ed25519 Transit key `key_ref`; the text of its public key (`ed25519:...`).

    Refuses (KeyProviderError naming the key) when the key already exists: Transit would keep
    the old key silently, whatever its type.
    """
    keys_path, _ = _paths(mount, key_ref)
    created: VerifyKey | None = None
    with (
        provider_errors(_PROVIDER, "create a signing key"),
        _open_client(address, token, namespace, ca_cert, timeout_s) as client,
    ):
        if _get(client, keys_path) is None:
            _post(client, keys_path, {"type": _KEY_TYPE, "exportable": False})
            _, created = _pinned_key(_get(client, keys_path))
    if created is None:
        raise KeyProviderError(f"vault-transit: a transit key named {key_ref!r} already exists")
    return created.text


class VaultTransitSigner:
    """Signs with the ed25519 Transit key `key_ref` at the version that was latest at open."""

    name: ClassVar[str] = _PROVIDER
    alg: Algorithm = "ed25519"
    local = False

    def __init__(
        self,
        address: str,
        token: str,
        key_ref: str,
        *,
        mount: str = "transit",
        namespace: str | None = None,
        ca_cert: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.address = address
        self.key_ref = key_ref
        keys_path, self._sign_path = _paths(mount, key_ref)
        self._client = _open_client(address, token, namespace, ca_cert, timeout_s)
        self._lock = threading.Lock()  # httpx.Client is thread-safe; the lock guards close()
        try:
            with provider_errors(self.name, "open a signing key"):
                self.version, self._verify_key = _pinned_key(_get(self._client, keys_path))
        except BaseException:
            self._client.close()
            raise

    def __repr__(self) -> str:  # never the token
        return f"VaultTransitSigner(address={self.address!r}, key_ref={self.key_ref!r})"

    @property
    def verify_key(self) -> VerifyKey:
        return self._verify_key

    def sign(self, message: bytes) -> bytes:
        with provider_errors(self.name, "sign"):
            with self._lock:
                if self._client.is_closed:
                    raise _TransitError("the signer is closed")
            body = {"input": b64e(message), "key_version": self.version}
            answer = _string(_post(self._client, self._sign_path, body), "signature")
            prefix, _, signature = answer.rpartition(":")
            if prefix != f"vault:v{self.version}":
                raise _TransitError("transit signed with another key version than pinned")
            return _checked_signature(self._verify_key, b64d(signature), message)

    def close(self) -> None:
        with self._lock:
            self._client.close()
