"""gateway/access/auth: JWTs against a local JWKS (the attack matrix), and client certificates
(subject mapping and the server's TLS context, with a CA and certificates made here)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import socket
import ssl
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

from gateway.access.auth import (
    AuthConfigError,
    AuthenticationFailed,
    InvalidCertificate,
    InvalidToken,
    JwtVerifier,
    Principal,
    SubjectMap,
    principal_from_client_cert,
    ssl_context,
)

ISSUER = "https://idp.corp.example/realms/main"
AUDIENCE = "airgate"
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
T = int(NOW.timestamp())
ISSUER_HASH = hashlib.sha256(ISSUER.encode()).hexdigest()[:12]

# ---- keys and tokens ------------------------------------------------------------------------


@dataclass(frozen=True)
class SigningKey:
    kid: str
    alg: str
    private: Any
    jwk: dict[str, Any]


def _rsa(kid: str) -> SigningKey:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)
    return SigningKey(kid, "RS256", key, {**jwk, "kid": kid, "use": "sig"})


def _ec(kid: str) -> SigningKey:
    key = ec.generate_private_key(ec.SECP256R1())
    jwk = ECAlgorithm.to_jwk(key.public_key(), as_dict=True)
    return SigningKey(kid, "ES256", key, {**jwk, "kid": kid})


def _ed(kid: str) -> SigningKey:
    key = ed25519.Ed25519PrivateKey.generate()
    jwk = OKPAlgorithm.to_jwk(key.public_key(), as_dict=True)
    return SigningKey(kid, "EdDSA", key, {**jwk, "kid": kid})


@dataclass(frozen=True)
class Keys:
    rsa: SigningKey
    ec: SigningKey
    ed: SigningKey
    attacker: SigningKey  # same kind as rsa, never in the JWKS


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys(_rsa("rsa-1"), _ec("ec-1"), _ed("ed-1"), _rsa("rsa-evil"))


def _write_jwks(path: Path, *jwks: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"keys": list(jwks)}))
    os.replace(tmp, path)  # how a key rotation job replaces the file


@pytest.fixture
def jwks_path(tmp_path: Path, keys: Keys) -> Path:
    path = tmp_path / "jwks.json"
    _write_jwks(path, keys.rsa.jwk, keys.ec.jwk, keys.ed.jwk)
    return path


@pytest.fixture
def verifier(jwks_path: Path) -> JwtVerifier:
    return JwtVerifier(jwks_path, issuer=ISSUER, audience=AUDIENCE)


def _claims(**changes: Any) -> dict[str, Any]:
    claims: dict[str, Any] = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "alice@corp.example",
        "iat": T - 60,
        "exp": T + 600,
        "team": "search",
        "roles": ["app"],
    }
    claims.update(changes)
    return {k: v for k, v in claims.items() if v is not None}


def _token(key: SigningKey, claims: dict[str, Any] | None = None, **headers: Any) -> str:
    headers = {"kid": key.kid, **headers}
    return jwt.encode(claims or _claims(), key.private, algorithm=key.alg, headers=headers)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _raw_token(header: dict[str, Any], claims: dict[str, Any], signature: bytes = b"") -> str:
    head = _b64(json.dumps(header).encode()) + "." + _b64(json.dumps(claims).encode())
    return head + "." + _b64(signature)


def _rejected(verifier: JwtVerifier, token: str) -> str:
    with pytest.raises(InvalidToken) as info:
        verifier.verify(token, NOW)
    assert str(info.value) == "authentication failed"
    assert isinstance(info.value, AuthenticationFailed)
    return info.value.reason


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing here may fetch a URL (a `jku` or `x5u` must never be followed)."""

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(urllib.request, "urlopen", refuse)


# ---- valid tokens ---------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["rsa", "ec", "ed"])
def test_valid_tokens_of_each_algorithm(verifier: JwtVerifier, keys: Keys, which: str) -> None:
    key: SigningKey = getattr(keys, which)
    principal = verifier.verify(_token(key), NOW)
    assert principal == Principal(
        key_id=f"jwt:{ISSUER_HASH}:alice@corp.example",
        method="jwt",
        team="search",
        roles=frozenset({"app"}),
        subject="alice@corp.example",
    )


