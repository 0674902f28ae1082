"""Authentication errors.  One tree; the HTTP layer renders every `AuthenticationFailed` as the
same 401 text, the audit log records its `reason`.

    AuthError                        base; never raised bare
    ├── AuthenticationFailed         the credential does not identify anyone; `reason` is a short
    │   │                            code for the audit log, the message is always the same
    │   ├── MalformedKey             malformed_key: not an airgate API key (shape or checksum)
    │   ├── UnknownKey               unknown_key: well-formed key whose id is not stored
    │   ├── WrongSecret              wrong_secret: known id, secret does not match
    │   ├── KeyRevoked               key_revoked: correct secret, key revoked
    │   ├── KeyExpired               key_expired: correct secret, key past its expiry
    │   ├── InvalidToken             a JWT was rejected; `reason` says which check
    │   │                            (too_large, malformed, alg_not_allowed, missing_kid,
    │   │                            unknown_kid, bad_signature, expired, not_yet_valid,
    │   │                            wrong_issuer, wrong_audience, missing_claim, bad_claim)
    │   └── InvalidCertificate       a client certificate was rejected
    │                                (malformed_certificate, unknown_certificate)
    ├── AuthConfigError              auth configuration is unusable (pepper file, JWKS file,
    │                                certificate subject map); raised at start-up, names the file
    └── KeyStoreUnavailable          the key database failed: not the caller's fault (503)

Messages never contain a key, a secret, a token or a claim value: a client's credential must not
reach a log through an exception.  Revoked and expired are only reported after the secret was
checked, so a key id alone never tells its holder anything about the key.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AuthConfigError",
    "AuthError",
    "AuthenticationFailed",
    "InvalidCertificate",
    "InvalidToken",
    "KeyExpired",
    "KeyRevoked",
    "KeyStoreUnavailable",
    "MalformedKey",
    "UnknownKey",
    "WrongSecret",
]

GENERIC_MESSAGE = "authentication failed"


class AuthError(Exception):
    """Base of every auth failure."""


class AuthenticationFailed(AuthError):
    """The presented credential does not authenticate a principal.

    `reason` names the failed check for the audit log and tests; the message is the same for
    every reason so that a client probing credentials learns nothing from it.
    """

    reason: str
    default_reason: ClassVar[str] = "authentication_failed"

    def __init__(self, reason: str | None = None) -> None:
        super().__init__(GENERIC_MESSAGE)
        self.reason = reason or self.default_reason


class MalformedKey(AuthenticationFailed):
    default_reason = "malformed_key"


class UnknownKey(AuthenticationFailed):
    default_reason = "unknown_key"


class WrongSecret(AuthenticationFailed):
    default_reason = "wrong_secret"


class KeyRevoked(AuthenticationFailed):
    default_reason = "key_revoked"


class KeyExpired(AuthenticationFailed):
    default_reason = "key_expired"


class InvalidToken(AuthenticationFailed):
    default_reason = "invalid_token"


class InvalidCertificate(AuthenticationFailed):
    default_reason = "invalid_certificate"


class AuthConfigError(AuthError):
    """Auth configuration (a file or a mapping) cannot be used; the message names which."""


class KeyStoreUnavailable(AuthError):
    """The key database could not be used; the cause is chained, the message stays generic."""

    def __init__(self, message: str = "the API key store is unavailable") -> None:
        super().__init__(message)
