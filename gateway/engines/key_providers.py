"""Key providers from configuration: the one place that picks concrete KMS backends.

Which providers exist, and their classes, is `bundles.kms`'s list (`load_provider_class`); this
module only builds each configured one from its settings.  Providers are built on first use, and
their classes loaded then, so a gateway whose bundles only name `local` never loads a PKCS#11
module or boto3.  Secrets (HSM PIN, Vault token) come from environment variables the
configuration names, never from the file.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from bundles import KeyProvider, KeyProviderError
from bundles.kms import load_provider_class

from ..access.audit_signer import secret_from_env
from ..config import Settings

__all__ = ["KeyProviders", "local_key_file", "rotate_provider_key"]

_log = logging.getLogger("airgate.kms")


def local_key_file(settings: Settings) -> Path:
    return Path(settings.kms.local.key_file or Path(settings.data_dir) / "keys" / "kms-local.json")


class KeyProviders(Mapping[str, KeyProvider]):
    """provider name -> provider, for the providers the configuration defines."""

    def __init__(self, settings: Settings) -> None:
        kms = settings.kms
        factories: dict[str, Callable[[], KeyProvider]] = {
            "local": lambda: load_provider_class("local")(local_key_file(settings))
        }
        if (p11 := kms.pkcs11) is not None:

            def pkcs11() -> KeyProvider:
                cls = load_provider_class("pkcs11")
                pin = secret_from_env(p11.pin_env, "the PKCS#11 PIN")
                return cls(p11.module, p11.token_label, pin)

            factories["pkcs11"] = pkcs11
        if (vault := kms.vault_transit) is not None:

            def vault_transit() -> KeyProvider:
                return load_provider_class("vault-transit")(
                    vault.address,
                    secret_from_env(vault.token_env, "the Vault token"),
                    mount=vault.mount,
                    namespace=vault.namespace,
                    ca_cert=vault.ca_cert,
                    timeout_s=vault.timeout_s,
                )

            factories["vault-transit"] = vault_transit
        if (aws := kms.aws_kms) is not None:

            def aws_kms() -> KeyProvider:
                return load_provider_class("aws-kms")(
                    region=aws.region, endpoint_url=aws.endpoint_url, profile=aws.profile
                )

            factories["aws-kms"] = aws_kms
        self._factories = factories
        self._built: dict[str, KeyProvider] = {}

    def __getitem__(self, name: str) -> KeyProvider:
        if name not in self._built:
            factory = self._factories[name]
            try:
                self._built[name] = factory()
            except KeyProviderError:
                raise
            except Exception as exc:  # an SDK that cannot start: say which, not its text
                _log.warning("kms %s could not start: %s", name, type(exc).__name__)
                raise KeyProviderError(f"key provider {name!r} could not start") from None
        return self._built[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._factories)

    def __len__(self) -> int:
        return len(self._factories)

    def close(self) -> None:
        for provider in self._built.values():
            provider.close()
        self._built.clear()


def rotate_provider_key(settings: Settings, provider: str, key_ref: str) -> str:
    """Add a new version of a key-encryption key; returns a line saying what happened.

    `bundle rekey --rewrap` then moves bundles onto it.  AWS KMS rotates its keys itself.
    """
    from bundles.kms import rotate_key

    if provider == "local":
        version = rotate_key(local_key_file(settings), key_ref)
        return f"local:{key_ref} is now at version {version}"
    if provider == "pkcs11" and (p11 := settings.kms.pkcs11) is not None:
        from bundles.kms.pkcs11 import create_key

        version = create_key(
            p11.module, p11.token_label, secret_from_env(p11.pin_env, "the PIN"), key_ref
        )
        return f"pkcs11:{key_ref} is now at version {version}"
    if provider == "vault-transit" and (vault := settings.kms.vault_transit) is not None:
        from bundles.kms.vault import rotate_key as rotate_transit_key

        rotate_transit_key(
            vault.address,
            secret_from_env(vault.token_env, "the Vault token"),
            key_ref,
            mount=vault.mount,
            namespace=vault.namespace,
            ca_cert=vault.ca_cert,
            timeout_s=vault.timeout_s,
        )
        return f"vault-transit:{key_ref} rotated"
    if provider == "aws-kms":
        raise KeyProviderError(
            "AWS KMS rotates key material itself; to move bundles to another key, "
            "`bundle rekey --add aws-kms:<new key> --remove aws-kms:<old key>`"
        )
    raise KeyProviderError(f"key provider {provider!r} is not configured")
