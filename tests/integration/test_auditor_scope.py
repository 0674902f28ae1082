"""Team-scoped auditors (gateway/compliance/audit_api.py, `audit_teams`): a `payments` auditor
searches, exports and reads only `payments` events, is refused another team (403, audited) and
gets 404 for another team's event; a global auditor and an admin read every team's; verify is
open to both.  Keys made through the admin API, JWTs from an IdP key made here; the real app in
process, driven over HTTP."""

from __future__ import annotations

import contextlib
import functools
import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
from litestar import Litestar
from litestar.testing import TestClient

from backends.echo import EchoEngine
from gateway.access.stack import Security
from gateway.app import create_app
from gateway.audit import AuditEvent, AuditPrincipal, new_event_id
from gateway.config import load_settings
from gateway.engines.registry import ModelRegistry, ServedModel

ISSUER, AUDIENCE, KID = "https://idp.scope.example", "airgate", "idp-1"
T0 = datetime(2021, 6, 1, tzinfo=UTC)
SEEDED = {"payments": 6, "risk": 5, None: 3}  # team -> events (None: no team)


def seed_event(i: int, team: str | None) -> AuditEvent:
    return AuditEvent(
        event_id=new_event_id(),
        ts=T0 + timedelta(seconds=i),
        kind="inference.completed" if team else "auth.failure",
        outcome="success" if team else "denied",
        principal=AuditPrincipal(key_id=f"svc-{team}", team=team, method="api_key")
        if team
        else AuditPrincipal(),
        model="m" if team else None,
        http_status=200 if team else 401,
    )


@dataclass
class Gateway:
    client: TestClient[Litestar]
    security: Security
    data_dir: Path
    idp: rsa.RSAPrivateKey
    seeded: dict[str | None, list[AuditEvent]]
    admin: str

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self.client.blocking_portal.call(functools.partial(fn, *args, **kwargs))

    def create(self, **body: Any) -> Any:
        return self.client.post("/admin/keys", json=body, headers=bearer(self.admin))

    def key(self, **body: Any) -> str:
        resp = self.create(**body)
        assert resp.status_code == 201, resp.text
        key: str = resp.json()["key"]
        return key

    def token(self, roles: list[str], team: str | None = None) -> str:
        now = int(time.time())
        claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "officer", "iat": now, "exp": now + 300}
        claims |= {"roles": roles} | ({"team": team} if team else {})
        return jwt.encode(claims, self.idp, algorithm="RS256", headers={"kid": KID})

    def get(self, path: str, credential: str, **params: Any) -> Any:
        return self.client.get(path, params=params, headers=bearer(credential))

    def ids(self, *teams: str | None) -> set[str]:
        return {e.event_id for team in teams for e in self.seeded[team]}

    def access_event(self, resp: Any) -> dict[str, Any]:
        request_id = resp.headers["x-request-id"]
        with contextlib.closing(sqlite3.connect(self.data_dir / "airgate.db")) as conn:
            rows = conn.execute("SELECT body FROM audit_events ORDER BY seq").fetchall()
        found = [
            e for e in map(json.loads, (r[0] for r in rows)) if e.get("request_id") == request_id
        ]
        assert len(found) == 1, found
        event: dict[str, Any] = found[0]
        return event


def bearer(credential: str) -> dict[str, str]:
    return {"authorization": f"Bearer {credential}"}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    root = tmp_path_factory.mktemp("auditor-scope")
    idp = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = RSAAlgorithm.to_jwk(idp.public_key(), as_dict=True)
    (root / "jwks.json").write_text(json.dumps({"keys": [{**jwk, "kid": KID}]}))
    jwt_settings = {
        "jwks_file": str(root / "jwks.json"),
        "issuer": ISSUER,
        "audience": AUDIENCE,
        "role_map": {"compliance": "auditor", "compliance-hq": "global_auditor"},
    }
    settings = load_settings(
        None, environ={}, overrides={"data_dir": str(root / "data"), "auth.jwt": jwt_settings}
    )
    app = create_app(settings, registry=ModelRegistry([ServedModel("m", EchoEngine())]))
    with TestClient(app) as client:
        while client.get("/ready").status_code != 200:  # engines start in the background
            pass
        security: Security = app.state["security_holder"].get()
        seeded: dict[str | None, list[AuditEvent]] = {}
        i = 0
        for team, count in SEEDED.items():
            seeded[team] = []
            for _ in range(count):
                seeded[team].append(seed_event(i, team))
                i += 1
        for event in sorted((e for es in seeded.values() for e in es), key=lambda e: e.ts):
            client.blocking_portal.call(security.audit.append, event)
        admin, _ = client.blocking_portal.call(
            functools.partial(security.keys.create, "admin", name="ops")
        )
        yield Gateway(client, security, root / "data", idp, seeded, admin)


@pytest.fixture(scope="module")
def payments(gw: Gateway) -> str:
    """A `payments` auditor key, made through the admin API."""
    return gw.key(role="auditor", team="payments", name="payments-officer")


@pytest.fixture(scope="module")
def global_auditor(gw: Gateway) -> str:
    return gw.key(role="auditor", all_teams=True, name="hq-officer")


def seeded_ids_in(records: list[dict[str, Any]], gw: Gateway) -> set[str]:
    every = gw.ids(*SEEDED)
    return {r["event"]["event_id"] for r in records} & every


