"""`local`: key-encryption keys in a 0600 key file (the default, and the offline laptop case).

The file is a small JSON keyring: named keys, each with numbered versions; new wraps use the
newest version, old versions stay to unwrap existing bundles until they are rekeyed.  A wrap is
AES-256-GCM(KEK, random nonce, DEK) with the canonical context, key name and version as
associated data, so a wrap only opens for the bundle it was made for.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import msgspec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..errors import KeyProviderError
from ._base import DEK_BYTES, WrappedKey, b64d, b64e, canonical_context, provider_errors

__all__ = ["LocalKeyProvider", "init_key_file", "rotate_key"]

_FORMAT = "airgate-local-kms/1"
_ALGORITHM = "AES-256-GCM"
_NONCE = 12


class _Key(msgspec.Struct, forbid_unknown_fields=True):
    versions: dict[str, str]  # version -> base64 key
    current: str


class _KeyFile(msgspec.Struct, forbid_unknown_fields=True):
    format: str
    keys: dict[str, _Key]


def _write_private(path: Path, data: bytes, *, exclusive: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if exclusive:
            os.link(tmp, path)  # fails if the file appeared meanwhile: never overwrite a key
        else:
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _read(path: Path) -> _KeyFile:
    try:
        st = path.stat()
        if stat.S_IMODE(st.st_mode) & 0o077:
            raise KeyProviderError(
                f"local key file {path} is readable by others; chmod 600 it before use"
            )
        keyfile = msgspec.json.decode(path.read_bytes(), type=_KeyFile)
    except FileNotFoundError:
        raise KeyProviderError(
            f"local key file {path} does not exist (create it with `airgate kms init`)"
        ) from None
    except msgspec.DecodeError:
        raise KeyProviderError(f"local key file {path} is not a key file") from None
    if keyfile.format != _FORMAT:
        raise KeyProviderError(f"local key file {path} has an unknown format")
    return keyfile


def init_key_file(path: Path, key_ref: str = "default") -> bool:
    """Create `path` with one new key named `key_ref`; False if the file already exists."""
    if path.exists():
        return False
    keyfile = _KeyFile(
        format=_FORMAT,
        keys={key_ref: _Key(versions={"1": b64e(secrets.token_bytes(32))}, current="1")},
    )
    try:
        _write_private(path, msgspec.json.encode(keyfile), exclusive=True)
    except FileExistsError:
        return False
    return True


def rotate_key(path: Path, key_ref: str = "default") -> str:
    """Add a new version of `key_ref` (creating the key if needed); returns the version."""
    keyfile = _read(path)
    key = keyfile.keys.get(key_ref)
    if key is None:
        key = keyfile.keys[key_ref] = _Key(versions={}, current="0")
    version = str(max((int(v) for v in key.versions), default=0) + 1)
    key.versions[version] = b64e(secrets.token_bytes(32))
    key.current = version
    _write_private(path, msgspec.json.encode(keyfile), exclusive=False)
    return version


def _aad(key_ref: str, version: str, context: Mapping[str, str]) -> bytes:
    return b"|".join(
        (_FORMAT.encode(), key_ref.encode(), version.encode(), canonical_context(context))
    )


class LocalKeyProvider:
    """Wraps DEKs with keys from a local key file (re-read per call: rotation needs no restart)."""

    name: ClassVar[str] = "local"

    def __init__(self, key_file: str | os.PathLike[str]) -> None:
        self.key_file = Path(key_file)

    def _kek(self, key_ref: str, version: str | None) -> tuple[str, bytes]:
        key = _read(self.key_file).keys.get(key_ref)
        if key is None:
            raise KeyProviderError(f"no key {key_ref!r} in the local key file")
        version = version or key.current
        material = key.versions.get(version)
        if material is None:
            raise KeyProviderError(f"key {key_ref!r} has no version {version!r}")
        return version, b64d(material)

    def _wrap(self, key_ref: str, dek: bytes | bytearray, context: Mapping[str, str]) -> WrappedKey:
        if len(dek) != DEK_BYTES:
            raise KeyProviderError("a data key must be 32 bytes")
        version, kek = self._kek(key_ref, None)
        nonce = secrets.token_bytes(_NONCE)
        sealed = AESGCM(kek).encrypt(nonce, bytes(dek), _aad(key_ref, version, context))
        return WrappedKey(
            provider=self.name,
            key_ref=key_ref,
            key_version=version,
            algorithm=_ALGORITHM,
            wrapped=b64e(nonce + sealed),
            context=dict(context),
        )

    def generate_data_key(
        self, key_ref: str, context: Mapping[str, str]
    ) -> tuple[bytearray, WrappedKey]:
        with provider_errors(self.name, "generate a data key"):
            dek = bytearray(secrets.token_bytes(DEK_BYTES))
            return dek, self._wrap(key_ref, dek, context)

    def wrap(self, key_ref: str, dek: bytes | bytearray, context: Mapping[str, str]) -> WrappedKey:
        with provider_errors(self.name, "wrap"):
            return self._wrap(key_ref, dek, context)

    def unwrap(self, wrapped: WrappedKey, context: Mapping[str, str]) -> bytearray:
        with provider_errors(self.name, "unwrap"):
            if wrapped.algorithm != _ALGORITHM:
                raise KeyProviderError("unknown wrap algorithm")
            _, kek = self._kek(wrapped.key_ref, wrapped.key_version)
            blob = b64d(wrapped.wrapped)
            aad = _aad(wrapped.key_ref, wrapped.key_version, context)
            dek = bytearray(AESGCM(kek).decrypt(blob[:_NONCE], blob[_NONCE:], aad))
            if len(dek) != DEK_BYTES:
                raise KeyProviderError("wrapped key has the wrong size")
            return dek

    def rewrap(
        self, wrapped: WrappedKey, context: Mapping[str, str], key_ref: str | None = None
    ) -> WrappedKey:
        dek = self.unwrap(wrapped, context)
        try:
            with provider_errors(self.name, "rewrap"):
                return self._wrap(key_ref or wrapped.key_ref, dek, context)
        finally:
            dek[:] = bytes(len(dek))

    def close(self) -> None:
        pass