def test_wall_clock_is_the_default(verifier: JwtVerifier, keys: Keys) -> None:
    now = int(datetime.now(UTC).timestamp())
    token = _token(keys.ec, _claims(iat=now, exp=now + 60))
    assert verifier.verify(token).subject == "alice@corp.example"
    with pytest.raises(ValueError):
        verifier.verify(token, NOW.replace(tzinfo=None))


def test_audience_list_containing_ours(verifier: JwtVerifier, keys: Keys) -> None:
    token = _token(keys.rsa, _claims(aud=["other", AUDIENCE]))
    assert verifier.verify(token, NOW).method == "jwt"


# ---- the attack matrix ----------------------------------------------------------------------


def test_alg_none_is_refused(verifier: JwtVerifier, keys: Keys) -> None:
    for alg in ("none", "None", "NONE", ""):
        token = _raw_token({"alg": alg, "typ": "JWT", "kid": keys.rsa.kid}, _claims())
        assert _rejected(verifier, token) == "alg_not_allowed"
    token = _raw_token({"typ": "JWT", "kid": keys.rsa.kid}, _claims())
    assert _rejected(verifier, token) == "alg_not_allowed"


def test_hs256_signed_with_the_rsa_public_key_is_refused(verifier: JwtVerifier, keys: Keys) -> None:
    public_pem = keys.rsa.private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    header = {"alg": "HS256", "typ": "JWT", "kid": keys.rsa.kid}
    unsigned = _raw_token(header, _claims()).rsplit(".", 1)[0]
    for secret in (public_pem, json.dumps(keys.rsa.jwk).encode()):
        mac = hmac.new(secret, unsigned.encode(), hashlib.sha256).digest()
        assert _rejected(verifier, unsigned + "." + _b64(mac)) == "alg_not_allowed"


def test_alg_must_match_the_selected_key(verifier: JwtVerifier, keys: Keys) -> None:
    # an ES256 signature presented under the RSA key's kid: the key decides the algorithm
    token = _token(keys.ec, kid=keys.rsa.kid)
    assert _rejected(verifier, token) == "alg_not_allowed"


def test_wrong_issuer(verifier: JwtVerifier, keys: Keys) -> None:
    token = _token(keys.rsa, _claims(iss="https://idp.evil.example"))
    assert _rejected(verifier, token) == "wrong_issuer"


def test_wrong_audience(verifier: JwtVerifier, keys: Keys) -> None:
    assert _rejected(verifier, _token(keys.rsa, _claims(aud="billing"))) == "wrong_audience"
    assert _rejected(verifier, _token(keys.rsa, _claims(aud=["a", "b"]))) == "wrong_audience"


def test_expired_beyond_leeway(verifier: JwtVerifier, keys: Keys) -> None:
    assert _rejected(verifier, _token(keys.rsa, _claims(exp=T - 31))) == "expired"
    assert _rejected(verifier, _token(keys.rsa, _claims(exp=T - 30))) == "expired"
    # within the 30 s leeway: still accepted
    assert verifier.verify(_token(keys.rsa, _claims(exp=T - 29)), NOW).method == "jwt"


def test_not_before_in_the_future_beyond_leeway(verifier: JwtVerifier, keys: Keys) -> None:
    assert _rejected(verifier, _token(keys.rsa, _claims(nbf=T + 31))) == "not_yet_valid"
    assert verifier.verify(_token(keys.rsa, _claims(nbf=T + 30)), NOW).method == "jwt"
    assert _rejected(verifier, _token(keys.rsa, _claims(iat=T + 31))) == "not_yet_valid"


