"""The wire format, hardened (issue 15), over HTTP through the clients apps use (the `openai` SDK
and httpx on Litestar's test client), on the echo engine:

    duplicate keys     a body with a key twice (any depth, escapes decoded) is a 400, so
                       `{"role": "app", "role": "admin"}` mints no admin key
    unknown fields     named only when they are parameters airgate knows; never the client's text
    request ids        always the server's (log line, audit events, completion id); the client's
                       own is only echoed as `x-client-request-id`, never logged or audited
    audit ranges       a cursor or a `first_seq`/`last_seq` outside 1..2**63-1, or a reversed
                       range, is a 400 on SQLite and on PostgreSQL (it was a 500, or an empty "ok")
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httpx
import openai
import pytest
from databases import postgres_database
from litestar import Litestar
from litestar.testing import TestClient

from backends.echo import EchoEngine
from gateway.access.stack import Security
from gateway.app import create_app
from gateway.config import load_settings
from gateway.engines.registry import ModelRegistry, ServedModel

CANARY = "CANARY-3d81c0-wire"
CHAT = "/v1/chat/completions"
MAX_SEQ = 2**63 - 1


@dataclass
class Gateway:
    client: TestClient[Litestar]
    security: Security
    data_dir: Path
    keys: dict[str, str]  # role -> key

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run `fn` (sync or async) on the app's event loop."""
        return self.client.blocking_portal.call(functools.partial(fn, *args, **kwargs))

    def post(self, path: str, body: bytes, role: str = "app", **headers: str) -> httpx.Response:
        headers = {
            "authorization": f"Bearer {self.keys[role]}",
            "content-type": "application/json",
            **headers,
        }
        return self.client.post(path, content=body, headers=headers)

    def get(self, path: str, role: str = "auditor", **params: Any) -> httpx.Response:
        headers = {"authorization": f"Bearer {self.keys[role]}"}
        return self.client.get(path, params=params, headers=headers)

    def sdk(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=str(self.client.base_url) + "/v1",
            api_key=self.keys["app"],
            http_client=self.client,
            max_retries=0,
        )

    def audit_bodies(self) -> list[str]:
        """Every stored audit event (SQLite), as the database holds it."""
        with contextlib.closing(sqlite3.connect(self.data_dir / "airgate.db")) as conn:
            return [row[0] for row in conn.execute("SELECT body FROM audit_events ORDER BY seq")]


@contextlib.contextmanager
def running_gateway(data_dir: Path, **overrides: Any) -> Iterator[Gateway]:
    settings = load_settings(None, environ={}, overrides={"data_dir": str(data_dir), **overrides})
    registry = ModelRegistry([ServedModel("echo", EchoEngine(context_length=512))])
    app = create_app(settings, registry=registry)
    with TestClient(app) as client:
        while client.get("/ready").status_code != 200:  # engines start in the background
            pass
        security: Security = app.state["security_holder"].get()
        keys = {
            role: client.blocking_portal.call(functools.partial(security.keys.create, role))[0]
            for role in ("app", "auditor", "admin")
        }
        yield Gateway(client, security, data_dir, keys)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with running_gateway(tmp_path_factory.mktemp("wire") / "data") as gateway:
        yield gateway


def error_of(resp: httpx.Response, status: int = 400) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    error: dict[str, Any] = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    return error


def chat_body(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "echo",
        "messages": [{"role": "user", "content": CANARY}],
        "max_tokens": 4,
    }
    body.update(fields)
    return body


