"""Bundle errors.  One tree; the gateway and the CLI translate it, nothing else.

    BundleError                      anything that stops a bundle being sealed, opened or checked
    ├── BundleFormatError            not a bundle of a version we read (missing file, bad JSON)
    ├── BundleIntegrityError         any byte differs from what was signed or sealed; `reason`
    │                                is a short code for the log, the message stays generic
    ├── BundleSignatureError         missing signature, or not made by a pinned trusted key
    ├── BundlePolicyError            expired, not yet valid, engine or provider not allowed
    ├── KeyProviderError             a KMS call failed; the message never says why (the log does)
    │   └── KeyUnwrapError           the data key could not be unwrapped
    └── SigningKeyError              a signing or trusted key file is unreadable or malformed

Messages never contain key material, wrapped keys, tokens or plaintext.
"""

from __future__ import annotations

__all__ = [
    "BundleError",
    "BundleFormatError",
    "BundleIntegrityError",
    "BundlePolicyError",
    "BundleSignatureError",
    "KeyProviderError",
    "KeyUnwrapError",
    "SigningKeyError",
]


class BundleError(Exception):
    """Base of every bundle failure."""


class BundleFormatError(BundleError):
    """The input is not a bundle this version reads."""


class BundleIntegrityError(BundleError):
    """Ciphertext, manifest or plaintext failed a check.

    `reason` names which check (for logs and tests); the message is deliberately the same for
    every reason, so an attacker probing a loader learns nothing about which byte was wrong.
    """

    def __init__(self, reason: str, *, file: str | None = None) -> None:
        where = f" ({file})" if file else ""
        super().__init__(f"bundle integrity check failed{where}")
        self.reason = reason
        self.file = file


class BundleSignatureError(BundleError):
    """The manifest signature is missing, malformed or not from a trusted key."""


class BundlePolicyError(BundleError):
    """The bundle is valid but may not be used here and now."""


class KeyProviderError(BundleError):
    """A key provider operation failed.  Details go to the log, never into the message."""


class KeyUnwrapError(KeyProviderError):
    """No recipient could unwrap the bundle's data key."""

    def __init__(self, message: str = "the bundle's data key could not be unwrapped") -> None:
        super().__init__(message)


class SigningKeyError(BundleError):
    """A signing key or trusted public key could not be read."""
