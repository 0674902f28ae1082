"""Every admin call is audited, the refused ones too: a bad role, an unknown or mass-assigned
field, malformed JSON, a body over the cap, a key of no scope, revoking an unknown key, a caller
without the admin role.  Each leaves exactly one `admin.action` event with the status and an
error code, and nothing the client sent (gateway/admin/keys.py).  The real app, in process."""

from __future__ import annotations

import contextlib
import functools
import json
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import TestClient

from backends.echo import EchoEngine
from gateway.access.stack import Security
from gateway.app import create_app
from gateway.config import load_settings
from gateway.engines.registry import ModelRegistry, ServedModel

CANARY = "CANARY-7c1e-adminbody"
MAX_BODY = 4096


@dataclass
class Gateway:
    client: TestClient[Litestar]
    security: Security
    data_dir: Path
    admin: str

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self.client.blocking_portal.call(functools.partial(fn, *args, **kwargs))

    def key(self, role: str, **fields: Any) -> str:
        text, _ = self.call(self.security.keys.create, role, **fields)
        assert isinstance(text, str)
        return text

    def bodies(self) -> list[dict[str, Any]]:
        with contextlib.closing(sqlite3.connect(self.data_dir / "airgate.db")) as conn:
            rows = conn.execute("SELECT body FROM audit_events ORDER BY seq").fetchall()
        return [json.loads(row[0]) for row in rows]

    def events(self, resp: Any) -> list[dict[str, Any]]:
        request_id = resp.headers["x-request-id"]
        return [e for e in self.bodies() if e.get("request_id") == request_id]

    def dump(self) -> str:
        with contextlib.closing(sqlite3.connect(self.data_dir / "airgate.db")) as conn:
            return "\n".join(conn.iterdump())


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    data_dir = tmp_path_factory.mktemp("admin-audit") / "data"
    settings = load_settings(
        None,
        environ={},
        overrides={"data_dir": str(data_dir), "server.max_request_bytes": MAX_BODY},
    )
    registry = ModelRegistry([ServedModel("echo", EchoEngine(context_length=512))])
    app = create_app(settings, registry=registry)
    with TestClient(app) as client:
        while client.get("/ready").status_code != 200:  # engines start in the background
            pass
        security: Security = app.state["security_holder"].get()
        admin, _ = client.blocking_portal.call(
            functools.partial(security.keys.create, "admin", name="ops")
        )
        yield Gateway(client, security, data_dir, admin)


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def past() -> str:
    return (datetime.now(UTC) - timedelta(days=1)).isoformat()


# (method, path, body: a JSON value or raw bytes) -> (status, error code)
REFUSED: dict[str, tuple[str, str, Any, int, str]] = {
    "bad_role": ("POST", "/admin/keys", {"role": CANARY}, 400, "invalid_request_error"),
    "extra_field": (
        "POST",
        "/admin/keys",
        {"role": "app", "secret_hmac": CANARY},
        400,
        "unsupported_parameter",
    ),
    "unknown_field_name": (  # a name an error may not repeat (a field-like one it names)
        "POST",
        "/admin/keys",
        {"role": "app", f"{CANARY} x": 1},
        400,
        "unsupported_parameter",
    ),
    "malformed_json": (
        "POST",
        "/admin/keys",
        b'{"role": "app", "name": "' + CANARY.encode(),
        400,
        "invalid_request_error",
    ),
    "body_over_the_cap": (
        "POST",
        "/admin/keys",
        b'{"role": "app", "name": "' + CANARY.encode() * 400 + b'"}',
        413,
        "request_too_large",
    ),
    "bad_name": ("POST", "/admin/keys", {"role": "app", "name": CANARY + " x"}, 400, ""),
    "expired": ("POST", "/admin/keys", {"role": "app", "expires_at": "PAST"}, 400, ""),
    "auditor_of_no_scope": ("POST", "/admin/keys", {"role": "auditor"}, 400, ""),
    "global_app_key": ("POST", "/admin/keys", {"role": "app", "all_teams": True}, 400, ""),
    "revoke_unknown": ("DELETE", "/admin/keys/AAAAAAAAAAAA", None, 404, "not_found"),
    "revoke_junk_id": ("DELETE", f"/admin/keys/{CANARY}", None, 404, "not_found"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_refused_admin_call_is_audited_once_without_client_text(gw: Gateway, case: str) -> None:
    method, path, body, status, code = REFUSED[case]
    if body is not None and not isinstance(body, bytes):
        body = json.dumps(body).replace('"PAST"', json.dumps(past())).encode()
    resp = gw.client.request(
        method, path, content=body, headers={**bearer(gw.admin), "content-type": "application/json"}
    )
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert CANARY not in resp.text
    events = gw.events(resp)
    assert len(events) == 1, events
    event = events[0]
    assert event["kind"] == "admin.action"
    assert event["action"] == ("keys.create" if method == "POST" else "keys.revoke")
    assert event["outcome"] == "failure"
    assert event["http_status"] == status
    assert event["error_class"] == (code or "invalid_request_error")
    assert event["error_class"] == (error["code"] or error["type"])
    assert event["principal"]["key_id"] == gw.admin.split("_")[1]
    assert "target" not in event.get("detail", {})
    assert CANARY not in gw.dump()


def test_a_caller_without_the_admin_role_is_denied_and_audited(gw: Gateway) -> None:
    app = gw.key("app", team="payments")
    resp = gw.client.post("/admin/keys", json={"role": "admin"}, headers=bearer(app))
    assert resp.status_code == 403
    (event,) = gw.events(resp)
    assert (event["kind"], event["outcome"], event["http_status"]) == (
        "admin.action",
        "denied",
        403,
    )
    assert event["error_class"] == "permission_denied"


def test_a_successful_admin_call_is_audited_with_its_target(gw: Gateway) -> None:
    created = gw.client.post(
        "/admin/keys", json={"role": "auditor", "team": "payments"}, headers=bearer(gw.admin)
    )
    assert created.status_code == 201, created.text
    key_id = created.json()["record"]["key_id"]
    (event,) = gw.events(created)
    assert (event["action"], event["outcome"], event["http_status"]) == (
        "keys.create",
        "success",
        201,
    )
    assert "error_class" not in event
    assert event["detail"] == {"target": key_id, "role": "auditor", "audit_scope": "team"}
    revoked = gw.client.delete(f"/admin/keys/{key_id}", headers=bearer(gw.admin))
    assert revoked.status_code == 200
    (event,) = gw.events(revoked)
    assert (event["action"], event["outcome"]) == ("keys.revoke", "success")
    assert event["detail"] == {"target": key_id}
    again = gw.client.delete(f"/admin/keys/{key_id}", headers=bearer(gw.admin))
    assert again.status_code == 404
    (event,) = gw.events(again)  # a known key, already revoked: named, and a failure
    assert (event["outcome"], event["error_class"]) == ("failure", "not_found")
    assert event["detail"] == {"target": key_id}