def test_leeway_is_configurable(jwks_path: Path, keys: Keys) -> None:
    strict = JwtVerifier(jwks_path, issuer=ISSUER, audience=AUDIENCE, leeway_s=0)
    assert _rejected(strict, _token(keys.rsa, _claims(exp=T))) == "expired"
    assert _rejected(strict, _token(keys.rsa, _claims(nbf=T + 1))) == "not_yet_valid"


@pytest.mark.parametrize("claim", ["exp", "iat", "nbf"])
def test_time_claims_must_be_numbers(verifier: JwtVerifier, keys: Keys, claim: str) -> None:
    for value in ("soon", True, [1]):
        assert _rejected(verifier, _token(keys.rsa, _claims(**{claim: value}))) == "bad_claim"


def test_unknown_kid(verifier: JwtVerifier, keys: Keys) -> None:
    assert _rejected(verifier, _token(keys.attacker)) == "unknown_kid"
    assert _rejected(verifier, _token(keys.rsa, kid="rsa-2")) == "unknown_kid"


def test_missing_kid(verifier: JwtVerifier, keys: Keys) -> None:
    token = jwt.encode(_claims(), keys.rsa.private, algorithm="RS256")
    assert _rejected(verifier, token) == "missing_kid"
    # a kid that is not a string: PyJWT refuses the header itself
    assert _rejected(verifier, _raw_token({"alg": "RS256", "kid": 7}, _claims())) == "malformed"


def test_oversized_token_is_refused_before_parsing(verifier: JwtVerifier, keys: Keys) -> None:
    token = _token(keys.rsa, _claims(padding="x" * 8192))
    assert len(token) > 8192
    assert _rejected(verifier, token) == "too_large"
    assert _rejected(verifier, "!" * 8193) == "too_large"  # not even looked at


def test_size_cap_is_configurable(jwks_path: Path, keys: Keys) -> None:
    small = JwtVerifier(jwks_path, issuer=ISSUER, audience=AUDIENCE, max_token_bytes=100)
    assert _rejected(small, _token(keys.rsa)) == "too_large"


def test_jku_header_is_ignored(verifier: JwtVerifier, keys: Keys) -> None:
    evil = "https://attacker.example/jwks.json"
    # a genuine token that also carries jku/x5u: verified with the local key, nothing fetched
    principal = verifier.verify(_token(keys.rsa, jku=evil, x5u=evil), NOW)
    assert principal.subject == "alice@corp.example"
    # an attacker's token pointing at the attacker's JWKS still needs a key from the local file
    assert _rejected(verifier, _token(keys.attacker, jku=evil)) == "unknown_kid"
    assert _rejected(verifier, _token(keys.attacker, jku=evil, kid=keys.rsa.kid)) == (
        "bad_signature"
    )


def test_embedded_jwk_and_x5c_are_ignored(verifier: JwtVerifier, keys: Keys) -> None:
    attacker_jwk = {**keys.attacker.jwk, "kid": keys.rsa.kid}
    token = _token(keys.attacker, kid=keys.rsa.kid, jwk=attacker_jwk)
    assert _rejected(verifier, token) == "bad_signature"
    token = _token(keys.attacker, jwk=keys.attacker.jwk)
    assert _rejected(verifier, token) == "unknown_kid"
    cert = _self_signed(keys.attacker.private, "attacker")
    x5c = [base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()]
    assert _rejected(verifier, _token(keys.attacker, kid=keys.rsa.kid, x5c=x5c)) == (
        "bad_signature"
    )


def test_tampered_payload(verifier: JwtVerifier, keys: Keys) -> None:
    head, _payload, sig = _token(keys.ed).split(".")
    forged = _b64(json.dumps(_claims(roles=["admin"])).encode())
    assert _rejected(verifier, f"{head}.{forged}.{sig}") == "bad_signature"


@pytest.mark.parametrize("claim", ["sub", "exp", "iat", "aud", "iss"])
def test_required_claims(verifier: JwtVerifier, keys: Keys, claim: str) -> None:
    token = _token(keys.rsa, _claims(**{claim: None}))
    assert _rejected(verifier, token) == "missing_claim"


