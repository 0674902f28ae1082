"""Authentication building blocks: who is calling, from an API key, a JWT or a client
certificate (or, with `[auth] local_trust`, a keyless loopback peer's socket owner).  Each turns
a credential into a `Principal` or raises an `AuthenticationFailed` subclass whose `reason`
goes to the audit log (the HTTP answer is one generic 401).

The HTTP wiring (which header, which order, the 401 rendering) lives with the app, not here.
"""

from .apikeys import SCANNER_PATTERN, generate_api_key, parse_api_key
from .errors import (
    AuthConfigError,
    AuthenticationFailed,
    AuthError,
    InvalidCertificate,
    InvalidToken,
    KeyExpired,
    KeyRevoked,
    KeyStoreUnavailable,
    MalformedKey,
    UnknownKey,
    WrongSecret,
)
from .jwt import DEFAULT_ALGORITHMS, JwtVerifier
from .local_trust import LOCAL_TEAM, LocalPeerRefused, LocalTrust, is_loopback_host
from .mtls import SubjectMap, principal_from_client_cert, ssl_context
from .pepper import (
    default_pepper_path,
    load_or_create_pepper,
    pepper_from_text,
    read_pepper_file,
)
from .principal import GLOBAL_AUDITOR, GRANTS, ROLES, Grant, Method, Principal, Role, audit_teams
from .store import ApiKeyRecord, KeyStore

__all__ = [
    "DEFAULT_ALGORITHMS",
    "GLOBAL_AUDITOR",
    "GRANTS",
    "LOCAL_TEAM",
    "ROLES",
    "SCANNER_PATTERN",
    "ApiKeyRecord",
    "AuthConfigError",
    "AuthError",
    "AuthenticationFailed",
    "Grant",
    "InvalidCertificate",
    "InvalidToken",
    "JwtVerifier",
    "KeyExpired",
    "KeyRevoked",
    "KeyStore",
    "KeyStoreUnavailable",
    "LocalPeerRefused",
    "LocalTrust",
    "MalformedKey",
    "Method",
    "Principal",
    "Role",
    "SubjectMap",
    "UnknownKey",
    "WrongSecret",
    "audit_teams",
    "default_pepper_path",
    "generate_api_key",
    "is_loopback_host",
    "load_or_create_pepper",
    "parse_api_key",
    "pepper_from_text",
    "principal_from_client_cert",
    "read_pepper_file",
    "ssl_context",
]
