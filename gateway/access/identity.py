"""Who is calling: a credential -> a `Principal`, or `AuthFailed` with a reason code.

The credential decides the method: `Authorization: Bearer ag_...` is an API key, a bearer with
two dots a JWT (when configured), none with a verified client certificate an mTLS principal.
The reason goes to the audit log; the HTTP answer is one fixed 401 (see gateway/http/authn.py).
"""

from __future__ import annotations

from ..audit import AuditPrincipal
from .auth import Principal, principal_from_client_cert
from .stack import Security

__all__ = ["AuthFailed", "audit_principal", "authenticate"]

_MAX_CREDENTIAL = 16 * 1024


class AuthFailed(Exception):
    """No usable credential; `reason` is a short code for the audit log."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


async def authenticate(
    security: Security, authorization: bytes | None, client_cert_pem: str | None
) -> Principal:
    """The caller, from the Authorization header (first) or the verified client certificate.
    Raises AuthFailed, an `AuthenticationFailed` of the key store / JWT / mTLS checks, or
    KeyStoreUnavailable."""
    if authorization:
        if len(authorization) > _MAX_CREDENTIAL:
            raise AuthFailed("too_large")
        scheme, _, token = authorization.decode("latin-1").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise AuthFailed("unsupported_scheme")
        if token.startswith("ag_"):
            return await security.keys.authenticate(token)
        if security.jwt is not None and token.count(".") == 2:
            return security.jwt.verify(token)
        raise AuthFailed("malformed")
    if client_cert_pem is not None and security.subjects is not None:
        return principal_from_client_cert(client_cert_pem.encode(), subject_map=security.subjects)
    raise AuthFailed("missing_credentials")


def audit_principal(p: Principal) -> AuditPrincipal:
    """Who, as the audit log records it (ids and the method, never a credential)."""
    return AuditPrincipal(key_id=p.key_id, team=p.team, subject=p.subject, method=p.method)