def search(gw: Gateway, credential: str, **params: Any) -> list[dict[str, Any]]:
    resp = gw.get("/audit/events", credential, limit=1000, **params)
    assert resp.status_code == 200, resp.text
    assert resp.json()["next_cursor"] is None
    data: list[dict[str, Any]] = resp.json()["data"]
    return data


# ---- search and export -------------------------------------------------------------------------


def test_a_scoped_auditor_searches_only_its_team(gw: Gateway, payments: str) -> None:
    for params in ({}, {"team": "payments"}, {"kind": "inference.completed"}):
        records = search(gw, payments, **params)
        assert seeded_ids_in(records, gw) == gw.ids("payments")
        assert {r["event"]["principal"]["team"] for r in records} == {"payments"}


def test_a_global_auditor_and_an_admin_search_every_team(gw: Gateway, global_auditor: str) -> None:
    for credential in (global_auditor, gw.admin):
        assert seeded_ids_in(search(gw, credential), gw) == gw.ids(*SEEDED)
        assert seeded_ids_in(search(gw, credential, team="risk"), gw) == gw.ids("risk")


@pytest.mark.parametrize(
    ("path", "action"), [("/audit/events", "audit.search"), ("/audit/export", "audit.export")]
)
def test_another_team_is_refused_and_the_refusal_audited(
    gw: Gateway, payments: str, path: str, action: str
) -> None:
    resp = gw.get(path, payments, team="risk")
    assert resp.status_code == 403, resp.text
    assert resp.json()["error"]["code"] == "permission_denied"
    assert "risk" not in resp.text
    event = gw.access_event(resp)
    assert (event["kind"], event["action"], event["outcome"]) == ("audit.access", action, "denied")
    assert (event["http_status"], event["error_class"]) == (403, "permission_denied")


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "ocsf"])
def test_a_scoped_export_holds_only_its_team(gw: Gateway, payments: str, fmt: str) -> None:
    resp = gw.get("/audit/export", payments, format=fmt)
    assert resp.status_code == 200, resp.text
    text = resp.text
    for event_id in gw.ids("payments"):
        assert event_id in text
    for event_id in gw.ids("risk", None):
        assert event_id not in text
    everyone = gw.get("/audit/export", gw.admin, format=fmt).text
    assert all(event_id in everyone for event_id in gw.ids("risk", None))


# ---- one event ---------------------------------------------------------------------------------


def test_another_teams_event_is_404_like_an_unknown_one(gw: Gateway, payments: str) -> None:
    own = gw.seeded["payments"][0].event_id
    assert gw.get(f"/audit/events/{own}", payments).json()["event"]["event_id"] == own
    unknown = gw.get(f"/audit/events/{new_event_id()}", payments)
    for other in (gw.seeded["risk"][0].event_id, gw.seeded[None][0].event_id):
        resp = gw.get(f"/audit/events/{other}", payments)
        assert resp.status_code == 404
        assert resp.json() == unknown.json()
        event = gw.access_event(resp)
        assert (event["action"], event["outcome"], event["http_status"]) == (
            "audit.get",
            "failure",
            404,
        )
        assert gw.get(f"/audit/events/{other}", gw.admin).status_code == 200


# ---- verify ------------------------------------------------------------------------------------


def test_verify_is_open_to_a_scoped_auditor(gw: Gateway, payments: str) -> None:
    resp = gw.get("/audit/verify", payments)
    assert resp.status_code == 200, resp.text
    assert gw.access_event(resp)["outcome"] == "success"


# ---- JWT auditors ------------------------------------------------------------------------------


def test_jwt_auditors_are_scoped_by_their_team_claim_unless_global(gw: Gateway) -> None:
    scoped = gw.token(["compliance"], team="payments")
    assert seeded_ids_in(search(gw, scoped), gw) == gw.ids("payments")
    assert gw.get("/audit/events", scoped, team="risk").status_code == 403
    hq = gw.token(["compliance-hq"], team="payments")
    assert seeded_ids_in(search(gw, hq), gw) == gw.ids(*SEEDED)


def test_a_jwt_auditor_without_a_team_reads_no_events_but_may_verify(gw: Gateway) -> None:
    teamless = gw.token(["compliance"])
    for path in ("/audit/events", "/audit/export", f"/audit/events/{new_event_id()}"):
        resp = gw.get(path, teamless)
        assert resp.status_code == 403, (path, resp.text)
        assert gw.access_event(resp)["outcome"] == "denied"
    assert gw.get("/audit/verify", teamless).status_code == 200


# ---- the admin API makes and lists such keys --------------------------------------------------


def test_the_admin_api_makes_and_lists_scoped_and_global_auditor_keys(
    gw: Gateway, payments: str, global_auditor: str
) -> None:
    listed = {
        k["key_id"]: k
        for k in gw.client.get("/admin/keys", headers=bearer(gw.admin)).json()["data"]
    }
    scoped = listed[payments.split("_")[1]]
    assert (scoped["role"], scoped["team"], scoped["audit_scope"]) == (
        "auditor",
        "payments",
        "team",
    )
    every = listed[global_auditor.split("_")[1]]
    assert (every["team"], every["audit_scope"]) == (None, "all_teams")
    assert listed[gw.admin.split("_")[1]]["audit_scope"] == "all_teams"
    for body, param in (
        ({"role": "auditor"}, "team"),
        ({"role": "auditor", "team": "payments", "all_teams": True}, "team"),
        ({"role": "app", "all_teams": True}, "all_teams"),
    ):
        refused = gw.create(**body)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"] == param
