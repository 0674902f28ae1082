"""The audit checkpoint signer from configuration: `[audit.signer]` names the provider and the
key, `[kms.*]` says how to reach the provider (as for the key providers of bundles).

    provider        key_ref                          signs with
    local           a key file (default: the data    an Ed25519 PEM file, 0600; created on
                    dir's keys/audit-signing.key)    first use at the default path only
    pkcs11          the key pair's CKA_LABEL         Ed25519 on the HSM ([kms.pkcs11])
    vault-transit   the Transit key name             ed25519 Transit key ([kms.vault_transit])
    aws-kms         key id, ARN or alias/<name>      ECC_NIST_P256 KMS key ([kms.aws_kms])

Everyone who can write the data directory can sign with a local key file, so only a remote
provider makes checkpoints whose signatures the data directory cannot forge.  Each remote
signer's module (and its SDK) is imported only when it is configured.  The HSM PIN and the
Vault token come from the environment variables `[kms.*]` names, never from the file.

Opening a remote signer calls the provider (to read the public key): it blocks; the app opens
it in a worker thread.  Configuration mistakes are `ConfigError`s naming the key to fix;
provider failures are the generic `KeyProviderError` of `bundles.kms`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

from bundles import KeyProviderError, create_signing_key, public_key_text
from bundles.kms.signer import LocalSigner, Signer

from ..config import ConfigError, Settings

__all__ = [
    "create_audit_signing_key",
    "default_audit_key_file",
    "open_audit_signer",
    "secret_from_env",
]

T = TypeVar("T")


def default_audit_key_file(settings: Settings) -> Path:
    """Where the local signer keeps its key when `[audit.signer] key_ref` is empty."""
    return Path(settings.data_dir) / "keys" / "audit-signing.key"


def _local_key_file(settings: Settings) -> tuple[Path, bool]:
    """(key file, whether it is the default one, which is created on first use)."""
    key_ref = settings.audit.signer.key_ref
    return (Path(key_ref), False) if key_ref else (default_audit_key_file(settings), True)


def secret_from_env(variable: str, what: str) -> str:
    """A provider secret (PIN, token) from its variable; never from the configuration file."""
    value = os.environ.get(variable)
    if not value:
        raise KeyProviderError(f"{what} is read from ${variable}, which is not set")
    return value


def _section(value: T | None, provider: str, name: str) -> T:
    if value is None:
        raise ConfigError(
            f'[audit.signer] provider = "{provider}" needs a {name} section saying how to reach '
            "it (the one bundles' key providers use)"
        )
    return value


def _key_ref(settings: Settings) -> str:
    signer = settings.audit.signer
    if not signer.key_ref:
        raise ConfigError(
            f"[audit.signer] key_ref must name the signing key in {signer.provider} "
            f'(provider = "{signer.provider}")'
        )
    return signer.key_ref


@contextlib.contextmanager
def _sdk(provider: str) -> Iterator[None]:
    """A signer module whose SDK is not installed: say which package is missing."""
    try:
        yield
    except ImportError as exc:
        raise KeyProviderError(
            f"the {provider} signer needs the package {exc.name!r}, which is not installed"
        ) from None


def open_audit_signer(settings: Settings, *, create_default: bool = True) -> Signer:
    """The signer `[audit.signer]` configures, opened (its public key read); close it after use.

    The default local key file is created on first use unless `create_default` is false.
    Blocking.  Raises ConfigError for a configuration that cannot name or reach the key,
    KeyProviderError (generic) when the provider fails, SigningKeyError for a bad key file.
    """
    provider, kms = settings.audit.signer.provider, settings.kms
    if provider == "local":
        path, default = _local_key_file(settings)
        return LocalSigner.from_file(path, create=default and create_default)
    key_ref = _key_ref(settings)
    with _sdk(provider):
        if provider == "pkcs11":
            p11 = _section(kms.pkcs11, provider, "[kms.pkcs11]")
            from bundles.kms.pkcs11_signer import Pkcs11Signer

            pin = secret_from_env(p11.pin_env, "the PKCS#11 PIN")
            return Pkcs11Signer(p11.module, p11.token_label, pin, key_ref)
        if provider == "vault-transit":
            vault = _section(kms.vault_transit, provider, "[kms.vault_transit]")
            from bundles.kms.vault_signer import VaultTransitSigner

            return VaultTransitSigner(
                vault.address,
                secret_from_env(vault.token_env, "the Vault token"),
                key_ref,
                mount=vault.mount,
                namespace=vault.namespace,
                ca_cert=vault.ca_cert,
                timeout_s=vault.timeout_s,
            )
        aws = _section(kms.aws_kms, provider, "[kms.aws_kms]")
        from bundles.kms.aws_signer import AwsKmsSigner

        return AwsKmsSigner(
            key_ref, region=aws.region, endpoint_url=aws.endpoint_url, profile=aws.profile
        )


def create_audit_signing_key(settings: Settings) -> str:
    """Create the key `[audit.signer]` names, in its provider; the public key text to pin.

    Never replaces a key: an existing key file, HSM label, Transit key or KMS alias is an
    error (`open_audit_signer(...).verify_key` gives its public key).  On AWS KMS the key ref
    must be an alias (`alias/<name>`): KMS chooses key ids itself.
    """
    provider, kms = settings.audit.signer.provider, settings.kms
    if provider == "local":
        path, _ = _local_key_file(settings)
        return public_key_text(create_signing_key(path))
    key_ref = _key_ref(settings)
    with _sdk(provider):
        if provider == "pkcs11":
            p11 = _section(kms.pkcs11, provider, "[kms.pkcs11]")
            from bundles.kms import pkcs11_signer

            pin = secret_from_env(p11.pin_env, "the PKCS#11 PIN")
            return pkcs11_signer.create_signing_key(p11.module, p11.token_label, pin, key_ref)
        if provider == "vault-transit":
            vault = _section(kms.vault_transit, provider, "[kms.vault_transit]")
            from bundles.kms import vault_signer

            return vault_signer.create_signing_key(
                vault.address,
                secret_from_env(vault.token_env, "the Vault token"),
                key_ref,
                mount=vault.mount,
                namespace=vault.namespace,
                ca_cert=vault.ca_cert,
                timeout_s=vault.timeout_s,
            )
        aws = _section(kms.aws_kms, provider, "[kms.aws_kms]")
        if not key_ref.startswith("alias/"):
            raise ConfigError(
                "[audit.signer] key_ref must be an alias (alias/<name>) to create a key in "
                "aws-kms: KMS chooses key ids itself"
            )
        from bundles.kms import aws_signer

        return aws_signer.create_signing_key(
            key_ref, region=aws.region, endpoint_url=aws.endpoint_url, profile=aws.profile
        )