@pytest.mark.parametrize(
    "changes",
    [
        {"sub": 42},
        {"sub": ""},
        {"sub": "x" * 257},
        {"sub": "alice\nbob"},
        {"team": 3},
        {"team": ""},
        {"roles": {"app": True}},
        {"roles": ["app", 1]},
    ],
    ids=repr,
)
def test_malformed_claims(verifier: JwtVerifier, keys: Keys, changes: dict[str, Any]) -> None:
    assert _rejected(verifier, _token(keys.rsa, _claims(**changes))) == "bad_claim"


@pytest.mark.parametrize(
    "token",
    ["", "abc", "a.b", "a.b.c", "eyJhbGciOiJSUzI1NiJ9.e30", "ey\u00e9.x.y"],
)
def test_garbage_tokens(verifier: JwtVerifier, token: str) -> None:
    assert _rejected(verifier, token) == "malformed"


# ---- roles and teams ------------------------------------------------------------------------


def test_roles_are_filtered_to_airgate_roles(verifier: JwtVerifier, keys: Keys) -> None:
    token = _token(keys.rsa, _claims(roles=["app", "auditor", "superuser", "admin"]))
    assert verifier.verify(token, NOW).roles == frozenset({"app", "auditor", "admin"})
    token = _token(keys.rsa, _claims(roles="app  auditor offline_access"))
    assert verifier.verify(token, NOW).roles == frozenset({"app", "auditor"})
    no_roles = verifier.verify(_token(keys.rsa, _claims(roles=None, team=None)), NOW)
    assert no_roles.roles == frozenset() and no_roles.team is None


def test_role_map_and_claim_names(jwks_path: Path, keys: Keys) -> None:
    verifier = JwtVerifier(
        jwks_path,
        issuer=ISSUER,
        audience=AUDIENCE,
        team_claim="department",
        roles_claim="groups",
        role_map={"llm-users": "app", "compliance": "auditor"},
    )
    claims = _claims(department="legal", groups=["llm-users", "compliance", "app", "admin"])
    principal = verifier.verify(_token(keys.ec, claims), NOW)
    assert principal.roles == frozenset({"app", "auditor"})  # only mapped values count
    assert principal.team == "legal"


def test_key_id_separates_issuers(jwks_path: Path, keys: Keys) -> None:
    other = JwtVerifier(jwks_path, issuer="https://other.example", audience=AUDIENCE)
    token = _token(keys.rsa, _claims(iss="https://other.example"))
    key_id = other.verify(token, NOW).key_id
    assert key_id.startswith("jwt:") and key_id.endswith(":alice@corp.example")
    assert key_id != f"jwt:{ISSUER_HASH}:alice@corp.example"


# ---- configuration and the JWKS file --------------------------------------------------------


@pytest.mark.parametrize(
    "algorithms", [["HS256"], ["RS256", "HS256"], ["none"], [], ["RS256", "HS512"]]
)
def test_symmetric_and_none_algorithms_cannot_be_configured(
    jwks_path: Path, algorithms: list[str]
) -> None:
    with pytest.raises(AuthConfigError):
        JwtVerifier(jwks_path, issuer=ISSUER, audience=AUDIENCE, algorithms=algorithms)


def test_bad_configuration(jwks_path: Path, tmp_path: Path) -> None:
    with pytest.raises(AuthConfigError):
        JwtVerifier(jwks_path, issuer=ISSUER, audience=AUDIENCE, role_map={"x": "root"})
    with pytest.raises(AuthConfigError):
        JwtVerifier(jwks_path, issuer="", audience=AUDIENCE)
    with pytest.raises(AuthConfigError, match=r"missing\.json"):
        JwtVerifier(tmp_path / "missing.json", issuer=ISSUER, audience=AUDIENCE)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(AuthConfigError):
        JwtVerifier(tmp_path / "bad.json", issuer=ISSUER, audience=AUDIENCE)


