"""Key providers from configuration: the one place that picks concrete KMS backends.

Providers are built on first use, so a gateway whose bundles only name `local` never loads a
PKCS#11 module or boto3.  Secrets (HSM PIN, Vault token) come from environment variables the
configuration names, never from the file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from bundles import KeyProvider, KeyProviderError, LocalKeyProvider

from .config import Settings

__all__ = ["KeyProviders", "local_key_file"]


def local_key_file(settings: Settings) -> Path:
    return Path(settings.kms.local.key_file or Path(settings.data_dir) / "keys" / "kms-local.json")


def _secret(variable: str, what: str) -> str:
    value = os.environ.get(variable)
    if not value:
        raise KeyProviderError(f"{what} is read from ${variable}, which is not set")
    return value


class KeyProviders(Mapping[str, KeyProvider]):
    """provider name -> provider, for the providers the configuration defines."""

    def __init__(self, settings: Settings) -> None:
        kms = settings.kms
        factories: dict[str, Callable[[], KeyProvider]] = {
            "local": lambda: LocalKeyProvider(local_key_file(settings))
        }
        if (p11 := kms.pkcs11) is not None:

            def pkcs11() -> KeyProvider:
                from bundles.kms.pkcs11 import Pkcs11KeyProvider

                pin = _secret(p11.pin_env, "the PKCS#11 PIN")
                return Pkcs11KeyProvider(p11.module, p11.token_label, pin)

            factories["pkcs11"] = pkcs11
        if (vault := kms.vault_transit) is not None:

            def vault_transit() -> KeyProvider:
                from bundles.kms.vault import VaultTransitProvider

                return VaultTransitProvider(
                    vault.address,
                    _secret(vault.token_env, "the Vault token"),
                    mount=vault.mount,
                    namespace=vault.namespace,
                    ca_cert=vault.ca_cert,
                    timeout_s=vault.timeout_s,
                )

            factories["vault-transit"] = vault_transit
        if (aws := kms.aws_kms) is not None:

            def aws_kms() -> KeyProvider:
                from bundles.kms.aws import AwsKmsProvider

                return AwsKmsProvider(
                    region=aws.region, endpoint_url=aws.endpoint_url, profile=aws.profile
                )

            factories["aws-kms"] = aws_kms
        self._factories = factories
        self._built: dict[str, KeyProvider] = {}

    def __getitem__(self, name: str) -> KeyProvider:
        if name not in self._built:
            self._built[name] = self._factories[name]()
        return self._built[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._factories)

    def __len__(self) -> int:
        return len(self._factories)

    def close(self) -> None:
        for provider in self._built.values():
            provider.close()
        self._built.clear()
