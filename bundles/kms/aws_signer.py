"""`aws-kms` signing keys: an asymmetric KMS key signs audit checkpoints.

The key is ECC_NIST_P256 with KeyUsage SIGN_VERIFY, signing with ECDSA_SHA_256 and MessageType
RAW (KMS hashes the message; the signature is DER), so its `VerifyKey` is `ecdsa-p256:...`.
KMS also offers Ed25519 keys (ECC_NIST_EDWARDS25519); moto, the fake AWS the tests run against
(5.2 when this was written), does not, and an untested algorithm does not sign our audit log.

At open the signer asks GetPublicKey for `key_ref` (key id, ARN or alias) and from then on
signs with the key id KMS answered, never with the alias: an alias moved to another key later
cannot change the key a running signer signs with.  RAW messages are at most 4096 bytes in KMS;
a checkpoint is a few hundred.  `create_signing_key` makes a key and names it with an alias (KMS
chooses key ids itself, so an alias is what the configuration can name in advance).
Credentials and the client are the key provider's (`aws._new_client`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, ClassVar

from botocore.exceptions import ClientError
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ..errors import KeyProviderError
from ._base import provider_errors
from .aws import _client_config, _KmsError, _new_client
from .signer import Algorithm, VerifyKey, _checked_signature

__all__ = ["AwsKmsSigner", "create_signing_key"]

_PROVIDER = "aws-kms"
_KEY_SPEC = "ECC_NIST_P256"
_SIGNING_ALGORITHM = "ECDSA_SHA_256"
_MAX_RAW_MESSAGE = 4096


def _pinned_key(response: Mapping[str, Any]) -> tuple[str, VerifyKey]:
    """(key id, public key) from a GetPublicKey answer for a P-256 signing key."""
    key_id, der = response.get("KeyId"), response.get("PublicKey")
    spec = response.get("KeySpec") or response.get("CustomerMasterKeySpec")
    if spec != _KEY_SPEC or response.get("KeyUsage") != "SIGN_VERIFY":
        raise _KmsError(f"the key is {spec!r} for {response.get('KeyUsage')!r}, not P-256 signing")
    if _SIGNING_ALGORITHM not in (response.get("SigningAlgorithms") or ()):
        raise _KmsError("the key does not sign with ECDSA_SHA_256")
    if not isinstance(key_id, str) or not key_id or not isinstance(der, bytes):
        raise _KmsError("KMS answer lacks KeyId or PublicKey")
    public = serialization.load_der_public_key(der)
    if not isinstance(public, ec.EllipticCurvePublicKey):
        raise _KmsError("the public key is not an EC key")
    return key_id, VerifyKey(public)


def _is_alias(key_ref: str) -> bool:
    return key_ref.startswith("alias/") and not key_ref.startswith("alias/aws/")


def create_signing_key(
    alias: str,
    *,
    region: str,
    endpoint_url: str | None = None,
    profile: str | None = None,
    connect_timeout_s: float = 5,
    read_timeout_s: float = 10,
    max_attempts: int = 2,
) -> str:
    """Create a P-256 signing key named by `alias` (`alias/<name>`); its `ecdsa-p256:...` text.

    Refuses (KeyProviderError naming the alias) when the alias already names a key.
    """
    if not _is_alias(alias):
        raise KeyProviderError("aws-kms: a new signing key is named by an alias, alias/<name>")
    created: VerifyKey | None = None
    with provider_errors(_PROVIDER, "create a signing key"):
        config = _client_config(region, connect_timeout_s, read_timeout_s, max_attempts)
        kms = _new_client(region, endpoint_url, profile, config)
        try:
            try:
                kms.describe_key(KeyId=alias)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "NotFoundException":
                    raise
                created = _create(kms, alias)
        finally:
            kms.close()
    if created is None:
        raise KeyProviderError(f"aws-kms: the alias {alias!r} already names a key")
    return created.text


def _create(kms: Any, alias: str) -> VerifyKey:
    key_id = kms.create_key(
        KeySpec=_KEY_SPEC,
        KeyUsage="SIGN_VERIFY",
        Description="airgate audit checkpoint signing key",
    )["KeyMetadata"]["KeyId"]
    try:
        kms.create_alias(AliasName=alias, TargetKeyId=key_id)
    except BaseException:
        # a key no alias names would be billed and forgotten: schedule its deletion
        kms.schedule_key_deletion(KeyId=key_id, PendingWindowInDays=7)
        raise
    _, verify_key = _pinned_key(kms.get_public_key(KeyId=key_id))
    return verify_key


class AwsKmsSigner:
    """Signs with the P-256 KMS key `key_ref` resolves to at open (key id, ARN or alias)."""

    name: ClassVar[str] = _PROVIDER
    alg: Algorithm = "ecdsa-p256-sha256"
    local = False

    def __init__(
        self,
        key_ref: str,
        *,
        region: str,
        endpoint_url: str | None = None,
        profile: str | None = None,
        connect_timeout_s: float = 5,
        read_timeout_s: float = 10,
        max_attempts: int = 2,
    ) -> None:
        self.key_ref = key_ref
        self.region = region
        self.endpoint_url = endpoint_url
        self._lock = threading.Lock()  # boto3 clients are thread-safe; the lock guards close()
        self._client: Any = None
        with provider_errors(self.name, "open a signing key"):
            config = _client_config(region, connect_timeout_s, read_timeout_s, max_attempts)
            self._client = _new_client(region, endpoint_url, profile, config)
            try:
                self.key_id, self._verify_key = _pinned_key(
                    self._client.get_public_key(KeyId=key_ref)
                )
            except BaseException:
                self._client.close()
                raise

    def __repr__(self) -> str:
        return f"AwsKmsSigner(region={self.region!r}, key_ref={self.key_ref!r})"

    @property
    def verify_key(self) -> VerifyKey:
        return self._verify_key

    def sign(self, message: bytes) -> bytes:
        with provider_errors(self.name, "sign"):
            if len(message) > _MAX_RAW_MESSAGE:
                raise _KmsError(f"KMS signs at most {_MAX_RAW_MESSAGE} bytes of RAW message")
            with self._lock:
                kms = self._client
            if kms is None:
                raise _KmsError("the signer is closed")
            response = kms.sign(
                KeyId=self.key_id,
                Message=message,
                MessageType="RAW",
                SigningAlgorithm=_SIGNING_ALGORITHM,
            )
            signature = response.get("Signature")
            if not isinstance(signature, bytes):
                raise _KmsError("KMS answer lacks Signature")
            return _checked_signature(self._verify_key, signature, message)

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