# ---- duplicate keys ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b'{"role":"app","role":"admin"}',
        b'{"role":"app","\\u0072ole":"admin"}',
        b'{"role":"admin","name":"x","role":"app"}',
    ],
    ids=["plain", "escaped", "first-is-admin"],
)
def test_a_duplicate_role_mints_no_key(gw: Gateway, body: bytes) -> None:
    def key_ids() -> list[str]:
        return [k["key_id"] for k in gw.get("/admin/keys", role="admin").json()["data"]]

    before = key_ids()
    error = error_of(gw.post("/admin/keys", body, role="admin"))
    assert "duplicate key" in error["message"]
    assert "role" not in error["message"]
    assert key_ids() == before


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (CHAT, b'{"model":"echo","messages":[{"role":"user","content":"x"}],"model":"other"}'),
        (
            CHAT,
            b'{"model":"echo","messages":[{"role":"user","content":"x"}],"max_tokens":4,'
            b'"stream":false,"stream":true}',
        ),
        (
            CHAT,
            b'{"model":"echo","messages":[{"role":"user","content":"x",'
            b'"content":"y"}],"max_tokens":4}',
        ),
        (
            CHAT,
            b'{"model":"echo","messages":[{"role":"system","\\u0072ole":"user","content":"x"}]}',
        ),
        ("/v1/completions", b'{"model":"echo","prompt":"x","stream":true,"stream":false}'),
        ("/v1/responses", b'{"model":"echo","input":"x","model":"echo"}'),
    ],
    ids=[
        "chat-model",
        "chat-stream",
        "message-content",
        "message-role",
        "completions",
        "responses",
    ],
)
def test_a_duplicate_key_in_an_inference_body_is_refused(
    gw: Gateway, path: str, body: bytes
) -> None:
    audited = len(gw.audit_bodies())
    error = error_of(gw.post(path, body))
    assert "duplicate key" in error["message"]
    assert error["param"] is None
    assert len(gw.audit_bodies()) == audited  # refused before anything was admitted


def test_the_same_names_in_sibling_objects_are_served(gw: Gateway) -> None:
    messages = [
        {"role": "user", "content": 'say "role": "admin"'},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "again"},
    ]
    body = json.dumps(chat_body(messages=messages, metadata={"model": "x"})).encode()
    assert gw.post(CHAT, body).status_code == 200


# ---- unknown fields -----------------------------------------------------------------------------


def test_an_unknown_field_is_not_repeated_through_the_sdk(gw: Gateway) -> None:
    sdk = gw.sdk()
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(
            model="echo",
            messages=[{"role": "user", "content": "x"}],
            extra_body={CANARY: 1},
        )
    assert caught.value.code == "unsupported_parameter"
    assert caught.value.param is None
    assert "unknown field" in caught.value.message
    assert CANARY not in caught.value.response.text
    with pytest.raises(openai.BadRequestError) as nested:
        sdk.chat.completions.create(
            model="echo",
            messages=[cast(Any, {"role": "user", "content": "x", CANARY: 1})],
        )
    assert nested.value.param == "messages[0]"
    assert CANARY not in nested.value.response.text


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"model": "echo", "prompt": "x", CANARY: 1}, None),
        ("/v1/embeddings", {"model": "echo", "input": "x", CANARY: 1}, None),
        ("/v1/responses", {"model": "echo", "input": "x", CANARY: 1}, None),
        (
            "/v1/responses",
            {"model": "echo", "input": [{"role": "user", "content": "x", CANARY: 1}]},
            "input[0]",
        ),
        ("/admin/keys", {"role": "app", CANARY: 1}, None),
    ],
    ids=["completions", "embeddings", "responses", "responses-item", "admin"],
)
def test_an_unknown_field_is_named_nowhere(
    gw: Gateway, path: str, body: dict[str, Any], param: str | None
) -> None:
    role = "admin" if path.startswith("/admin") else "app"
    resp = gw.post(path, json.dumps(body).encode(), role=role)
    error = error_of(resp)
    assert (error["code"], error["param"]) == ("unsupported_parameter", param)
    assert "unknown field" in error["message"]
    assert CANARY not in resp.text


def test_a_known_parameter_is_still_named(gw: Gateway) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        gw.sdk().completions.create(model="echo", prompt="x", suffix="y")
    assert (caught.value.code, caught.value.param) == ("unsupported_parameter", "suffix")
    assert "'suffix' is not supported" in caught.value.message


# ---- request ids --------------------------------------------------------------------------------


def test_the_request_id_is_the_servers_everywhere(
    gw: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="airgate.request")
    client_id = "client-9f2e.trace:1"
    raw = gw.sdk().chat.completions.with_raw_response.create(
        model="echo",
        messages=[{"role": "user", "content": "x"}],
        max_tokens=4,
        extra_headers={"x-request-id": client_id},
    )
    server_id = raw.headers["x-request-id"]
    assert server_id != client_id
    assert raw.headers["x-client-request-id"] == client_id
    assert raw.parse().id == f"chatcmpl-{server_id}"
    events = [json.loads(b) for b in gw.audit_bodies()]
    mine = [e for e in events if e.get("request_id") == server_id]
    assert [e["kind"] for e in mine] == ["inference.admitted", "inference.completed"]
    assert not any(client_id in body for body in gw.audit_bodies())
    lines = [r for r in caplog.records if r.name == "airgate.request"]
    (line,) = [r for r in lines if getattr(r, "fields", {}).get("request_id") == server_id]
    assert not any(client_id in f"{r.getMessage()} {getattr(r, 'fields', '')}" for r in lines)
    assert line.fields["status"] == 200  # type: ignore[attr-defined]


