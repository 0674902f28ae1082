"""`pkcs11`: key-encryption keys held in an HSM (any PKCS#11 module; SoftHSM2 in tests).

A key-encryption key is an AES-256 secret key on the token, non-extractable, usable only to wrap
and unwrap, with CKA_LABEL = the key ref and CKA_ID = its version (b"1", b"2", ...); the newest
version wraps, older ones stay to unwrap existing bundles.  A wrap is AES key wrap with padding
(CKM_AES_KEY_WRAP_PAD, RFC 5649) of the DEK, done inside the token.

KWP takes no associated data, so the context is bound by a commitment stored next to the blob:
HMAC-SHA256(key=DEK, msg=b"airgate-pkcs11-context/1|" + canonical context).  It is checked in
constant time after unwrapping; a wrap presented with any other context fails.

`wrapped` is base64 of this layout (all lengths fixed except the last field):

    offset 0   1 byte    layout version, 0x01
    offset 1   32 bytes  the context HMAC
    offset 33  rest      the KWP blob (40 bytes for a 32-byte DEK)

PKCS#11 login state belongs to the whole process, not to a session: a second `C_Login` on the
same token fails, and `C_Logout` logs every session out.  So the process keeps ONE logged-in
session per (module, token), shared by every provider and `create_key` call, guarded by one lock
and closed when the last user releases it.  A later user must present the same PIN (compared
against a keyed digest kept in memory), so a wrong PIN fails even while the token is logged in.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import secrets
import threading
from collections.abc import Mapping
from typing import Any, ClassVar

import pkcs11
from pkcs11 import Attribute, KeyType, Mechanism, MechanismFlag, ObjectClass

from ._base import DEK_BYTES, WrappedKey, b64d, b64e, canonical_context, provider_errors

__all__ = ["Pkcs11KeyProvider", "create_key"]

_ALGORITHM = "AES-KWP+HMAC-SHA256"
_LAYOUT = b"\x01"
_TAG = 32
_CONTEXT_LABEL = b"airgate-pkcs11-context/1|"
_PIN_KEY = secrets.token_bytes(32)  # keys the in-memory PIN digests; never leaves the process


class _TokenError(Exception):
    """A check of ours failed; its text (key names, versions) goes to the log, never further."""


# Errors after which the shared session is useless (token gone, session closed, logged out).
_DEAD_SESSION = (
    pkcs11.SessionClosed,
    pkcs11.SessionHandleInvalid,
    pkcs11.DeviceRemoved,
    pkcs11.TokenNotPresent,
    pkcs11.UserNotLoggedIn,
)


class _Shared:
    """The process's one logged-in session on a token, with its lock and users count."""

    def __init__(self, key: tuple[str, str], session: pkcs11.Session, pin_digest: bytes) -> None:
        self.key = key
        self.session = session
        self.pin_digest = pin_digest
        self.lock = threading.Lock()
        self.users = 0
        self.alive = True


_registry: dict[tuple[str, str], _Shared] = {}
_registry_lock = threading.Lock()


def _pin_digest(pin: str) -> bytes:
    return hmac.new(_PIN_KEY, pin.encode("utf-8"), hashlib.sha256).digest()


def _acquire(module: str, token_label: str, pin: str) -> _Shared:
    """The shared session on `token_label`, logging in if this process has none yet."""
    key = (module, token_label)
    digest = _pin_digest(pin)
    with _registry_lock:
        shared = _registry.get(key)
        if shared is None:
            token = pkcs11.lib(module).get_token(token_label=token_label)
            shared = _Shared(key, token.open(rw=True, user_pin=pin), digest)
            _registry[key] = shared
        elif not hmac.compare_digest(shared.pin_digest, digest):
            raise _TokenError("PKCS#11 PIN does not match the token's open session")
        shared.users += 1
        return shared