def test_algorithm_allow_list_narrows_the_keys(jwks_path: Path, keys: Keys) -> None:
    verifier = JwtVerifier(jwks_path, issuer=ISSUER, audience=AUDIENCE, algorithms=["ES256"])
    assert verifier.verify(_token(keys.ec), NOW).method == "jwt"
    assert _rejected(verifier, _token(keys.rsa)) == "alg_not_allowed"


def test_unusable_jwks_entries_are_ignored(
    tmp_path: Path, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "jwks.json"
    symmetric = {"kty": "oct", "k": _b64(b"k" * 32), "kid": "hs"}
    private = {**RSAAlgorithm.to_jwk(keys.attacker.private, as_dict=True), "kid": "priv"}
    encryption = {**keys.attacker.jwk, "kid": "enc", "use": "enc"}
    no_kid = {k: v for k, v in keys.ec.jwk.items() if k != "kid"}
    _write_jwks(path, symmetric, private, encryption, no_kid, "junk", keys.ed.jwk)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="airgate.auth"):
        verifier = JwtVerifier(path, issuer=ISSUER, audience=AUDIENCE)
    assert verifier.verify(_token(keys.ed), NOW).method == "jwt"
    # the HS256 key named in a token does not exist for the verifier
    unsigned = _raw_token({"alg": "HS256", "kid": "hs"}, _claims()).rsplit(".", 1)[0]
    mac = hmac.new(b"k" * 32, unsigned.encode(), hashlib.sha256).digest()
    assert _rejected(verifier, unsigned + "." + _b64(mac)) == "alg_not_allowed"
    assert _rejected(verifier, _token(keys.attacker, kid="priv")) == "unknown_kid"
    assert len([r for r in caplog.records if "ignoring" in r.getMessage()]) == 5
    _write_jwks(path, symmetric, private)
    with pytest.raises(AuthConfigError, match="no usable"):
        JwtVerifier(path, issuer=ISSUER, audience=AUDIENCE)


def test_duplicate_kid_is_a_configuration_error(tmp_path: Path, keys: Keys) -> None:
    path = tmp_path / "jwks.json"
    _write_jwks(path, keys.rsa.jwk, {**keys.attacker.jwk, "kid": keys.rsa.kid})
    with pytest.raises(AuthConfigError, match="two keys"):
        JwtVerifier(path, issuer=ISSUER, audience=AUDIENCE)


def test_jwks_file_is_reloaded_when_it_changes(
    verifier: JwtVerifier, jwks_path: Path, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    rotated = _rsa("rsa-2")
    assert _rejected(verifier, _token(rotated)) == "unknown_kid"
    _write_jwks(jwks_path, rotated.jwk, keys.ec.jwk)
    assert verifier.verify(_token(rotated), NOW).method == "jwt"
    assert _rejected(verifier, _token(keys.rsa)) == "unknown_kid"  # retired key is gone
    # a broken file (a half-done edit) keeps the last good keys, with one warning
    jwks_path.write_text("{")
    with caplog.at_level(logging.WARNING, logger="airgate.auth"):
        assert verifier.verify(_token(rotated), NOW).method == "jwt"
        assert verifier.verify(_token(keys.ec), NOW).method == "jwt"
    assert len([r for r in caplog.records if "unusable" in r.getMessage()]) == 1
    # and a deleted file too
    jwks_path.unlink()
    assert verifier.verify(_token(rotated), NOW).method == "jwt"


# ---- client certificates --------------------------------------------------------------------


def _name(cn: str, *units: str) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Corp")]
    attrs += [x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, u) for u in units]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


def _builder(subject: x509.Name, issuer: x509.Name, public: Any) -> x509.CertificateBuilder:
    start = datetime.now(UTC) - timedelta(days=1)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + timedelta(days=30))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
    )


def _self_signed(key: Any, cn: str) -> x509.Certificate:
    name = _name(cn)
    builder = _builder(name, name, key.public_key()).add_extension(
        x509.BasicConstraints(ca=True, path_length=None), critical=True
    )
    return builder.sign(key, hashes.SHA256())


