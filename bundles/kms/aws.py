"""`aws-kms`: key-encryption keys in AWS KMS (reached through a VPC endpoint in an air gap).

The context is passed as KMS's EncryptionContext, which KMS binds into the ciphertext as
associated data: a wrap presented with another context fails inside KMS.  EncryptionContext is
logged in plaintext by CloudTrail, which is why contexts carry ids, never secrets.

`wrapped` is base64 of KMS's CiphertextBlob; `key_version` is the key ARN KMS answers with.  KMS
rotates key material behind one ARN, so "rotating" here means rewrapping to another key
(`rewrap(..., key_ref=other)`, one ReEncrypt call, the DEK never leaving KMS).  Credentials come
from boto3's normal chain (environment, profile, instance role); `endpoint_url` points at a VPC
endpoint (or at moto's server in tests).

botocore logs whole request and response bodies at DEBUG (with them the plaintext DEK and the
ciphertext), so making a client raises the `botocore` logger to INFO: a root logger at DEBUG must
not leak keys.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any, ClassVar

import boto3
from botocore.config import Config

from ._base import DEK_BYTES, WrappedKey, b64d, b64e, provider_errors

__all__ = ["AwsKmsProvider"]

_ALGORITHM = "aws-kms"


class _KmsError(Exception):
    """A check of ours on a KMS answer failed; its text goes to the log, never further."""


def _client_config(
    region: str, connect_timeout_s: float, read_timeout_s: float, max_attempts: int
) -> Config:
    return Config(
        region_name=region,
        connect_timeout=connect_timeout_s,
        read_timeout=read_timeout_s,
        retries={"max_attempts": max_attempts, "mode": "standard"},
    )


def _new_client(region: str, endpoint_url: str | None, profile: str | None, config: Config) -> Any:
    """A KMS client, botocore's logger first raised to INFO (see the module docstring)."""
    sdk_log = logging.getLogger("botocore")
    if sdk_log.level < logging.INFO:  # NOTSET or DEBUG: both would log bodies
        sdk_log.setLevel(logging.INFO)
    session = boto3.session.Session(profile_name=profile, region_name=region)
    return session.client("kms", endpoint_url=endpoint_url, config=config)


def _blob_and_key(response: Mapping[str, Any]) -> tuple[bytes, str]:
    blob, key_id = response.get("CiphertextBlob"), response.get("KeyId")
    if not isinstance(blob, bytes) or not isinstance(key_id, str) or not key_id:
        raise _KmsError("KMS answer lacks CiphertextBlob or KeyId")
    return blob, key_id


class AwsKmsProvider:
    """Wraps DEKs with AWS KMS keys.  The boto3 client is made on first use, then shared."""

    name: ClassVar[str] = "aws-kms"

    def __init__(
        self,
        *,
        region: str,
        endpoint_url: str | None = None,
        profile: str | None = None,
        connect_timeout_s: float = 5,
        read_timeout_s: float = 10,
        max_attempts: int = 2,
    ) -> None:
        self.region = region
        self.endpoint_url = endpoint_url
        self.profile = profile
        self._config = _client_config(region, connect_timeout_s, read_timeout_s, max_attempts)
        self._client: Any = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"AwsKmsProvider(region={self.region!r}, endpoint_url={self.endpoint_url!r})"

    def _kms(self) -> Any:
        """The KMS client (boto3 clients are thread-safe once made; making one is not)."""
        with self._lock:
            if self._client is None:
                self._client = _new_client(
                    self.region, self.endpoint_url, self.profile, self._config
                )
            return self._client

    def _wrapped(
        self, key_ref: str, response: Mapping[str, Any], context: Mapping[str, str]
    ) -> WrappedKey:
        blob, key_id = _blob_and_key(response)
        return WrappedKey(
            provider=self.name,
            key_ref=key_ref,
            key_version=key_id,
            algorithm=_ALGORITHM,
            wrapped=b64e(blob),
            context=dict(context),
        )

    def _encrypt(
        self, key_ref: str, dek: bytes | bytearray, context: Mapping[str, str]
    ) -> WrappedKey:
        if len(dek) != DEK_BYTES:
            raise _KmsError("a data key must be 32 bytes")
        response = self._kms().encrypt(
            KeyId=key_ref, Plaintext=bytes(dek), EncryptionContext=dict(context)
        )
        return self._wrapped(key_ref, response, context)

    def _checked(self, wrapped: WrappedKey) -> bytes:
        if wrapped.provider != self.name or wrapped.algorithm != _ALGORITHM:
            raise _KmsError("not an aws-kms wrap")
        return b64d(wrapped.wrapped)

    def generate_data_key(
        self, key_ref: str, context: Mapping[str, str]
    ) -> tuple[bytearray, WrappedKey]:
        with provider_errors(self.name, "generate a data key"):
            response = self._kms().generate_data_key(
                KeyId=key_ref, KeySpec="AES_256", EncryptionContext=dict(context)
            )
            dek = bytearray(response["Plaintext"])
            if len(dek) != DEK_BYTES:
                raise _KmsError("KMS returned a data key of the wrong size")
            return dek, self._wrapped(key_ref, response, context)

    def wrap(self, key_ref: str, dek: bytes | bytearray, context: Mapping[str, str]) -> WrappedKey:
        with provider_errors(self.name, "wrap"):
            return self._encrypt(key_ref, dek, context)

    def unwrap(self, wrapped: WrappedKey, context: Mapping[str, str]) -> bytearray:
        with provider_errors(self.name, "unwrap"):
            response = self._kms().decrypt(
                CiphertextBlob=self._checked(wrapped),
                KeyId=wrapped.key_version,
                EncryptionContext=dict(context),
            )
            # bytes from the SDK cannot be wiped; the bytearray we return can be.
            dek = bytearray(response["Plaintext"])
            if response.get("KeyId") != wrapped.key_version or len(dek) != DEK_BYTES:
                dek[:] = bytes(len(dek))
                raise _KmsError("KMS decrypted with another key than the wrap names")
            return dek

    def rewrap(
        self, wrapped: WrappedKey, context: Mapping[str, str], key_ref: str | None = None
    ) -> WrappedKey:
        with provider_errors(self.name, "rewrap"):
            destination = key_ref or wrapped.key_ref
            response = self._kms().re_encrypt(
                CiphertextBlob=self._checked(wrapped),
                SourceKeyId=wrapped.key_version,
                SourceEncryptionContext=dict(context),
                DestinationKeyId=destination,
                DestinationEncryptionContext=dict(context),
            )
            if response.get("SourceKeyId") != wrapped.key_version:
                raise _KmsError("KMS decrypted with another key than the wrap names")
            return self._wrapped(destination, response, context)

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