def _release(shared: _Shared) -> None:
    """Drop one user; the last one closes the session (which logs the process out)."""
    with _registry_lock:
        shared.users -= 1
        if shared.users > 0:
            return
        if _registry.get(shared.key) is shared:
            del _registry[shared.key]
        if shared.alive:
            shared.alive = False
            # A dead (discarded) session is never closed: Session.close() logs out, which would
            # log out the fresh session that replaced it.
            with shared.lock, contextlib.suppress(pkcs11.PKCS11Error):
                shared.session.close()  # suppressed: the token went away, nothing to close


def _discard(shared: _Shared) -> None:
    """Forget a dead session so the next call logs in afresh (its users keep their count)."""
    with _registry_lock:
        shared.alive = False
        if _registry.get(shared.key) is shared:
            del _registry[shared.key]


def _versions(session: pkcs11.Session, key_ref: str) -> dict[int, pkcs11.SecretKey]:
    """Every version of `key_ref` on the token (objects whose CKA_ID is no number are ignored)."""
    found: dict[int, pkcs11.SecretKey] = {}
    template = {Attribute.CLASS: ObjectClass.SECRET_KEY, Attribute.LABEL: key_ref}
    for obj in session.get_objects(template):
        ident = obj[Attribute.ID]
        if isinstance(obj, pkcs11.SecretKey) and isinstance(ident, bytes) and ident.isdigit():
            if int(ident) in found:
                raise _TokenError(f"key {key_ref!r} has two objects with one version")
            found[int(ident)] = obj
    return found


def _kek(session: pkcs11.Session, key_ref: str, version: str | None) -> tuple[str, Any]:
    """(version, key object) of `key_ref` at `version`, or at its newest version if None."""
    versions = _versions(session, key_ref)
    if not versions:
        raise _TokenError(f"no key {key_ref!r} on the token")
    if version is None:
        number = max(versions)
    elif version.isdigit() and int(version) in versions and str(int(version)) == version:
        number = int(version)
    else:
        raise _TokenError(f"key {key_ref!r} has no version {version!r}")
    return str(number), versions[number]


def _commitment(dek: bytes | bytearray, context: Mapping[str, str]) -> bytes:
    return hmac.new(
        bytes(dek), _CONTEXT_LABEL + canonical_context(context), hashlib.sha256
    ).digest()


def create_key(module: str, token_label: str, pin: str, key_ref: str) -> str:
    """Add a new version of `key_ref` on the token (creating the key if needed); the version."""
    with provider_errors(Pkcs11KeyProvider.name, "create a key"):
        shared = _acquire(module, token_label, pin)
        try:
            with shared.lock:
                session = shared.session
                version = str(max(_versions(session, key_ref), default=0) + 1)
                session.generate_key(
                    KeyType.AES,
                    256,
                    label=key_ref,
                    id=version.encode("ascii"),
                    store=True,
                    capabilities=MechanismFlag.WRAP | MechanismFlag.UNWRAP,
                    template={
                        Attribute.PRIVATE: True,
                        Attribute.SENSITIVE: True,
                        Attribute.EXTRACTABLE: False,
                    },
                )
                return version
        finally:
            _release(shared)


