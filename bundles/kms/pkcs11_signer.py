"""`pkcs11` signing keys: an Ed25519 key pair on the token signs audit checkpoints.

The pair is made on the token (CKM_EC_EDWARDS_KEY_PAIR_GEN, CKA_EC_PARAMS = the Ed25519 OID);
both halves carry CKA_LABEL = the key ref and CKA_ID = its UTF-8 bytes.  The private half is
CKA_PRIVATE, CKA_SENSITIVE and never CKA_EXTRACTABLE, usable only to sign (CKM_EDDSA, pure
Ed25519: the 64-byte signature `VerifyKey` checks); a signer refuses a private key that is not
so.  SoftHSM 2.6.1 and python-pkcs11 0.10 both offer these mechanisms (checked with the token's
mechanism list when this was written), so no ECDSA fallback is carried.

The public half's CKA_EC_POINT (a DER OCTET STRING of the 32 raw bytes; some tokens give the raw
bytes) is read once, at open.  Signing goes through the process's one logged-in session on the
token (`pkcs11._acquire`), shared with the key providers, with the same PIN check; after a dead
session the signer logs in again, finds its key again and checks it is the same key.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

import pkcs11
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pkcs11 import Attribute, KeyType, Mechanism, MechanismFlag, ObjectClass

from ..errors import KeyProviderError
from ._base import provider_errors
from .pkcs11 import _DEAD_SESSION, _acquire, _discard, _release, _Shared, _TokenError
from .signer import Algorithm, VerifyKey, _checked_signature

__all__ = ["Pkcs11Signer", "create_signing_key"]

_PROVIDER = "pkcs11"
_ED25519_OID = bytes.fromhex("06032b6570")  # 1.3.101.112, id-Ed25519 (RFC 8410), DER
# the same curve as PKCS#11 3.0 also lets a token name it: PrintableString "edwards25519"
_ED25519_PARAMS = (_ED25519_OID, b"\x13\x0c" + b"edwards25519")


def _objects(session: pkcs11.Session, key_ref: str, object_class: ObjectClass) -> list[Any]:
    template = {
        Attribute.CLASS: object_class,
        Attribute.KEY_TYPE: KeyType.EC_EDWARDS,
        Attribute.LABEL: key_ref,
    }
    return list(session.get_objects(template))


def _raw_point(ec_point: bytes) -> bytes:
    if len(ec_point) == 34 and ec_point[:2] == b"\x04\x20":  # OCTET STRING, 32 bytes
        return ec_point[2:]
    if len(ec_point) == 32:
        return ec_point
    raise _TokenError("CKA_EC_POINT is not an Ed25519 point")


def _key_pair(session: pkcs11.Session, key_ref: str) -> tuple[Any, VerifyKey]:
    """The private key object labelled `key_ref` and the public key of its pair."""
    privates = _objects(session, key_ref, ObjectClass.PRIVATE_KEY)
    publics = _objects(session, key_ref, ObjectClass.PUBLIC_KEY)
    if len(privates) != 1 or len(publics) != 1:
        raise _TokenError(
            f"{len(privates)} private and {len(publics)} public Ed25519 keys labelled "
            f"{key_ref!r} on the token; a signing key is exactly one pair"
        )
    private, public = privates[0], publics[0]
    if private[Attribute.EXTRACTABLE] or not private[Attribute.SENSITIVE]:
        raise _TokenError(f"the private key {key_ref!r} is extractable or not sensitive")
    if public[Attribute.EC_PARAMS] not in _ED25519_PARAMS:
        raise _TokenError(f"the key pair {key_ref!r} is not on the Ed25519 curve")
    raw = _raw_point(bytes(public[Attribute.EC_POINT]))
    return private, VerifyKey(Ed25519PublicKey.from_public_bytes(raw))


def create_signing_key(module: str, token_label: str, pin: str, key_ref: str) -> str:
    """Make an Ed25519 key pair labelled `key_ref` on the token; its `ed25519:...` text.

    Refuses (KeyProviderError naming the label) when the token already holds a key labelled so.
    """
    created: VerifyKey | None = None
    with provider_errors(_PROVIDER, "create a signing key"):
        shared = _acquire(module, token_label, pin)
        try:
            with shared.lock:
                session = shared.session
                taken = _objects(session, key_ref, ObjectClass.PRIVATE_KEY) or _objects(
                    session, key_ref, ObjectClass.PUBLIC_KEY
                )
                if not taken:
                    ident = key_ref.encode("utf-8")
                    session.generate_keypair(
                        KeyType.EC_EDWARDS,
                        mechanism=Mechanism.EC_EDWARDS_KEY_PAIR_GEN,
                        label=key_ref,
                        id=ident,
                        store=True,
                        capabilities=MechanismFlag.SIGN | MechanismFlag.VERIFY,
                        public_template={Attribute.EC_PARAMS: _ED25519_OID},
                        private_template={
                            Attribute.PRIVATE: True,
                            Attribute.SENSITIVE: True,
                            Attribute.EXTRACTABLE: False,
                        },
                    )
                    _, created = _key_pair(session, key_ref)
        except _DEAD_SESSION:
            _discard(shared)
            raise
        finally:
            _release(shared)
    if created is None:
        raise KeyProviderError(f"pkcs11: the token already holds a key labelled {key_ref!r}")
    return created.text


class Pkcs11Signer:
    """Signs with the Ed25519 key pair labelled `key_ref` on a PKCS#11 token."""

    name: ClassVar[str] = _PROVIDER
    alg: Algorithm = "ed25519"
    local = False

    def __init__(self, module: str, token_label: str, pin: str, key_ref: str) -> None:
        self.module = module
        self.token_label = token_label
        self.key_ref = key_ref
        self._pin = pin
        self._lock = threading.Lock()
        self._shared: _Shared | None = None
        self._private: Any = None  # found in self._shared's session
        self._closed = False
        try:
            with provider_errors(self.name, "open a signing key"):
                self._private, self._verify_key = self._find(self._connection())
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:  # never the PIN
        return f"Pkcs11Signer(token_label={self.token_label!r}, key_ref={self.key_ref!r})"

    @property
    def verify_key(self) -> VerifyKey:
        return self._verify_key

    def _connection(self) -> _Shared:
        """The shared session (a fresh one after the last died; its key objects found again)."""
        with self._lock:
            if self._closed:
                raise _TokenError("the signer is closed")
            if self._shared is not None and not self._shared.alive:
                _release(self._shared)
                self._shared, self._private = None, None
            if self._shared is None:
                self._shared = _acquire(self.module, self.token_label, self._pin)
            return self._shared

    def _find(self, shared: _Shared) -> tuple[Any, VerifyKey]:
        try:
            with shared.lock:
                return _key_pair(shared.session, self.key_ref)
        except _DEAD_SESSION:
            _discard(shared)
            raise

    def _key(self) -> tuple[_Shared, Any]:
        shared = self._connection()
        with self._lock:
            private = self._private if self._shared is shared else None
        if private is None:
            private, verify_key = self._find(shared)
            if verify_key != self._verify_key:
                raise _TokenError(f"the key pair {self.key_ref!r} changed since the signer opened")
            with self._lock:
                if self._shared is shared:
                    self._private = private
        return shared, private

    def sign(self, message: bytes) -> bytes:
        with provider_errors(self.name, "sign"):
            shared, private = self._key()
            try:
                with shared.lock:
                    signature = bytes(private.sign(message, mechanism=Mechanism.EDDSA))
            except _DEAD_SESSION:
                _discard(shared)
                raise
            return _checked_signature(self._verify_key, signature, message)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._shared is not None:
                _release(self._shared)
                self._shared, self._private = None, None
