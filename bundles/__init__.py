"""Signed, KMS-encrypted model bundles: the only way weights enter airgate.

`seal_bundle` encrypts model files under a fresh data key wrapped by KMS recipients and signs the
manifest; `open_bundle` checks everything and decrypts into memory that is never persistent disk;
`verify_bundle` does the keyless checks; `rekey_bundle` changes recipients without touching the
payload; `create_renewal` / `verify_renewal` extend a bundle's offline window, signed at HQ.
There are no algorithm choices here: the format fixes them (see `manifest.py`).
"""

from .errors import (
    BundleError,
    BundleFormatError,
    BundleIntegrityError,
    BundlePolicyError,
    BundleSignatureError,
    KeyProviderError,
    KeyUnwrapError,
    SigningKeyError,
)
from .kms import KeyProvider, LocalKeyProvider, WrappedKey, init_key_file, parse_recipient
from .loader import (
    OpenedModel,
    VerifiedBundle,
    check_bundle,
    decrypt_check,
    open_bundle,
    read_manifest,
    verify_bundle,
)
from .manifest import FORMAT, Manifest, ModelInfo
from .renewal import (
    RENEWAL_FORMAT,
    Renewal,
    VerifiedRenewal,
    create_renewal,
    offline_window,
    verify_renewal,
)
from .sealer import SourceFile, rekey_bundle, seal_bundle, sources_from_path
from .signing import (
    TrustedKeys,
    create_signing_key,
    key_id,
    load_signing_key,
    parse_public_key,
    public_key_text,
)

__all__ = [
    "FORMAT",
    "RENEWAL_FORMAT",
    "BundleError",
    "BundleFormatError",
    "BundleIntegrityError",
    "BundlePolicyError",
    "BundleSignatureError",
    "KeyProvider",
    "KeyProviderError",
    "KeyUnwrapError",
    "LocalKeyProvider",
    "Manifest",
    "ModelInfo",
    "OpenedModel",
    "Renewal",
    "SigningKeyError",
    "SourceFile",
    "TrustedKeys",
    "VerifiedBundle",
    "VerifiedRenewal",
    "WrappedKey",
    "check_bundle",
    "create_renewal",
    "create_signing_key",
    "decrypt_check",
    "init_key_file",
    "key_id",
    "load_signing_key",
    "offline_window",
    "open_bundle",
    "parse_public_key",
    "parse_recipient",
    "public_key_text",
    "read_manifest",
    "rekey_bundle",
    "seal_bundle",
    "sources_from_path",
    "verify_bundle",
    "verify_renewal",
]
