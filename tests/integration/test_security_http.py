"""The authenticated gateway over HTTP (in process, Litestar's test client, echo engines): who may
call, what they may do, and that every refusal and every served request is audited without
content or credentials.

    auth matrix        every bad credential (API key or JWT) -> the same 401, audited with a
                       reason code, the credential neither echoed nor stored nor logged
    route x role       admin and compliance routes refuse other roles with an audited 403
    policy and limits  model allow-list, max_tokens cap, GCRA burst -> 429 with headers,
                       /v1/models filtered, policy reload (a broken file keeps the old one)
    strict audit       admitted then completed, durable and content-free; no audit log -> 503
                       before the engine sees anything (SQLite writer stopped, PostgreSQL gone)

The app's lifespan opens the access stack on the test client's own event loop (a thread), so
the stack's coroutines are run there through the client's blocking portal (`Gateway.call`).
The audit log is read back with a plain `sqlite3` connection: what a DBA or an attacker with
the file would see.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import hmac
import json
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import jwt
import msgspec
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
from litestar import Litestar
from litestar.testing import TestClient

from backends.echo import EchoEngine
from backends.types import GenerationRequest
from gateway.access.auth.apikeys import api_key_checksum, generate_api_key
from gateway.access.limits import LocalLimiter
from gateway.access.limits.gcra import default_request_burst
from gateway.access.stack import Security
from gateway.app import create_app
from gateway.config import load_settings
from gateway.engines.registry import ModelRegistry, ServedModel

CANARY = "CANARY-5e1b77-security-prompt"
STOP_CANARY = "CANARY-5e1b77-security-stop"
COMPLETION = " tok0 tok1 tok2 tok3"  # the echo engine's answer to max_tokens=4
GENERIC_401 = {
    "error": {
        "message": "authentication failed: send a valid API key as a bearer token",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
}
ISSUER = "https://idp.corp.example/realms/main"
AUDIENCE = "airgate"
KID = "rsa-1"
MODELS = ("echo-a", "echo-b")
RPM = 60  # team t1: the burst (a tenth of the minute) is 6 requests
BURST = default_request_burst(RPM)
PG_HOST, PG_PORT = "127.0.0.1", 5432
CHAT = "/v1/chat/completions"

POLICY = f"""
name = "security-tests"

[[rules]]
name = "team-one"
teams = ["t1"]
roles = ["app"]
models = ["echo-a"]
max_tokens = 64
requests_per_minute = {RPM}

[[rules]]
name = "everyone"
roles = ["app", "admin"]
models = ["*"]

[[rules]]
name = "auditors"
roles = ["auditor"]
deny_models = ["*"]
"""


class CountingEcho(EchoEngine):
    """The echo engine, counting the requests it was handed."""

    def __init__(self) -> None:
        super().__init__(context_length=1024)
        self.submitted = 0

    async def submit(self, request: GenerationRequest) -> Any:
        self.submitted += 1
        return await super().submit(request)


# ---- JWT material ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Idp:
    """The identity provider's signing key (its public half is the JWKS file) and an
    attacker's key that is in no JWKS."""

    key: rsa.RSAPrivateKey
    attacker: rsa.RSAPrivateKey
    jwks_file: Path

    def token(
        self,
        *,
        key: rsa.RSAPrivateKey | None = None,
        header: dict[str, Any] | None = None,
        **claims: Any,
    ) -> str:
        now = int(time.time())
        payload = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "sub": "svc-reporting",
            "iat": now,
            "exp": now + 300,
            "team": "jwt-team",
            "roles": ["app"],
            **claims,
        }
        return jwt.encode(
            payload, key or self.key, algorithm="RS256", headers={"kid": KID, **(header or {})}
        )

    def unsigned(self, alg: str, sign: Callable[[bytes], bytes]) -> str:
        """A token whose header claims `alg`, signed by `sign` (forged by hand: PyJWT itself
        refuses to make these)."""
        now = int(time.time())
        header = {"alg": alg, "typ": "JWT", "kid": KID}
        payload = {"iss": ISSUER, "aud": AUDIENCE, "sub": "x", "iat": now, "exp": now + 300}
        body = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(payload).encode())}"
        return f"{body}.{_b64(sign(body.encode()))}"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


