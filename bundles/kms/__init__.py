"""Key providers (KMS backends) behind one interface; see `_base.KeyProvider`.

Each provider module imports its SDK itself, so a deployment that never names `aws-kms` never
imports boto3: the SDK-backed classes are reached through `load_provider_class(name)` or by
their module path (`bundles.kms.pkcs11`, `bundles.kms.vault`, `bundles.kms.aws`), never from here.
"""

from __future__ import annotations

import importlib

from ..errors import KeyProviderError
from ._base import DEK_BYTES, KeyProvider, WrappedKey, parse_recipient
from .local import LocalKeyProvider, init_key_file, rotate_key

__all__ = [
    "DEK_BYTES",
    "PROVIDER_NAMES",
    "KeyProvider",
    "LocalKeyProvider",
    "WrappedKey",
    "init_key_file",
    "load_provider_class",
    "parse_recipient",
    "rotate_key",
]

# provider name (as in WrappedKey.provider and recipients) -> (module, class)
_PROVIDERS: dict[str, tuple[str, str]] = {
    "local": (".local", "LocalKeyProvider"),
    "pkcs11": (".pkcs11", "Pkcs11KeyProvider"),
    "vault-transit": (".vault", "VaultTransitProvider"),
    "aws-kms": (".aws", "AwsKmsProvider"),
}
PROVIDER_NAMES: tuple[str, ...] = tuple(_PROVIDERS)


def load_provider_class(name: str) -> type[KeyProvider]:
    """The provider class called `name`, importing its module (and SDK) only now."""
    try:
        module_name, class_name = _PROVIDERS[name]
    except KeyError:
        raise KeyProviderError(
            f"unknown key provider {name!r} (known: {', '.join(PROVIDER_NAMES)})"
        ) from None
    try:
        module = importlib.import_module(module_name, __name__)
    except ImportError as exc:
        raise KeyProviderError(
            f"key provider {name!r} needs the package {exc.name!r}, which is not installed"
        ) from None
    cls: type[KeyProvider] = getattr(module, class_name)
    return cls
