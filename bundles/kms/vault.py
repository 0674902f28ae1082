"""`vault-transit`: key-encryption keys in a Vault or OpenBao Transit engine, over its HTTP API.

Keys are transit keys created with `derived=true`: Transit derives the encryption key from the key
and a per-request `context`, so sending base64(canonical context) binds every wrap to its bundle
id; a wrap presented with another context fails inside Transit.  The token needs `update` on
`{mount}/datakey/plaintext/<key>`, `{mount}/encrypt/<key>` and `{mount}/rewrap/<key>` to seal and
rotate, and only `{mount}/decrypt/<key>` to load (a least-privilege loader token).

`wrapped` is Transit's own ciphertext text (`vault:vN:...`); `key_version` is the N of its prefix.
The client is a plain httpx client: TLS verified (optionally against `ca_cert`), redirects never
followed (a redirect could carry the token elsewhere), proxy variables from the environment
ignored, the token sent only in `X-Vault-Token`.
"""

from __future__ import annotations

import re
import ssl
import threading
from collections.abc import Mapping
from typing import Any, ClassVar

import httpx

from ..errors import KeyProviderError
from ._base import DEK_BYTES, WrappedKey, b64d, b64e, canonical_context, provider_errors

__all__ = ["VaultTransitProvider", "create_key", "rotate_key"]

_ALGORITHM = "vault-transit"
# Key names and mount paths go into URLs: plain segments only, no `..` or `?` to redirect a call.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_MOUNT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}(/[A-Za-z0-9][A-Za-z0-9_.-]{0,127})*")
_CIPHERTEXT = re.compile(r"vault:v([1-9][0-9]{0,9}):[A-Za-z0-9+/=]+")


class _TransitError(Exception):
    """A failed call or check: status, Vault's own error strings or ours, for the log only."""


def _checked_name(text: str, pattern: re.Pattern[str], what: str) -> str:
    if not pattern.fullmatch(text):
        raise _TransitError(f"{what} {text!r} is not a valid transit path segment")
    return text


def _version_of(ciphertext: str) -> str:
    match = _CIPHERTEXT.fullmatch(ciphertext)
    if match is None:
        raise _TransitError("transit returned an unexpected ciphertext")
    return match.group(1)


def _client(
    address: str, token: str, namespace: str | None, ca_cert: str | None, timeout_s: float
) -> httpx.Client:
    headers = {"X-Vault-Token": token, "X-Vault-Request": "true"}
    if namespace:
        headers["X-Vault-Namespace"] = namespace
    verify: ssl.SSLContext | bool = True
    if ca_cert:
        verify = ssl.create_default_context(cafile=ca_cert)
    return httpx.Client(
        base_url=address.rstrip("/"),
        headers=headers,
        verify=verify,
        timeout=timeout_s,
        follow_redirects=False,
        trust_env=False,
    )


def _post(client: httpx.Client, path: str, body: Mapping[str, Any] | None) -> dict[str, Any]:
    """POST to `/v1/{path}`; the `data` object of the answer ({} for 204)."""
    return _data(client.post(f"/v1/{path}", json=dict(body or {})), path)


def _get(client: httpx.Client, path: str) -> dict[str, Any] | None:
    """GET `/v1/{path}`; the `data` object of the answer, or None for 404 (no such key)."""
    response = client.get(f"/v1/{path}")
    if response.status_code == 404:
        return None
    return _data(response, path)


def _data(response: httpx.Response, path: str) -> dict[str, Any]:
    """The `data` object of a Transit answer ({} for 204); `_TransitError` for a failure."""
    if response.status_code == 204:
        return {}
    if not response.is_success:
        try:
            errors = response.json().get("errors")
        except ValueError:
            errors = None
        # Vault's error strings name paths and causes, never request bodies.
        raise _TransitError(f"HTTP {response.status_code} on {path}: {errors!r:.200}")
    payload = response.json()
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, dict):
        raise _TransitError(f"HTTP {response.status_code} on {path}: no data object")
    return data


def _string(data: Mapping[str, Any], field: str) -> str:
    value = data.get(field)
    if not isinstance(value, str):
        raise _TransitError(f"transit answer lacks {field!r}")
    return value


def create_key(
    address: str,
    token: str,
    key_ref: str,
    *,
    mount: str = "transit",
    namespace: str | None = None,
    ca_cert: str | None = None,
    timeout_s: float = 10.0,
) -> None:
    """Create the derived AES-256-GCM transit key `key_ref` (a no-op if it already exists)."""
    with provider_errors(VaultTransitProvider.name, "create a key"):
        name = _checked_name(key_ref, _NAME, "key")
        path = f"{_checked_name(mount, _MOUNT, 'mount')}/keys/{name}"
        with _client(address, token, namespace, ca_cert, timeout_s) as client:
            _post(client, path, {"type": "aes256-gcm96", "derived": True})