@pytest.fixture(scope="module")
def idp(tmp_path_factory: pytest.TempPathFactory) -> Idp:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    attacker = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)
    path = tmp_path_factory.mktemp("jwks") / "jwks.json"
    path.write_text(json.dumps({"keys": [{**jwk, "kid": KID, "use": "sig", "alg": "RS256"}]}))
    return Idp(key, attacker, path)


def jwt_settings(idp: Idp) -> dict[str, Any]:
    return {"jwks_file": str(idp.jwks_file), "issuer": ISSUER, "audience": AUDIENCE}


# ---- the gateway under test ----------------------------------------------------------------


@dataclass
class Gateway:
    client: TestClient[Litestar]
    security: Security
    data_dir: Path
    engines: dict[str, CountingEcho]

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run `fn` (sync or async) on the app's event loop."""
        return self.client.blocking_portal.call(functools.partial(fn, *args, **kwargs))

    def key(self, role: str, **fields: Any) -> str:
        text, _ = self.call(self.security.keys.create, role, **fields)
        assert isinstance(text, str)
        return text

    @property
    def db(self) -> Path:
        return self.data_dir / "airgate.db"

    def bodies(self) -> list[dict[str, Any]]:
        """Every audit event, in seq order."""
        with contextlib.closing(sqlite3.connect(self.db)) as conn:
            rows = conn.execute("SELECT body FROM audit_events ORDER BY seq").fetchall()
        return [json.loads(row[0]) for row in rows]

    def events(self, resp: Any) -> list[dict[str, Any]]:
        """The audit events of one answered request (by its x-request-id), in seq order."""
        request_id = resp.headers["x-request-id"]
        return [e for e in self.bodies() if e.get("request_id") == request_id]

    def dump(self) -> str:
        """The whole database as SQL text: every table, every column."""
        with contextlib.closing(sqlite3.connect(self.db)) as conn:
            return "\n".join(conn.iterdump())

    def chat(self, key: str, **fields: Any) -> Any:
        body: dict[str, Any] = {
            "model": "echo-a",
            "messages": [{"role": "user", "content": CANARY}],
            "max_tokens": 4,
        }
        body.update(fields)
        return self.client.post("/v1/chat/completions", json=body, headers=bearer(key))


def bearer(credential: str) -> dict[str, str]:
    return {"authorization": f"Bearer {credential}"}


@contextlib.contextmanager
def running_gateway(data_dir: Path, **overrides: Any) -> Iterator[Gateway]:
    settings = load_settings(None, environ={}, overrides={"data_dir": str(data_dir), **overrides})
    engines = {name: CountingEcho() for name in MODELS}
    registry = ModelRegistry([ServedModel(name, engine) for name, engine in engines.items()])
    app = create_app(settings, registry=registry)
    with TestClient(app) as client:
        while client.get("/ready").status_code != 200:  # engines start in the background
            pass
        yield Gateway(client, app.state["security_holder"].get(), data_dir, engines)


def write_policy(path: Path, text: str = POLICY) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, idp: Idp) -> Iterator[Gateway]:
    """One gateway for the tests that only add keys and events."""
    root = tmp_path_factory.mktemp("security-http")
    policy = write_policy(root / "policy" / "10-tests.toml")
    # one audit event per failure (no aggregation window): the auth matrix reads each refused
    # request's own event; aggregation is tested in test_auth_flood.py
    overrides = {"policy.path": str(policy), "auth.jwt": jwt_settings(idp)}
    with running_gateway(
        root / "data", **overrides, **{"auth.failure_audit_window_s": 0}
    ) as gateway:
        yield gateway


@pytest.fixture
def own_gw(tmp_path: Path, idp: Idp) -> Iterator[Gateway]:
    """A gateway of its own, for tests that change policy files or break the audit log."""
    policy = write_policy(tmp_path / "policy" / "10-tests.toml")
    with running_gateway(
        tmp_path / "data", **{"policy.path": str(policy), "auth.jwt": jwt_settings(idp)}
    ) as gateway:
        yield gateway