class Pkcs11KeyProvider:
    """Wraps DEKs with AES key-encryption keys on a PKCS#11 token.

    Connects on first use (so a provider for an absent token fails at its first operation, as
    the generic error) and holds the shared session until `close()`.
    """

    name: ClassVar[str] = "pkcs11"

    def __init__(self, module: str, token_label: str, pin: str) -> None:
        self.module = module
        self.token_label = token_label
        self._pin = pin
        self._shared: _Shared | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:  # never the PIN
        return f"Pkcs11KeyProvider(module={self.module!r}, token_label={self.token_label!r})"

    def _connection(self) -> _Shared:
        with self._lock:
            if self._shared is not None and not self._shared.alive:
                _release(self._shared)
                self._shared = None
            if self._shared is None:
                self._shared = _acquire(self.module, self.token_label, self._pin)
            return self._shared

    def _run_wrap(
        self, key_ref: str, dek: bytes | bytearray, context: Mapping[str, str]
    ) -> WrappedKey:
        if len(dek) != DEK_BYTES:
            raise _TokenError("a data key must be 32 bytes")
        shared = self._connection()
        try:
            with shared.lock:
                version, kek = _kek(shared.session, key_ref, None)
                # The DEK enters the token as a short-lived session object that KWP can wrap.
                temp = shared.session.create_object(
                    {
                        Attribute.CLASS: ObjectClass.SECRET_KEY,
                        Attribute.KEY_TYPE: KeyType.AES,
                        Attribute.VALUE: bytes(dek),
                        Attribute.TOKEN: False,
                        Attribute.PRIVATE: True,
                        Attribute.SENSITIVE: False,
                        Attribute.EXTRACTABLE: True,
                    }
                )
                try:
                    blob = kek.wrap_key(temp, mechanism=Mechanism.AES_KEY_WRAP_PAD)
                finally:
                    temp.destroy()
        except _DEAD_SESSION:
            _discard(shared)
            raise
        return WrappedKey(
            provider=self.name,
            key_ref=key_ref,
            key_version=version,
            algorithm=_ALGORITHM,
            wrapped=b64e(_LAYOUT + _commitment(dek, context) + blob),
            context=dict(context),
        )

    def _run_unwrap(self, wrapped: WrappedKey, context: Mapping[str, str]) -> bytearray:
        if wrapped.provider != self.name or wrapped.algorithm != _ALGORITHM:
            raise _TokenError("not a pkcs11 wrap")
        raw = b64d(wrapped.wrapped)
        if len(raw) <= 1 + _TAG or raw[:1] != _LAYOUT:
            raise _TokenError("malformed pkcs11 wrap")
        tag, blob = raw[1 : 1 + _TAG], raw[1 + _TAG :]
        shared = self._connection()
        try:
            with shared.lock:
                _, kek = _kek(shared.session, wrapped.key_ref, wrapped.key_version)
                temp = kek.unwrap_key(
                    ObjectClass.SECRET_KEY,
                    KeyType.AES,
                    blob,
                    mechanism=Mechanism.AES_KEY_WRAP_PAD,
                    store=False,
                    template={
                        Attribute.PRIVATE: True,
                        Attribute.SENSITIVE: False,
                        Attribute.EXTRACTABLE: True,
                    },
                )
                try:
                    # bytes from the SDK cannot be wiped; the bytearray we return can be.
                    dek = bytearray(temp[Attribute.VALUE])
                finally:
                    temp.destroy()
        except _DEAD_SESSION:
            _discard(shared)
            raise
        if len(dek) != DEK_BYTES or not hmac.compare_digest(_commitment(dek, context), tag):
            dek[:] = bytes(len(dek))
            raise _TokenError("the wrap was made for another context")
        return dek

    def generate_data_key(
        self, key_ref: str, context: Mapping[str, str]
    ) -> tuple[bytearray, WrappedKey]:
        with provider_errors(self.name, "generate a data key"):
            dek = bytearray(secrets.token_bytes(DEK_BYTES))
            try:
                return dek, self._run_wrap(key_ref, dek, context)
            except BaseException:
                dek[:] = bytes(DEK_BYTES)
                raise

    def wrap(self, key_ref: str, dek: bytes | bytearray, context: Mapping[str, str]) -> WrappedKey:
        with provider_errors(self.name, "wrap"):
            return self._run_wrap(key_ref, dek, context)

    def unwrap(self, wrapped: WrappedKey, context: Mapping[str, str]) -> bytearray:
        with provider_errors(self.name, "unwrap"):
            return self._run_unwrap(wrapped, context)

    def rewrap(
        self, wrapped: WrappedKey, context: Mapping[str, str], key_ref: str | None = None
    ) -> WrappedKey:
        dek = self.unwrap(wrapped, context)
        try:
            with provider_errors(self.name, "rewrap"):
                return self._run_wrap(key_ref or wrapped.key_ref, dek, context)
        finally:
            dek[:] = bytes(len(dek))

    def close(self) -> None:
        with self._lock:
            if self._shared is not None:
                _release(self._shared)
                self._shared = None