def rotate_key(
    address: str,
    token: str,
    key_ref: str,
    *,
    mount: str = "transit",
    namespace: str | None = None,
    ca_cert: str | None = None,
    timeout_s: float = 10.0,
) -> None:
    """Add a new version of the transit key `key_ref`; new wraps and rewraps use it."""
    with provider_errors(VaultTransitProvider.name, "rotate a key"):
        name = _checked_name(key_ref, _NAME, "key")
        path = f"{_checked_name(mount, _MOUNT, 'mount')}/keys/{name}/rotate"
        with _client(address, token, namespace, ca_cert, timeout_s) as client:
            _post(client, path, None)


class VaultTransitProvider:
    """Wraps DEKs with derived keys of a Vault/OpenBao Transit engine (one pooled HTTP client)."""

    name: ClassVar[str] = "vault-transit"

    def __init__(
        self,
        address: str,
        token: str,
        *,
        mount: str = "transit",
        namespace: str | None = None,
        ca_cert: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.address = address
        try:
            self.mount = _checked_name(mount.strip("/"), _MOUNT, "mount")
        except _TransitError as exc:
            raise KeyProviderError(str(exc)) from None
        try:
            self._client = _client(address, token, namespace, ca_cert, timeout_s)
        except (OSError, ssl.SSLError, ValueError):
            raise KeyProviderError(
                f"vault-transit: address {address!r} or CA file {ca_cert!r} is unusable"
            ) from None
        self._lock = threading.Lock()  # httpx.Client is thread-safe; the lock guards close()

    def __repr__(self) -> str:  # never the token
        return f"VaultTransitProvider(address={self.address!r}, mount={self.mount!r})"

    def _call(self, operation: str, key_ref: str, body: Mapping[str, Any]) -> dict[str, Any]:
        name = _checked_name(key_ref, _NAME, "key")
        with self._lock:
            if self._client.is_closed:
                raise _TransitError("the provider is closed")
        return _post(self._client, f"{self.mount}/{operation}/{name}", body)

    def _wrapped(self, key_ref: str, ciphertext: str, context: Mapping[str, str]) -> WrappedKey:
        return WrappedKey(
            provider=self.name,
            key_ref=key_ref,
            key_version=_version_of(ciphertext),
            algorithm=_ALGORITHM,
            wrapped=ciphertext,
            context=dict(context),
        )

    def _encrypt(
        self, key_ref: str, dek: bytes | bytearray, context: Mapping[str, str]
    ) -> WrappedKey:
        if len(dek) != DEK_BYTES:
            raise _TransitError("a data key must be 32 bytes")
        body = {"plaintext": b64e(dek), "context": b64e(canonical_context(context))}
        data = self._call("encrypt", key_ref, body)
        return self._wrapped(key_ref, _string(data, "ciphertext"), context)

    def _checked(self, wrapped: WrappedKey) -> str:
        """The ciphertext of a wrap that claims to be ours, consistent with its key_version."""
        if wrapped.provider != self.name or wrapped.algorithm != _ALGORITHM:
            raise _TransitError("not a vault-transit wrap")
        if _version_of(wrapped.wrapped) != wrapped.key_version:
            raise _TransitError("key_version does not match the ciphertext")
        return wrapped.wrapped

    def generate_data_key(
        self, key_ref: str, context: Mapping[str, str]
    ) -> tuple[bytearray, WrappedKey]:
        with provider_errors(self.name, "generate a data key"):
            body = {"context": b64e(canonical_context(context)), "bits": DEK_BYTES * 8}
            data = self._call("datakey/plaintext", key_ref, body)
            dek = bytearray(b64d(_string(data, "plaintext")))
            if len(dek) != DEK_BYTES:
                raise _TransitError("transit returned a data key of the wrong size")
            return dek, self._wrapped(key_ref, _string(data, "ciphertext"), context)

    def wrap(self, key_ref: str, dek: bytes | bytearray, context: Mapping[str, str]) -> WrappedKey:
        with provider_errors(self.name, "wrap"):
            return self._encrypt(key_ref, dek, context)

    def unwrap(self, wrapped: WrappedKey, context: Mapping[str, str]) -> bytearray:
        with provider_errors(self.name, "unwrap"):
            body = {
                "ciphertext": self._checked(wrapped),
                "context": b64e(canonical_context(context)),
            }
            data = self._call("decrypt", wrapped.key_ref, body)
            dek = bytearray(b64d(_string(data, "plaintext")))
            if len(dek) != DEK_BYTES:
                dek[:] = bytes(len(dek))
                raise _TransitError("wrapped key has the wrong size")
            return dek

    def rewrap(
        self, wrapped: WrappedKey, context: Mapping[str, str], key_ref: str | None = None
    ) -> WrappedKey:
        if key_ref is None or key_ref == wrapped.key_ref:
            # Transit re-encrypts under the key's latest version without the DEK leaving it.
            with provider_errors(self.name, "rewrap"):
                body = {
                    "ciphertext": self._checked(wrapped),
                    "context": b64e(canonical_context(context)),
                }
                data = self._call("rewrap", wrapped.key_ref, body)
                return self._wrapped(wrapped.key_ref, _string(data, "ciphertext"), context)
        dek = self.unwrap(wrapped, context)
        try:
            with provider_errors(self.name, "rewrap"):
                return self._encrypt(key_ref, dek, context)
        finally:
            dek[:] = bytes(len(dek))

    def close(self) -> None:
        with self._lock:
            self._client.close()