def assert_envelope(resp: Any, status: int, code: str | None = None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    err: dict[str, Any] = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    if code is not None:
        assert err["code"] == code
    assert CANARY not in resp.text
    return err


def the_event(gw: Gateway, resp: Any, kind: str) -> dict[str, Any]:
    found = [e for e in gw.events(resp) if e["kind"] == kind]
    assert len(found) == 1, gw.events(resp)
    return found[0]


# ---- 1. the auth matrix ----------------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    headers: dict[str, str]
    secrets: tuple[str, ...]  # text that must appear in no response, log line or table


def _api_key_parts(key: str) -> tuple[str, str]:
    _, key_id, secret, _ = key.split("_")
    return key_id, secret


def _no_header(gw: Gateway, idp: Idp) -> Attempt:
    return Attempt({}, ())


def _empty_bearer(gw: Gateway, idp: Idp) -> Attempt:
    return Attempt({"authorization": "Bearer "}, ())


def _basic(gw: Gateway, idp: Idp) -> Attempt:
    key = gw.key("app")
    userpass = base64.b64encode(f"{key}:".encode()).decode()
    return Attempt({"authorization": f"Basic {userpass}"}, (userpass, _api_key_parts(key)[1]))


def _malformed(gw: Gateway, idp: Idp) -> Attempt:
    text = "ag_" + secrets.token_hex(8)
    return Attempt(bearer(text), (text,))


def _not_a_key(gw: Gateway, idp: Idp) -> Attempt:
    text = "sk-" + secrets.token_hex(16)
    return Attempt(bearer(text), (text,))


def _bad_checksum(gw: Gateway, idp: Idp) -> Attempt:
    key = gw.key("app")
    last = "A" if key[-1] != "A" else "B"
    text = key[:-1] + last  # a valid shape, one checksum character off
    return Attempt(bearer(text), (text, _api_key_parts(key)[1]))


def _unknown_id(gw: Gateway, idp: Idp) -> Attempt:
    text = generate_api_key()  # a perfect key that was never stored
    return Attempt(bearer(text), (text, _api_key_parts(text)[1]))


def _wrong_secret(gw: Gateway, idp: Idp) -> Attempt:
    key_id, _ = _api_key_parts(gw.key("app"))
    _, forged_secret = _api_key_parts(generate_api_key())
    body = f"ag_{key_id}_{forged_secret}"
    text = f"{body}_{api_key_checksum(body)}"
    return Attempt(bearer(text), (text, forged_secret))


def _revoked(gw: Gateway, idp: Idp) -> Attempt:
    key = gw.key("app")
    assert gw.call(gw.security.keys.revoke, _api_key_parts(key)[0])
    return Attempt(bearer(key), (key, _api_key_parts(key)[1]))


def _expired(gw: Gateway, idp: Idp) -> Attempt:
    key = gw.key("app", expires_at=datetime.now(UTC) - timedelta(seconds=1))
    return Attempt(bearer(key), (key, _api_key_parts(key)[1]))


def _jwt(token: str) -> Attempt:
    return Attempt(bearer(token), (token, token.rsplit(".", 1)[1] or token))


def _alg_none(gw: Gateway, idp: Idp) -> Attempt:
    return _jwt(idp.unsigned("none", lambda _: b""))


def _hs256_with_public_key(gw: Gateway, idp: Idp) -> Attempt:
    pem = idp.key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return _jwt(idp.unsigned("HS256", lambda data: hmac.new(pem, data, hashlib.sha256).digest()))


def _wrong_issuer(gw: Gateway, idp: Idp) -> Attempt:
    return _jwt(idp.token(iss="https://idp.evil.example/realms/main"))


def _wrong_audience(gw: Gateway, idp: Idp) -> Attempt:
    return _jwt(idp.token(aud="another-service"))


def _jwt_expired(gw: Gateway, idp: Idp) -> Attempt:
    now = int(time.time())
    return _jwt(idp.token(iat=now - 7200, exp=now - 3600))


def _nbf_future(gw: Gateway, idp: Idp) -> Attempt:
    return _jwt(idp.token(nbf=int(time.time()) + 3600))


def _unknown_kid(gw: Gateway, idp: Idp) -> Attempt:
    return _jwt(idp.token(header={"kid": "rsa-unknown"}))


def _oversized(gw: Gateway, idp: Idp) -> Attempt:
    return _jwt(idp.token(padding="x" * 9000))


def _jku(gw: Gateway, idp: Idp) -> Attempt:
    # signed by the attacker, who points at their own key set: never fetched, never trusted
    return _jwt(idp.token(key=idp.attacker, header={"jku": "https://evil.example/jwks.json"}))


AUTH_CASES: list[tuple[str, Callable[[Gateway, Idp], Attempt], str]] = [
    ("no-header", _no_header, "missing_credentials"),
    ("empty-bearer", _empty_bearer, "unsupported_scheme"),
    ("basic-scheme", _basic, "unsupported_scheme"),
    ("malformed-key", _malformed, "malformed_key"),
    ("not-an-airgate-key", _not_a_key, "malformed"),
    ("bad-checksum", _bad_checksum, "malformed_key"),
    ("unknown-key-id", _unknown_id, "unknown_key"),
    ("wrong-secret", _wrong_secret, "wrong_secret"),
    ("revoked-key", _revoked, "key_revoked"),
    ("expired-key", _expired, "key_expired"),
    ("jwt-alg-none", _alg_none, "alg_not_allowed"),
    ("jwt-hs256-public-key", _hs256_with_public_key, "alg_not_allowed"),
    ("jwt-wrong-iss", _wrong_issuer, "wrong_issuer"),
    ("jwt-wrong-aud", _wrong_audience, "wrong_audience"),
    ("jwt-expired", _jwt_expired, "expired"),
    ("jwt-nbf-future", _nbf_future, "not_yet_valid"),
    ("jwt-unknown-kid", _unknown_kid, "unknown_kid"),
    ("jwt-oversized", _oversized, "too_large"),
    ("jwt-jku-header", _jku, "bad_signature"),
]


@pytest.mark.parametrize(
    ("make", "reason"), [(m, r) for _, m, r in AUTH_CASES], ids=[c[0] for c in AUTH_CASES]
)
def test_every_bad_credential_is_the_same_audited_401(
    gw: Gateway,
    idp: Idp,
    make: Callable[[Gateway, Idp], Attempt],
    reason: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("DEBUG")
    attempt = make(gw, idp)
    served = sum(e.submitted for e in gw.engines.values())
    chat = {"model": "echo-a", "messages": [{"role": "user", "content": CANARY}], "max_tokens": 4}
    calls = [
        ("/v1/chat/completions", gw.client.post(CHAT, json=chat, headers=attempt.headers)),
        ("/v1/models", gw.client.get("/v1/models", headers=attempt.headers)),
    ]
    for route, resp in calls:
        assert resp.status_code == 401, resp.text
        assert resp.json() == GENERIC_401
        assert resp.headers["www-authenticate"] == "Bearer"
        event = the_event(gw, resp, "auth.failure")
        assert event["outcome"] == "denied"
        assert event["http_status"] == 401
        assert event["error_class"] == reason
        assert event["route"] == route
        assert event.get("principal", {}) == {}
        answered = resp.text + json.dumps(dict(resp.headers))
        assert not [s for s in attempt.secrets if s in answered]
    assert sum(e.submitted for e in gw.engines.values()) == served
    stored = gw.dump()
    assert not [s for s in attempt.secrets if s in stored]
    assert CANARY not in stored
    logged = [
        f"{r.getMessage()} {getattr(r, 'fields', '')} {r.exc_text or ''}" for r in caplog.records
    ]
    assert not [s for s in attempt.secrets for line in logged if s in line]


def test_a_valid_jwt_maps_to_a_principal_and_is_served(gw: Gateway, idp: Idp) -> None:
    token = idp.token(sub="svc-reporting", team="jwt-team", roles=["app", "no-such-role"])
    resp = gw.chat(token)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"] == COMPLETION
    principal = the_event(gw, resp, "inference.admitted")["principal"]
    issuer_hash = hashlib.sha256(ISSUER.encode()).hexdigest()[:12]
    assert principal == {
        "key_id": f"jwt:{issuer_hash}:svc-reporting",
        "team": "jwt-team",
        "subject": "svc-reporting",
        "method": "jwt",
    }
    models = gw.client.get("/v1/models", headers=bearer(token))
    assert [m["id"] for m in models.json()["data"]] == list(MODELS)
    assert token not in gw.dump()


def test_a_jwt_without_a_role_is_authenticated_but_allowed_nothing(gw: Gateway, idp: Idp) -> None:
    token = idp.token(sub="svc-norole", roles=[])
    assert_envelope(gw.chat(token), 403, "no_matching_rule")
    assert_envelope(gw.client.get("/admin/keys", headers=bearer(token)), 403, "permission_denied")
    assert gw.client.get("/v1/models", headers=bearer(token)).json()["data"] == []


# ---- 2. routes x roles -----------------------------------------------------------------------

ADMIN_ROUTES = ("POST /admin/keys", "GET /admin/keys", "DELETE /admin/keys/{victim}")
AUDIT_ROUTES = (
    "GET /audit/events",
    "GET /audit/events/{event_id}",
    "GET /audit/export?format=jsonl",
    "GET /audit/verify",
)


def _request(gw: Gateway, route: str, key: str) -> Any:
    method, path = route.split(" ")
    victim = _api_key_parts(gw.key("app"))[0]
    event_id = gw.bodies()[0]["event_id"]
    url = path.format(victim=victim, event_id=event_id)
    body = {"role": "app", "name": "made-by-matrix"} if method == "POST" else None
    return gw.client.request(method, url, json=body, headers=bearer(key))


@pytest.mark.parametrize(
    ("role", "admin_ok", "audit_ok"),
    [("app", False, False), ("auditor", False, True), ("admin", True, True)],
)
def test_route_role_matrix(gw: Gateway, role: str, admin_ok: bool, audit_ok: bool) -> None:
    gw.client.get("/v1/models")  # an auth failure: at least one event for /audit/events/{id}
    key = gw.key(role, name=f"matrix-{role}")
    key_id = _api_key_parts(key)[0]
    for routes, allowed, kind in (
        (ADMIN_ROUTES, admin_ok, "admin.action"),
        (AUDIT_ROUTES, audit_ok, "audit.access"),
    ):
        for route in routes:
            resp = _request(gw, route, key)
            if allowed:
                assert resp.status_code in (200, 201), f"{route}: {resp.text}"
                expected = "success"
            else:
                err = assert_envelope(resp, 403, "permission_denied")
                assert err["message"].startswith("this route needs the role")
                expected = "denied"
            event = the_event(gw, resp, kind)
            assert event["outcome"] == expected, route
            assert event["principal"]["key_id"] == key_id
            assert event["http_status"] == resp.status_code


def test_a_created_key_works_at_once_and_a_deleted_one_fails_at_once(gw: Gateway) -> None:
    admin = gw.key("admin")
    created = gw.client.post(
        "/admin/keys", json={"role": "app", "name": "fresh-app"}, headers=bearer(admin)
    )
    assert created.status_code == 201, created.text
    key, record = created.json()["key"], created.json()["record"]
    assert record["key_id"] == _api_key_parts(key)[0]
    assert "secret" not in json.dumps(record) and _api_key_parts(key)[1] not in json.dumps(record)
    assert gw.chat(key).status_code == 200
    listed = gw.client.get("/admin/keys", headers=bearer(admin)).text
    assert record["key_id"] in listed and _api_key_parts(key)[1] not in listed
    deleted = gw.client.delete(f"/admin/keys/{record['key_id']}", headers=bearer(admin))
    assert deleted.status_code == 200, deleted.text
    refused = gw.chat(key)
    assert refused.json() == GENERIC_401
    assert the_event(gw, refused, "auth.failure")["error_class"] == "key_revoked"
    again = gw.client.delete(f"/admin/keys/{record['key_id']}", headers=bearer(admin))
    assert_envelope(again, 404, "not_found")
    assert _api_key_parts(key)[1] not in gw.dump()


@pytest.mark.parametrize(
    "extra",
    [
        {"key_id": "AAAAAAAAAAAA"},
        {"secret": "s" * 32},
        {"created_at": "2020-01-01T00:00:00Z"},
        {"revoked_at": None},
        {"secret_hmac": "0" * 64},
    ],
    ids=lambda extra: next(iter(extra)),
)
def test_key_creation_refuses_mass_assignment(gw: Gateway, extra: dict[str, Any]) -> None:
    admin = gw.key("admin")
    before = len(gw.client.get("/admin/keys", headers=bearer(admin)).json()["data"])
    resp = gw.client.post("/admin/keys", json={"role": "app", **extra}, headers=bearer(admin))
    assert_envelope(resp, 400)
    assert len(gw.client.get("/admin/keys", headers=bearer(admin)).json()["data"]) == before


# ---- 3. policy and limits --------------------------------------------------------------------


def test_a_model_outside_the_policy_is_403_and_audited(gw: Gateway) -> None:
    key = gw.key("app", team="t1")
    before = gw.engines["echo-b"].submitted
    resp = gw.chat(key, model="echo-b")
    assert_envelope(resp, 403, "model_not_allowed")
    event = the_event(gw, resp, "policy.denied")
    assert event["outcome"] == "denied" and event["http_status"] == 403
    assert event["decision"] == "model_not_allowed"
    assert event["policy_version"] == gw.security.policy.current.version
    assert event["model"] == "echo-b"
    assert gw.engines["echo-b"].submitted == before
    assert [e["kind"] for e in gw.events(resp)] == ["policy.denied"]


def test_max_tokens_over_the_cap_is_400_and_audited(gw: Gateway) -> None:
    key = gw.key("app", team="t1")
    resp = gw.chat(key, max_tokens=100)
    err = assert_envelope(resp, 400)
    assert err["param"] == "max_tokens"
    event = the_event(gw, resp, "policy.denied")
    assert event["decision"] == "max_tokens_exceeded" and event["http_status"] == 400
    assert gw.chat(key, max_tokens=64).status_code == 200


def test_models_lists_only_what_the_policy_allows(gw: Gateway) -> None:
    t1 = gw.client.get("/v1/models", headers=bearer(gw.key("app", team="t1")))
    assert [m["id"] for m in t1.json()["data"]] == ["echo-a"]
    other = gw.client.get("/v1/models", headers=bearer(gw.key("app", team="t2")))
    assert [m["id"] for m in other.json()["data"]] == list(MODELS)
    auditor = gw.client.get("/v1/models", headers=bearer(gw.key("auditor")))
    assert auditor.json()["data"] == []


def test_requests_beyond_the_burst_are_429_with_headers_and_audited(gw: Gateway) -> None:
    # the same limiter the gateway builds, on a clock that stands still: exactly the burst
    # passes, however slow the machine running this test is
    real = gw.security.limiter
    gw.security.limiter = LocalLimiter(clock=lambda: 1_000.0)
    try:
        key = gw.key("app", team="t1")
        before = gw.engines["echo-a"].submitted
        remaining = []
        for _ in range(BURST):
            ok = gw.chat(key)
            assert ok.status_code == 200, ok.text
            assert ok.headers["x-ratelimit-limit-requests"] == str(RPM)
            assert ok.headers["x-ratelimit-reset-requests"]
            remaining.append(int(ok.headers["x-ratelimit-remaining-requests"]))
        # counted down from the minute's limit: the first request reads RPM - 1, each one takes
        # one more, and the last of the burst reads 0 (the next would be refused)
        assert remaining[:-1] == [RPM - n for n in range(1, BURST)]
        assert remaining[-1] == 0
        for _ in range(2):
            refused = gw.chat(key)
            assert_envelope(refused, 429, "rate_limit_exceeded")
            assert int(refused.headers["retry-after"]) >= 1
            assert int(refused.headers["retry-after-ms"]) >= 1
            assert refused.headers["x-ratelimit-limit-requests"] == str(RPM)
            assert refused.headers["x-ratelimit-remaining-requests"] == "0"
            assert refused.headers["x-ratelimit-reset-requests"]
            event = the_event(gw, refused, "rate.limited")
            assert event["outcome"] == "denied" and event["http_status"] == 429
            assert event["policy_version"] == gw.security.policy.current.version
            assert [e["kind"] for e in gw.events(refused)] == ["rate.limited"]
        assert gw.engines["echo-a"].submitted == before + BURST
        # another key of the same team has its own budget
        assert gw.chat(gw.key("app", team="t1")).status_code == 200
    finally:
        gw.security.limiter = real


def test_policy_reload_changes_decisions_and_a_broken_file_keeps_the_old_one(
    own_gw: Gateway, tmp_path: Path
) -> None:
    gw = own_gw
    policy_file = tmp_path / "policy" / "10-tests.toml"
    key = gw.key("app", team="t1")
    old = gw.security.policy.current.version
    assert_envelope(gw.chat(key, model="echo-b"), 403, "model_not_allowed")

    write_policy(policy_file, POLICY.replace('models = ["echo-a"]', 'models = ["echo-*"]'))
    assert gw.security.policy.reload() is True
    new = gw.security.policy.current.version
    assert new != old
    served = gw.chat(key, model="echo-b")
    assert served.status_code == 200, served.text
    assert the_event(gw, served, "inference.admitted")["policy_version"] == new
    listed = gw.client.get("/v1/models", headers=bearer(key)).json()["data"]
    assert [m["id"] for m in listed] == list(MODELS)

    write_policy(policy_file, POLICY.replace('name = "team-one"', 'name = "team-one"\nbogus = 1'))
    assert gw.security.policy.reload() is False
    assert gw.security.policy.current.version == new
    still = gw.chat(key, model="echo-b")
    assert still.status_code == 200
    assert the_event(gw, still, "inference.completed")["policy_version"] == new
    policy_file.write_text("this is [not toml")
    assert gw.security.policy.reload() is False
    assert gw.security.policy.current.version == new


# ---- 4. strict audit -------------------------------------------------------------------------


def _sse_chunks(text: str) -> list[dict[str, Any]]:
    events = [e.removeprefix("data: ") for e in text.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    return [msgspec.json.decode(e) for e in events[:-1]]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_served_request_is_admitted_then_completed_without_content(
    gw: Gateway, stream: bool
) -> None:
    key = gw.key("app", name="strict-audit")
    extra: dict[str, Any] = {"stop": [STOP_CANARY], "temperature": 0.5}
    if stream:
        extra |= {"stream": True, "stream_options": {"include_usage": True}}
    resp = gw.chat(key, **extra)
    assert resp.status_code == 200, resp.text
    if stream:
        chunks = _sse_chunks(resp.text)
        usage = chunks[-1]["usage"]
        content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1])
    else:
        usage = resp.json()["usage"]
        content = resp.json()["choices"][0]["message"]["content"]
    assert content == COMPLETION
    events = gw.events(resp)
    assert [e["kind"] for e in events] == ["inference.admitted", "inference.completed"]
    admitted, completed = events
    version = gw.security.policy.current.version
    key_id = _api_key_parts(key)[0]
    for event in events:
        assert event["request_id"] == resp.headers["x-request-id"]
        assert event["policy_version"] == version
        assert event["decision"] == "allowed"
        assert event["principal"]["key_id"] == key_id
        assert event["model"] == "echo-a"
        assert event["sampling"]["stream"] is stream
    assert admitted["outcome"] == "success" and "completion_tokens" not in admitted
    assert completed["outcome"] == "success" and completed["http_status"] == 200
    assert completed["prompt_tokens"] == usage["prompt_tokens"] > 0
    assert completed["completion_tokens"] == usage["completion_tokens"] == 4
    assert completed["finish_reason"] == "length"
    stored = gw.dump()
    for text in (CANARY, STOP_CANARY, COMPLETION, "tok0", "tok3"):
        assert text not in stored


def test_without_the_audit_writer_no_request_reaches_the_engine(own_gw: Gateway) -> None:
    gw = own_gw
    key = gw.key("app")
    assert gw.chat(key).status_code == 200
    served = gw.engines["echo-a"].submitted
    gw.call(gw.security.audit.stop)
    for stream in (False, True):
        resp = gw.chat(key, stream=stream)
        assert_envelope(resp, 503, "service_unavailable")
        assert resp.headers["retry-after"]
    assert gw.engines["echo-a"].submitted == served
    assert gw.engines["echo-a"].load().running == 0
    # an unauditable refusal is not answered as if it had been audited either
    assert_envelope(gw.client.get("/v1/models", headers=bearer(generate_api_key())), 503)


async def _create_database(name: str) -> None:
    try:
        conn = await asyncpg.connect(host=PG_HOST, port=PG_PORT, user="postgres")
    except (OSError, asyncpg.PostgresError) as exc:
        pytest.fail(f"PostgreSQL must run on {PG_HOST}:{PG_PORT} (trust auth): {exc}")
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()


async def _drop_database(name: str) -> None:
    conn = await asyncpg.connect(host=PG_HOST, port=PG_PORT, user="postgres")
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def test_a_postgresql_audit_log_that_disappears_stops_inference(tmp_path: Path, idp: Idp) -> None:
    name = f"airgate_sec_{secrets.token_hex(6)}"
    asyncio.run(_create_database(name))
    try:
        overrides = {
            "audit.database_url": f"postgresql://postgres@{PG_HOST}:{PG_PORT}/{name}",
            "audit.migrate": True,
            "policy.path": str(write_policy(tmp_path / "policy.toml")),
            "auth.jwt": jwt_settings(idp),
        }
        with running_gateway(tmp_path / "data", **overrides) as gw:
            token = idp.token(sub="svc-pg")  # a JWT needs no database to authenticate
            assert gw.chat(token).status_code == 200
            served = gw.engines["echo-a"].submitted
            asyncio.run(_drop_database(name))
            for stream in (False, True):
                assert_envelope(gw.chat(token, stream=stream), 503, "service_unavailable")
            assert gw.engines["echo-a"].submitted == served
    finally:
        asyncio.run(_drop_database(name))
