"""Client certificates: the server's TLS context, and the principal of a verified certificate.

The TLS handshake (`ssl_context`, TLS 1.2 or newer, client certificates checked against the
configured CA) decides whether a certificate is genuine; `principal_from_client_cert` only maps
a certificate the handshake has already verified to a team and roles.  Never call it on a
certificate that did not come out of that handshake.

The subject map is configuration, one entry per certificate or group of certificates:

    "sha256:<hex fingerprint>"  one certificate (colons and case ignored)   most specific
    "CN=<common name>"          every certificate with that common name
    "OU=<organisational unit>"  every certificate with that unit            least specific

each mapping to `{"team": "<team>" | absent, "roles": ["app" | "auditor" | "admin", ...]}`
(or the grant `global_auditor`: an auditor of every team's audit events).
The most specific kind that matches wins; two different entries matching at that level (two
CNs or OUs in one subject) make the certificate ambiguous, and it is refused.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import msgspec
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.x509.oid import NameOID

from .errors import AuthConfigError, InvalidCertificate
from .principal import Grant, Principal, grant

__all__ = ["CertificateMapping", "SubjectMap", "principal_from_client_cert", "ssl_context"]

_MAX_SUBJECT: Final = 512
_HEX: Final = frozenset("0123456789abcdef")


class CertificateMapping(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What one subject-map entry grants."""

    team: str | None = None
    roles: frozenset[Grant] = frozenset()


class SubjectMap:
    """A validated subject map; build it once at start-up (`AuthConfigError` names bad keys)."""

    def __init__(self, raw: Mapping[str, Mapping[str, Any]]) -> None:
        self.fingerprints: dict[str, CertificateMapping] = {}
        self.common_names: dict[str, CertificateMapping] = {}
        self.units: dict[str, CertificateMapping] = {}
        for key, value in raw.items():
            try:
                mapping = msgspec.convert(value, CertificateMapping)
            except msgspec.ValidationError as exc:
                raise AuthConfigError(f"client certificate map entry {key!r}: {exc}") from None
            prefix, name = key[:3].upper(), key[3:]
            if key[:7].lower() == "sha256:":
                fingerprint = key[7:].replace(":", "").strip().lower()
                if len(fingerprint) != 64 or not set(fingerprint) <= _HEX:
                    raise AuthConfigError(f"client certificate map key {key!r}: bad fingerprint")
                self.fingerprints[fingerprint] = mapping
            elif prefix == "CN=" and name:
                self.common_names[name] = mapping
            elif prefix == "OU=" and name:
                self.units[name] = mapping
            else:
                raise AuthConfigError(
                    f"client certificate map key {key!r}: use sha256:<hex>, CN=<name> or OU=<unit>"
                )


def _load(data: bytes) -> x509.Certificate:
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            return x509.load_pem_x509_certificate(data)
        return x509.load_der_x509_certificate(data)
    except ValueError:
        raise InvalidCertificate("malformed_certificate") from None


def _names(cert: x509.Certificate, oid: x509.ObjectIdentifier) -> list[str]:
    return [a.value for a in cert.subject.get_attributes_for_oid(oid) if isinstance(a.value, str)]


def _match(table: dict[str, CertificateMapping], names: list[str]) -> CertificateMapping | None:
    found = {table[n] for n in names if n in table}
    if len(found) > 1:
        raise InvalidCertificate("ambiguous_certificate")
    return found.pop() if found else None


def principal_from_client_cert(
    der_or_pem: bytes, *, subject_map: SubjectMap | Mapping[str, Mapping[str, Any]]
) -> Principal:
    """The principal of a handshake-verified client certificate (DER or PEM).

    Key id `mtls:<SHA-256 fingerprint hex>`; subject the certificate's RFC 4514 subject.
    `InvalidCertificate("unknown_certificate")` when no map entry matches.
    """
    table = subject_map if isinstance(subject_map, SubjectMap) else SubjectMap(subject_map)
    cert = _load(der_or_pem)
    fingerprint = cert.fingerprint(hashes.SHA256()).hex()
    mapping = table.fingerprints.get(fingerprint)
    if mapping is None:
        mapping = _match(table.common_names, _names(cert, NameOID.COMMON_NAME))
    if mapping is None:
        mapping = _match(table.units, _names(cert, NameOID.ORGANIZATIONAL_UNIT_NAME))
    if mapping is None:
        raise InvalidCertificate("unknown_certificate")
    roles, all_teams = grant(mapping.roles)
    return Principal(
        key_id=f"mtls:{fingerprint}",
        method="mtls",
        team=mapping.team,
        roles=roles,
        subject=cert.subject.rfc4514_string()[:_MAX_SUBJECT],
        all_teams=all_teams,
    )


def ssl_context(
    ca_file: str | Path,
    cert_file: str | Path,
    key_file: str | Path,
    *,
    require_client_cert: bool = True,
) -> ssl.SSLContext:
    """The server's TLS context: TLS 1.2+, our certificate, client certificates verified
    against `ca_file` (required by default; optional lets API keys and JWTs through too)."""
    try:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ca_file))
        context.load_cert_chain(str(cert_file), str(key_file))
    except (OSError, ssl.SSLError) as exc:
        raise AuthConfigError(
            f"TLS files unusable (ca {ca_file}, cert {cert_file}, key {key_file}): "
            f"{type(exc).__name__}"
        ) from exc
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    context.options |= ssl.OP_NO_RENEGOTIATION
    return context