def test_two_requests_with_one_client_id_get_two_ids(gw: Gateway) -> None:
    body = json.dumps(chat_body()).encode()
    first = gw.post(CHAT, body, **{"x-request-id": "same"})
    second = gw.post(CHAT, body, **{"x-request-id": "same"})
    assert first.headers["x-request-id"] != second.headers["x-request-id"]
    assert first.json()["id"] != second.json()["id"]


@pytest.mark.parametrize(
    "client_id", ["a b", "x" * 65, "id;drop", "ümlaut", "tab\tid", ""], ids=repr
)
def test_a_client_id_that_is_no_plain_token_is_not_echoed(gw: Gateway, client_id: str) -> None:
    resp = gw.client.get("/health", headers=[(b"x-request-id", client_id.encode("utf-8"))])
    assert resp.status_code == 200
    assert "x-client-request-id" not in resp.headers
    assert resp.headers["x-request-id"] != client_id


def test_a_refused_request_audits_the_servers_id_only(gw: Gateway) -> None:
    resp = gw.client.get(
        "/v1/models", headers={"authorization": "Bearer ag_nope", "x-request-id": "mine-1"}
    )
    assert resp.status_code == 401
    assert resp.headers["x-client-request-id"] == "mine-1"
    assert not any("mine-1" in body for body in gw.audit_bodies())


# ---- audit ranges (SQLite here, PostgreSQL below) ----------------------------------------


def cursor_for(ts: str, seq: str, chain: str = "0123456789abcdef") -> str:
    raw = f"at:{ts}:{chain}:{seq}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def check_cursor_ranges(gw: Gateway) -> None:
    assert gw.post(CHAT, json.dumps(chat_body()).encode()).status_code == 200  # two events
    huge = "9999999999999999999"
    for ts, seq in ((huge, "1"), ("1", huge), ("1", str(MAX_SEQ + 1)), ("1", "0")):
        error = error_of(gw.get("/audit/events", cursor=cursor_for(ts, seq)))
        assert error["param"] == "cursor"
    last = gw.get("/audit/events", cursor=cursor_for(str(MAX_SEQ), str(MAX_SEQ)))
    assert last.status_code == 200 and last.json()["data"] == []
    page = gw.get("/audit/events", limit=1)
    assert page.status_code == 200 and page.json()["next_cursor"]
    assert gw.get("/audit/events", cursor=page.json()["next_cursor"]).status_code == 200


def check_verify_ranges(gw: Gateway) -> None:
    assert gw.post(CHAT, json.dumps(chat_body()).encode()).status_code == 200  # two events
    for params in (
        {"first_seq": "99999999999999999999999"},
        {"first_seq": str(MAX_SEQ + 1)},
        {"last_seq": str(MAX_SEQ + 1)},
        {"first_seq": "0"},
        {"last_seq": "-1"},
        {"first_seq": "3", "last_seq": "2"},
    ):
        resp = gw.get("/audit/verify", **params)
        error_of(resp)
        assert "9999" not in resp.text
    ok = gw.get("/audit/verify", first_seq="1", last_seq="2")
    assert ok.status_code == 200, ok.text
    assert [chain["rows"] for chain in ok.json()["chains"]] == [2]


def test_cursor_ranges_on_sqlite(gw: Gateway) -> None:
    check_cursor_ranges(gw)


def test_verify_ranges_on_sqlite(gw: Gateway) -> None:
    check_verify_ranges(gw)


async def test_audit_ranges_on_postgresql(tmp_path: Path) -> None:
    def run(url: str) -> None:
        overrides = {"audit.database_url": url.replace("+asyncpg", ""), "audit.migrate": True}
        with running_gateway(tmp_path / "data", **overrides) as gateway:
            check_cursor_ranges(gateway)
            check_verify_ranges(gateway)

    async with postgres_database("airgate_wire") as url:
        # the test client runs the app on a loop of its own: drive it from a thread
        await asyncio.to_thread(run, url)
