"""Key providers (KMS backends) behind one interface; see `_base.KeyProvider`.

`_PROVIDERS` below is the one list of providers: their names (as in `WrappedKey.provider` and
recipients) and classes.  Everything else derives from it: `PROVIDER_NAMES`, and the gateway,
which builds each provider from its configuration with the class `load_provider_class(name)`
gives (typed per name).

Each provider module imports its SDK itself, so a deployment that never names `aws-kms` never
imports boto3: the SDK-backed classes are reached through `load_provider_class(name)` or by
their module path (`bundles.kms.pkcs11`, `bundles.kms.vault`, `bundles.kms.aws`), never from here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Literal, overload

from ..errors import KeyProviderError
from ._base import DEK_BYTES, KeyProvider, WrappedKey, parse_recipient
from .local import LocalKeyProvider, init_key_file, rotate_key

if TYPE_CHECKING:  # for the overloads only: importing these at run time imports their SDKs
    from .aws import AwsKmsProvider
    from .pkcs11 import Pkcs11KeyProvider
    from .vault import VaultTransitProvider

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


# The overloads give each known name its class, so a caller constructing one is type-checked.
@overload
def load_provider_class(name: Literal["local"]) -> type[LocalKeyProvider]: ...
@overload
def load_provider_class(name: Literal["pkcs11"]) -> type[Pkcs11KeyProvider]: ...
@overload
def load_provider_class(name: Literal["vault-transit"]) -> type[VaultTransitProvider]: ...
@overload
def load_provider_class(name: Literal["aws-kms"]) -> type[AwsKmsProvider]: ...
@overload
def load_provider_class(name: str) -> type[KeyProvider]: ...


def load_provider_class(name: str) -> type[KeyProvider]:
    """The provider class called `name`, importing its module (and SDK) only now.

    Raises KeyProviderError for an unknown name or a provider whose SDK is not installed.
    """
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