@dataclass(frozen=True)
class Pki:
    ca: x509.Certificate
    ca_key: Any

    def issue(self, cn: str, *units: str, server: bool = False) -> tuple[x509.Certificate, Any]:
        key = ec.generate_private_key(ec.SECP256R1())
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            _builder(_name(cn, *units), self.ca.subject, key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.ca_key.public_key()),
                critical=False,
            )
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False
            )
        return builder.sign(self.ca_key, hashes.SHA256()), key


def _pki(cn: str) -> Pki:
    key = ec.generate_private_key(ec.SECP256R1())
    return Pki(_self_signed(key, cn), key)


@pytest.fixture(scope="module")
def pki() -> Pki:
    return _pki("Corp Client CA")


@pytest.fixture(scope="module")
def other_pki() -> Pki:
    return _pki("Somebody Else's CA")


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


def _fingerprint(cert: x509.Certificate) -> str:
    return hashlib.sha256(_der(cert)).hexdigest()


SUBJECT_MAP: dict[str, dict[str, Any]] = {
    "CN=billing-app": {"team": "billing", "roles": ["app"]},
    "OU=compliance": {"team": "legal", "roles": ["auditor"]},
}


def test_certificate_mapped_by_common_name(pki: Pki) -> None:
    cert, _ = pki.issue("billing-app", "compliance")
    for data in (_pem(cert), _der(cert)):
        principal = principal_from_client_cert(data, subject_map=SUBJECT_MAP)
        assert principal == Principal(
            key_id=f"mtls:{_fingerprint(cert)}",
            method="mtls",
            team="billing",  # CN is more specific than OU
            roles=frozenset({"app"}),
            subject="CN=billing-app,OU=compliance,O=Corp",
        )


def test_certificate_mapped_by_unit_and_by_fingerprint(pki: Pki) -> None:
    cert, _ = pki.issue("officer-7", "compliance")
    assert principal_from_client_cert(_pem(cert), subject_map=SUBJECT_MAP).roles == {"auditor"}
    colons = ":".join(f"{b:02X}" for b in bytes.fromhex(_fingerprint(cert)))
    pinned = {**SUBJECT_MAP, f"SHA256:{colons}": {"roles": ["admin"]}}
    principal = principal_from_client_cert(_der(cert), subject_map=SubjectMap(pinned))
    assert principal.roles == frozenset({"admin"}) and principal.team is None


def test_unmapped_and_malformed_certificates(pki: Pki, other_pki: Pki) -> None:
    cert, _ = pki.issue("stranger", "sales")
    with pytest.raises(InvalidCertificate) as info:
        principal_from_client_cert(_pem(cert), subject_map=SUBJECT_MAP)
    assert info.value.reason == "unknown_certificate"
    for garbage in (b"", b"not a certificate", b"-----BEGIN CERTIFICATE-----\nAAAA\n"):
        with pytest.raises(InvalidCertificate) as info:
            principal_from_client_cert(garbage, subject_map=SUBJECT_MAP)
        assert info.value.reason == "malformed_certificate"


def test_ambiguous_certificate_is_refused(pki: Pki) -> None:
    cert, _ = pki.issue("dual", "compliance", "platform")
    table = {**SUBJECT_MAP, "OU=platform": {"team": "platform", "roles": ["admin"]}}
    with pytest.raises(InvalidCertificate) as info:
        principal_from_client_cert(_pem(cert), subject_map=table)
    assert info.value.reason == "ambiguous_certificate"


@pytest.mark.parametrize(
    "table",
    [
        {"O=Corp": {"roles": ["app"]}},
        {"CN=": {"roles": ["app"]}},
        {"sha256:abcd": {"roles": ["app"]}},
        {"CN=x": {"roles": ["root"]}},
        {"CN=x": {"roles": ["app"], "extra": 1}},
        {"CN=x": {"team": 5}},
    ],
    ids=repr,
)
def test_bad_subject_maps(table: dict[str, dict[str, Any]]) -> None:
    with pytest.raises(AuthConfigError):
        SubjectMap(table)


