"""Whose audit events a caller may read (gateway/access/auth/principal.py), as each credential
grants it, and the rules for a new key's scope (gateway/access/keys.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from jwt.algorithms import RSAAlgorithm

from gateway.access.auth import (
    AuthConfigError,
    JwtVerifier,
    Principal,
    audit_teams,
    principal_from_client_cert,
)
from gateway.access.keys import KeyRefused, check_new_key

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def who(*roles: str, team: str | None = None, all_teams: bool = False) -> Principal:
    return Principal(
        key_id="k", method="api_key", team=team, roles=frozenset(roles), all_teams=all_teams
    )


@pytest.mark.parametrize(
    ("principal", "teams"),
    [
        (who("admin"), None),
        (who("admin", team="payments"), None),
        (who("auditor", all_teams=True), None),
        (who("auditor", team="payments"), frozenset({"payments"})),
        (who("auditor"), frozenset()),  # no team, not global: nothing
        (who("app", all_teams=True), frozenset()),  # all_teams only widens an auditor
    ],
    ids=["admin", "admin-with-team", "global", "scoped", "teamless", "app-all-teams"],
)
def test_audit_teams(principal: Principal, teams: frozenset[str] | None) -> None:
    assert audit_teams(principal) == teams


# ---- JWT and mTLS grants -----------------------------------------------------------------------

ISSUER, AUDIENCE = "https://idp.corp.example", "airgate"


@pytest.fixture(scope="module")
def idp_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture
def jwks(tmp_path: Path, idp_key: rsa.RSAPrivateKey) -> Path:
    jwk = RSAAlgorithm.to_jwk(idp_key.public_key(), as_dict=True)
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [{**jwk, "kid": "k1"}]}))
    return path


def token(key: rsa.RSAPrivateKey, **claims: Any) -> str:
    t = int(NOW.timestamp())
    payload = {"iss": ISSUER, "aud": AUDIENCE, "sub": "officer", "iat": t, "exp": t + 60}
    return jwt.encode({**payload, **claims}, key, algorithm="RS256", headers={"kid": "k1"})


def test_jwt_auditors_are_scoped_to_their_team_unless_mapped_global(
    jwks: Path, idp_key: rsa.RSAPrivateKey
) -> None:
    mapped = JwtVerifier(
        jwks,
        issuer=ISSUER,
        audience=AUDIENCE,
        role_map={"compliance": "auditor", "compliance-hq": "global_auditor"},
    )
    scoped = mapped.verify(token(idp_key, team="payments", roles=["compliance"]), NOW)
    assert (scoped.roles, scoped.all_teams) == (frozenset({"auditor"}), False)
    assert audit_teams(scoped) == frozenset({"payments"})
    hq = mapped.verify(token(idp_key, team="payments", roles=["compliance-hq"]), NOW)
    assert (hq.roles, hq.all_teams, audit_teams(hq)) == (frozenset({"auditor"}), True, None)
    teamless = mapped.verify(token(idp_key, roles=["compliance"]), NOW)
    assert audit_teams(teamless) == frozenset()

    # without a map, the claim value itself; an unmapped value grants nothing
    plain = JwtVerifier(jwks, issuer=ISSUER, audience=AUDIENCE)
    assert plain.verify(token(idp_key, roles=["global_auditor"]), NOW).all_teams
    unmapped = mapped.verify(token(idp_key, roles=["global_auditor"]), NOW)
    assert (unmapped.roles, unmapped.all_teams) == (frozenset(), False)

    with pytest.raises(AuthConfigError):
        JwtVerifier(jwks, issuer=ISSUER, audience=AUDIENCE, role_map={"x": "superuser"})


def certificate(cn: str) -> bytes:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - timedelta(days=1))
        .not_valid_after(NOW + timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


def test_mtls_subjects_grant_a_scoped_or_a_global_auditor() -> None:
    subjects: dict[str, dict[str, Any]] = {
        "CN=officer": {"team": "payments", "roles": ["auditor"]},
        "CN=hq": {"roles": ["global_auditor"]},
    }
    officer = principal_from_client_cert(certificate("officer"), subject_map=subjects)
    assert audit_teams(officer) == frozenset({"payments"}) and not officer.all_teams
    hq = principal_from_client_cert(certificate("hq"), subject_map=subjects)
    assert (hq.roles, audit_teams(hq)) == (frozenset({"auditor"}), None)


# ---- a new key's scope -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("role", "team", "name", "all_teams", "param", "code"),
    [
        ("auditor", "payments", None, False, None, None),
        ("auditor", None, None, True, None, None),
        ("app", "payments", "svc", False, None, None),
        ("admin", None, None, False, None, None),
        ("auditor", None, None, False, "team", "missing_scope"),
        ("auditor", "payments", None, True, "team", "invalid_scope"),
        ("app", None, None, True, "all_teams", "invalid_scope"),
        ("admin", None, None, True, "all_teams", "invalid_scope"),
        ("superuser", None, None, False, "role", "invalid_role"),
        ("app", "pay ments", None, False, "team", "invalid_team"),
        ("app", None, "x" * 65, False, "name", "invalid_name"),
        ("app", None, "", False, "name", "invalid_name"),
    ],
)
def test_new_key_scope_rules(
    role: str,
    team: str | None,
    name: str | None,
    all_teams: bool,
    param: str | None,
    code: str | None,
) -> None:
    if param is None:
        check_new_key(role, team, name, all_teams)
        return
    with pytest.raises(KeyRefused) as info:
        check_new_key(role, team, name, all_teams)
    assert (info.value.param, info.value.code) == (param, code)
    for value in (team, name, role):
        if value and value not in ("app", "auditor", "admin"):
            assert value not in str(info.value)  # never repeats what was given