# ---- the server's TLS context (in-memory handshakes) ----------------------------------------


@pytest.fixture(scope="module")
def server_files(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    folder = tmp_path_factory.mktemp("tls")
    cert, key = pki.issue("localhost", server=True)
    (folder / "ca.pem").write_bytes(_pem(pki.ca))
    (folder / "server.pem").write_bytes(_pem(cert))
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    (folder / "server.key").write_bytes(key_pem)
    return folder / "ca.pem", folder / "server.pem", folder / "server.key"


def _client_context(
    pki: Pki, tmp: Path, cert: tuple[x509.Certificate, Any] | None
) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=_pem(pki.ca).decode())
    if cert is not None:
        (tmp / "client.pem").write_bytes(_pem(cert[0]))
        (tmp / "client.key").write_bytes(
            cert[1].private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        context.load_cert_chain(tmp / "client.pem", tmp / "client.key")
    return context


def _handshake(server_context: ssl.SSLContext, client_context: ssl.SSLContext) -> ssl.SSLObject:
    """Run a TLS handshake through memory buffers; the server side, or its SSLError."""
    s_in, s_out, c_in, c_out = (ssl.MemoryBIO() for _ in range(4))
    server = server_context.wrap_bio(s_in, s_out, server_side=True)
    client = client_context.wrap_bio(c_in, c_out, server_hostname="localhost")
    done = {"client": False, "server": False}
    for _ in range(10):
        for name, side, inbox, outbox in (
            ("client", client, s_in, c_out),
            ("server", server, c_in, s_out),
        ):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
            inbox.write(outbox.read())
        if all(done.values()):
            return server
    raise AssertionError("handshake did not finish")


def test_tls_accepts_a_client_certificate_from_the_ca(
    pki: Pki, server_files: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    context = ssl_context(*server_files)
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert context.verify_mode == ssl.CERT_REQUIRED
    client = pki.issue("billing-app")
    server = _handshake(context, _client_context(pki, tmp_path, client))
    peer = server.getpeercert(binary_form=True)
    assert peer is not None
    principal = principal_from_client_cert(peer, subject_map=SUBJECT_MAP)
    assert principal.key_id == f"mtls:{_fingerprint(client[0])}"
    assert principal.team == "billing"


def test_tls_refuses_a_certificate_from_another_ca(
    pki: Pki, other_pki: Pki, server_files: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    stranger = other_pki.issue("billing-app")  # same name, wrong issuer
    with pytest.raises(ssl.SSLError, match="certificate verify failed"):
        _handshake(ssl_context(*server_files), _client_context(pki, tmp_path, stranger))


def test_tls_client_certificate_required_or_optional(
    pki: Pki, server_files: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    client = _client_context(pki, tmp_path, None)
    with pytest.raises(ssl.SSLError):
        _handshake(ssl_context(*server_files), client)
    optional = ssl_context(*server_files, require_client_cert=False)
    assert optional.verify_mode == ssl.CERT_OPTIONAL
    assert _handshake(optional, client).getpeercert(binary_form=True) is None


def test_tls_versions(pki: Pki, server_files: tuple[Path, Path, Path], tmp_path: Path) -> None:
    context = ssl_context(*server_files)
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2  # nothing older is offered
    client = _client_context(pki, tmp_path, pki.issue("billing-app"))
    assert _handshake(context, client).version() == "TLSv1.3"
    client.maximum_version = ssl.TLSVersion.TLSv1_2
    server = _handshake(context, client)
    assert server.version() == "TLSv1.2"
    assert server.getpeercert(binary_form=True) is not None


def test_tls_files_must_exist(server_files: tuple[Path, Path, Path], tmp_path: Path) -> None:
    ca, cert, key = server_files
    with pytest.raises(AuthConfigError, match=r"missing\.pem"):
        ssl_context(ca, tmp_path / "missing.pem", key)
    with pytest.raises(AuthConfigError):
        ssl_context(ca, cert, ca)  # not a key
