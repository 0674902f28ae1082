"""The compliance console in process (gateway/console): sign-in and sign-out, an app key and a
bad key refused, CSRF, session timeouts, the security headers, escaping of attacker-influenced
text, and the audit record every page view and export leaves.  The real app on the echo
engine with its SQLite audit log; a browser's requests through Litestar's TestClient."""

from __future__ import annotations

import contextlib
import functools
import json
import re
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
from litestar import Litestar
from litestar.testing import TestClient

from backends.echo import EchoEngine
from gateway.access.auth.apikeys import api_key_checksum
from gateway.access.stack import Security
from gateway.app import create_app
from gateway.config import load_settings
from gateway.console import Console
from gateway.engines.registry import ModelRegistry, ServedModel

XSS_NAME = "<script>alert('name')</script>"
XSS_TEAM = '"><img src=x onerror=alert(1)>'
SECURITY_HEADERS = {
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "x-content-type-options": "nosniff",
}


class Clock:
    """A monotonic clock the test moves by hand (the session store's)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Gateway:
    app: Litestar
    client: TestClient[Litestar]
    security: Security
    console: Console
    data_dir: Path
    clock: Clock

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self.client.blocking_portal.call(functools.partial(fn, *args, **kwargs))

    def key(self, role: str, **fields: Any) -> str:
        """A new key (an auditor without a team reads every team's events)."""
        text, _ = self.call(self.security.keys.create, role, **fields)
        assert isinstance(text, str)
        return text

    @contextlib.contextmanager
    def browser(self, base_url: str = "http://testserver.local") -> Iterator[TestClient[Litestar]]:
        """A fresh browser (its own cookie jar) on the running app: it shares the app's event
        loop (its portal) and never runs the lifespan again."""
        client = TestClient(self.app, base_url=base_url)
        client.blocking_portal = self.client.blocking_portal
        yield client  # nothing to close: the transport calls the app in process

    def bodies(self) -> list[dict[str, Any]]:
        with contextlib.closing(sqlite3.connect(self.data_dir / "airgate.db")) as conn:
            rows = conn.execute("SELECT body FROM audit_events ORDER BY seq").fetchall()
        return [json.loads(row[0]) for row in rows]

    def events(self, resp: httpx.Response) -> list[dict[str, Any]]:
        request_id = resp.headers["x-request-id"]
        return [e for e in self.bodies() if e.get("request_id") == request_id]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    data_dir = tmp_path_factory.mktemp("console") / "data"
    settings = load_settings(None, environ={}, overrides={"data_dir": str(data_dir)})
    registry = ModelRegistry([ServedModel("echo", EchoEngine(context_length=512))])
    app = create_app(settings, registry=registry)
    with TestClient(app) as client:
        while client.get("/ready").status_code != 200:  # engines start in the background
            pass
        security: Security = app.state["security_holder"].get()
        console: Console = app.state["console"]
        clock = Clock()
        console.sessions.clock = clock
        yield Gateway(app, client, security, console, data_dir, clock)


def hidden(text: str, name: str = "csrf") -> str:
    found = re.search(rf'name="{name}" value="([^"]*)"', text)
    assert found is not None, text[:2000]
    return found.group(1)


def sign_in(client: TestClient[Litestar], credential: str) -> httpx.Response:
    form = client.get("/console/signin")
    assert form.status_code == 200
    return client.post(
        "/console/signin",
        data={"csrf": hidden(form.text), "credential": credential},
        follow_redirects=False,
    )


@pytest.fixture
def browser(gw: Gateway) -> Iterator[TestClient[Litestar]]:
    with gw.browser() as client:
        yield client


def signed_in(gw: Gateway, client: TestClient[Litestar], role: str = "auditor", **kw: Any) -> str:
    """Sign `client` in with a new key of `role`; the session's CSRF token."""
    resp = sign_in(client, gw.key(role, **kw))
    assert resp.status_code == 303, resp.text
    page = client.get("/console/events")
    assert page.status_code == 200
    return hidden(page.text)


def assert_headers(resp: httpx.Response, page: bool = True) -> None:
    csp = resp.headers["content-security-policy"]
    assert csp.startswith("default-src 'self'")
    assert "unsafe-inline" not in csp
    for name, value in SECURITY_HEADERS.items():
        assert resp.headers[name] == value, name
    if page:
        assert resp.headers["cache-control"] == "no-store"


def test_a_page_without_a_session_lands_on_sign_in(browser: TestClient[Litestar]) -> None:
    for path in ("/console", "/console/events", "/console/integrity", "/console/keys"):
        resp = browser.get(path, follow_redirects=False)
        assert resp.status_code == 303, path
        assert resp.headers["location"] == "/console/signin"
        assert_headers(resp)
    form = browser.get("/console/signin")
    assert form.status_code == 200
    assert 'type="password"' in form.text
    assert_headers(form)
    assert form.text.count("<script") == 1  # the vendored file, never an inline script
    assert '<script src="/console/static/console.js"' in form.text
    css = browser.get("/console/static/console.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert_headers(css, page=False)
    assert browser.get("/console/static/..%2F..%2Fapp.py").status_code == 404


def test_sign_in_sets_a_strict_httponly_cookie_and_is_audited(
    gw: Gateway, browser: TestClient[Litestar]
) -> None:
    key = gw.key("auditor", name="alice")
    resp = sign_in(browser, key)
    assert resp.status_code == 303
    assert resp.headers["location"] == "/console/events"
    cookie = next(
        c for c in resp.headers.get_list("set-cookie") if c.startswith("airgate_console=")
    )
    attributes = {part.strip().lower() for part in cookie.split(";")}
    assert "httponly" in attributes
    assert "samesite=strict" in attributes
    assert "path=/console" in attributes
    assert "secure" not in attributes  # plain HTTP here; under TLS it is Secure
    session_id = cookie.split(";")[0].split("=", 1)[1]
    assert len(session_id) >= 43  # 256 bits, URL-safe base64
    (event,) = gw.events(resp)
    assert event["kind"] == "audit.access"
    assert event["action"] == "console.signin"
    assert event["outcome"] == "success"
    assert event["detail"] == {"via": "console"}
    assert event["principal"]["key_id"] == key.split("_")[1]
    assert key.split("_")[2] not in json.dumps(gw.bodies())  # never the secret
    assert session_id not in json.dumps(gw.bodies())


def test_a_bad_key_is_refused_and_audited_without_the_credential(
    gw: Gateway, browser: TestClient[Litestar]
) -> None:
    real, other = gw.key("auditor").split("_"), gw.key("auditor").split("_")
    body = "_".join([real[0], real[1], other[2]])  # a real id with another key's secret
    wrong = f"{body}_{api_key_checksum(body)}"  # well formed: it reaches the key store
    resp = sign_in(browser, wrong)
    assert resp.status_code == 401
    assert "not accepted" in resp.text
    assert wrong not in resp.text
    (event,) = gw.events(resp)
    assert event["kind"] == "auth.failure"
    assert event["error_class"] == "wrong_secret"
    assert event["client_address"]
    assert wrong not in json.dumps(event)
    assert browser.get("/console/events", follow_redirects=False).status_code == 303


def test_an_app_key_is_refused_with_a_clear_page(
    gw: Gateway, browser: TestClient[Litestar]
) -> None:
    resp = sign_in(browser, gw.key("app", team="apps"))
    assert resp.status_code == 403
    assert "needs an" in resp.text and "auditor" in resp.text
    assert "airgate_console=" not in resp.headers.get("set-cookie", "")
    (event,) = gw.events(resp)
    assert (event["kind"], event["outcome"], event["error_class"]) == (
        "audit.access",
        "denied",
        "permission_denied",
    )
    assert browser.get("/console/events", follow_redirects=False).status_code == 303


def test_the_sign_in_form_needs_its_own_token(gw: Gateway, browser: TestClient[Litestar]) -> None:
    key = gw.key("auditor")
    resp = browser.post("/console/signin", data={"credential": key}, follow_redirects=False)
    assert resp.status_code == 403
    assert_headers(resp)
    assert browser.get("/console/events", follow_redirects=False).status_code == 303


@pytest.mark.parametrize(
    ("path", "fields"),
    [
        ("/console/signout", {}),
        ("/console/integrity", {}),
        ("/console/keys", {"role": "app", "name": "sneaky"}),
    ],
)
def test_a_post_without_the_csrf_token_is_403_and_audited(
    gw: Gateway, browser: TestClient[Litestar], path: str, fields: dict[str, str]
) -> None:
    csrf = signed_in(gw, browser, "admin", name="csrf-admin")
    for sent in (fields, {**fields, "csrf": csrf[:-2] + "xx"}):
        resp = browser.post(path, data=sent, follow_redirects=False)
        assert resp.status_code == 403, resp.text
        assert "security token" in resp.text
        assert_headers(resp)
        (event,) = [e for e in gw.events(resp) if e.get("error_class") == "csrf_failed"]
        assert event["outcome"] == "denied"
        assert event["detail"]["via"] == "console"
    assert "sneaky" not in json.dumps(gw.bodies())  # no key was made
    assert browser.get("/console/events").status_code == 200  # still signed in


def test_sign_out_ends_the_session(gw: Gateway, browser: TestClient[Litestar]) -> None:
    csrf = signed_in(gw, browser)
    cookie = browser.cookies["airgate_console"]
    resp = browser.post("/console/signout", data={"csrf": csrf}, follow_redirects=False)
    assert resp.status_code == 303
    assert resp.headers["location"] == "/console/signin"
    assert gw.events(resp)[0]["action"] == "console.signout"
    with gw.browser() as replay:  # the old cookie, replayed, is worthless
        replay.cookies.set("airgate_console", cookie, path="/console")
        resp = replay.get("/console/events", follow_redirects=False)
        assert resp.status_code == 303 and resp.headers["location"] == "/console/signin"


def test_idle_and_absolute_timeouts_land_on_sign_in(
    gw: Gateway, browser: TestClient[Litestar]
) -> None:
    sessions = gw.console.sessions
    signed_in(gw, browser)
    gw.clock.now += sessions.idle_s - 1
    assert browser.get("/console/events", follow_redirects=False).status_code == 200
    gw.clock.now += sessions.idle_s + 1  # idle too long
    resp = browser.get("/console/events", follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"] == "/console/signin"

    signed_in(gw, browser)
    step = sessions.idle_s * 0.9
    elapsed = 0.0
    while elapsed + step < sessions.absolute_s:  # busy, never idle, until the absolute limit
        gw.clock.now += step
        elapsed += step
        assert browser.get("/console/integrity", follow_redirects=False).status_code == 200
    gw.clock.now += step
    resp = browser.get("/console/events", follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"] == "/console/signin"


def test_a_revoked_keys_session_ends(gw: Gateway, browser: TestClient[Litestar]) -> None:
    key = gw.key("auditor", name="leaving")
    assert sign_in(browser, key).status_code == 303
    assert browser.get("/console/events").status_code == 200
    gw.call(gw.security.keys.revoke, key.split("_")[1])
    resp = browser.get("/console/events", follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"] == "/console/signin"


def test_pages_views_and_exports_are_audited_as_console_access(
    gw: Gateway, browser: TestClient[Litestar]
) -> None:
    signed_in(gw, browser)
    app_key = gw.key("app", team="audited-team")
    chat = gw.client.post(
        "/v1/chat/completions",
        headers={"authorization": f"Bearer {app_key}"},
        json={"model": "echo", "messages": [{"role": "user", "content": "hello"}]},
    )
    assert chat.status_code == 200
    events = browser.get("/console/events", params={"team": "audited-team"})
    assert events.status_code == 200
    assert_headers(events)
    links = re.findall(r'href="/console/events/([0-9a-f]+)"', events.text)
    assert links, events.text
    (view,) = gw.events(events)
    assert (view["kind"], view["action"], view["detail"]) == (
        "audit.access",
        "console.events",
        {"via": "console", "count": len(links)},
    )
    one = browser.get(f"/console/events/{links[0]}")
    assert one.status_code == 200
    with contextlib.closing(sqlite3.connect(gw.data_dir / "airgate.db")) as conn:
        row_hash, prev_hash, seq = conn.execute(
            "SELECT row_hash, prev_hash, seq FROM audit_events WHERE event_id = ?", (links[0],)
        ).fetchone()
    for shown in (row_hash, prev_hash, f">{seq}<", "Covering checkpoint", "audited-team"):
        assert shown in one.text, shown
    assert "Checkpoint</dt><dd" in one.text  # the echo chat's row is signed at once
    assert gw.events(one)[0]["action"] == "console.event"
    for fmt, marker in (("jsonl", '"row_hash"'), ("csv", "chain,seq,event_id"), ("ocsf", "6003")):
        export = browser.get("/console/export", params={"format": fmt, "team": "audited-team"})
        assert export.status_code == 200
        assert marker in export.text
        assert "attachment" in export.headers["content-disposition"]
        assert_headers(export)
        (record,) = gw.events(export)
        assert record["action"] == "audit.export"
        assert record["detail"] == {"via": "console", "format": fmt}
    assert browser.get("/console/export", params={"format": "xml"}).status_code == 400


def test_bad_filters_are_a_message_not_a_500(gw: Gateway, browser: TestClient[Litestar]) -> None:
    signed_in(gw, browser)
    for params in ({"start": "yesterday"}, {"kind": "nope"}, {"cursor": "garbage"}):
        resp = browser.get("/console/events", params=params)
        assert resp.status_code == 400, params
        assert 'role="alert"' in resp.text
    assert browser.get("/console/events/" + "f" * 80).status_code == 404


def test_attacker_influenced_text_renders_inert(gw: Gateway, browser: TestClient[Litestar]) -> None:
    # the key store takes any text (the admin API is what restricts names): a hostile one
    gw.call(gw.security.keys.create, "app", team=XSS_TEAM, name=XSS_NAME)
    signed_in(gw, browser, "admin", name="xss-admin")
    keys = browser.get("/console/keys")
    assert keys.status_code == 200
    assert XSS_NAME not in keys.text and XSS_TEAM not in keys.text
    assert "&lt;script&gt;alert(&#39;name&#39;)&lt;/script&gt;" in keys.text
    assert "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;" in keys.text
    events = browser.get("/console/events", params={"team": XSS_TEAM, "model": XSS_NAME})
    assert XSS_NAME not in events.text and XSS_TEAM not in events.text
    assert events.text.count("<script") == 1  # the vendored script tag only


def test_a_team_auditor_reads_only_its_team(gw: Gateway, browser: TestClient[Litestar]) -> None:
    signed_in(gw, browser, "auditor", team="blue")
    mine = browser.get("/console/events")
    assert mine.status_code == 200
    assert 'value="blue" readonly' in mine.text
    other = browser.get("/console/events", params={"team": "red"})
    assert other.status_code == 403
    assert gw.events(other)[0]["outcome"] == "denied"
    assert browser.get("/console/keys").status_code == 403  # keys are for admins


def test_keys_are_created_once_and_revoked(gw: Gateway, browser: TestClient[Litestar]) -> None:
    csrf = signed_in(gw, browser, "admin", name="key-admin")
    made = browser.post(
        "/console/keys", data={"csrf": csrf, "role": "auditor", "team": "green", "name": "bob"}
    )
    assert made.status_code == 200
    key = hidden(
        made.text.replace('id="new-key" class="mono" type="text" value', 'name="k" value'), "k"
    )
    assert key.startswith("ag_")
    key_id = key.split("_")[1]
    (event,) = [e for e in gw.events(made) if e["action"] == "keys.create"]
    assert event["kind"] == "admin.action" and event["detail"]["via"] == "console"
    assert key.split("_")[2] not in browser.get("/console/keys").text  # shown once only
    with gw.browser() as other:
        assert sign_in(other, key).status_code == 303
        revoked = browser.post(f"/console/keys/{key_id}/revoke", data={"csrf": csrf})
        assert revoked.status_code == 200
        assert f"Key {key_id} is revoked" in revoked.text
        assert other.get("/console/events", follow_redirects=False).status_code == 303
    again = browser.post(f"/console/keys/{key_id}/revoke", data={"csrf": csrf})
    assert again.status_code == 404
    bad = browser.post("/console/keys", data={"csrf": csrf, "role": "auditor"})
    assert bad.status_code == 400 and "needs a team" in bad.text


def test_integrity_and_policies_pages(gw: Gateway, browser: TestClient[Litestar]) -> None:
    csrf = signed_in(gw, browser)
    page = browser.get("/console/integrity")
    assert page.status_code == 200 and "Run verification" in page.text
    assert "Signer key id" in page.text
    ran = browser.post("/console/integrity", data={"csrf": csrf})
    assert ran.status_code == 200
    # this gateway pins no checkpoint key: verification must say so, in words
    assert "NOT intact" in ran.text
    assert "no checkpoint key is pinned" in ran.text or "does not pin" in ran.text
    (event,) = [e for e in gw.events(ran) if e["action"] == "audit.verify"]
    assert event["detail"]["via"] == "console" and event["detail"]["ok"] == 0
    policies = browser.get("/console/policies")
    assert policies.status_code == 200
    assert gw.security.policy.current.version in policies.text


def test_the_bearer_api_is_unchanged_and_the_console_404_is_a_page(
    gw: Gateway, browser: TestClient[Litestar]
) -> None:
    assert gw.client.get("/audit/events").status_code == 401  # the API still needs a bearer
    missing = browser.get("/console/no/such/page")
    assert missing.status_code == 404
    assert missing.headers["content-type"].startswith("text/html")
    assert_headers(missing)


def test_the_cookie_is_secure_over_tls(gw: Gateway) -> None:
    with gw.browser("https://console.example") as tls:
        resp = sign_in(tls, gw.key("auditor"))
        assert resp.status_code == 303
        cookie = next(
            c for c in resp.headers.get_list("set-cookie") if c.startswith("airgate_console=")
        )
        assert "secure" in {part.strip().lower() for part in cookie.split(";")}


def test_failed_sign_ins_spend_the_addresss_budget(tmp_path: Path) -> None:
    overrides = {"data_dir": str(tmp_path / "data"), "auth.failure_burst": 2}
    settings = load_settings(None, environ={}, overrides=overrides)
    app = create_app(settings, registry=ModelRegistry([ServedModel("echo", EchoEngine())]))
    with TestClient(app) as client:
        security: Security = app.state["security_holder"].get()
        good, _ = client.blocking_portal.call(security.keys.create, "auditor")
        bad = "ag_" + "A" * (len(good) - 3)
        assert [sign_in(client, bad).status_code for _ in range(2)] == [401, 401]
        limited = sign_in(client, good)  # even a good key waits: the budget is spent
        assert limited.status_code == 429
        assert int(limited.headers["retry-after"]) >= 1
        assert "Too many failed sign-ins" in limited.text
        api = client.get("/audit/events", headers={"authorization": "Bearer " + bad})
        assert api.status_code == 429  # one budget for the console and the API


def test_an_unreadable_row_is_explained_not_a_bare_500(
    gw: Gateway, browser: TestClient[Litestar]
) -> None:
    signed_in(gw, browser, "auditor", team="corrupt-team")
    app_key = gw.key("app", team="corrupt-team")
    chat = gw.client.post(
        "/v1/chat/completions",
        headers={"authorization": f"Bearer {app_key}"},
        json={"model": "echo", "messages": [{"role": "user", "content": "hello"}]},
    )
    assert chat.status_code == 200
    (event,) = [e for e in gw.events(chat) if e["kind"] == "inference.completed"]
    with contextlib.closing(sqlite3.connect(gw.data_dir / "airgate.db")) as conn:
        conn.execute("DROP TRIGGER IF EXISTS audit_events_no_update")
        conn.execute("UPDATE audit_events SET body = '{' WHERE event_id = ?", (event["event_id"],))
        conn.commit()
    for path in ("/console/events", f"/console/events/{event['event_id']}"):
        resp = browser.get(path)
        assert resp.status_code == 500, path
        assert "Run verification" in resp.text
        assert_headers(resp)


def test_a_jwt_signs_in_when_configured(tmp_path: Path) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwks = tmp_path / "jwks.json"
    jwk = RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)
    jwks.write_text(json.dumps({"keys": [{**jwk, "kid": "k1", "use": "sig", "alg": "RS256"}]}))
    idp = {"jwks_file": str(jwks), "issuer": "https://idp.example", "audience": "airgate"}
    overrides = {"data_dir": str(tmp_path / "data"), "auth.jwt": idp}
    settings = load_settings(None, environ={}, overrides=overrides)

    def token(roles: list[str]) -> str:
        now = int(time.time())
        claims = {"iss": idp["issuer"], "aud": "airgate", "sub": "officer-7", "iat": now}
        claims |= {"exp": now + 300, "team": "legal", "roles": roles}
        return jwt.encode(claims, key, algorithm="RS256", headers={"kid": "k1"})

    app = create_app(settings, registry=ModelRegistry([ServedModel("echo", EchoEngine())]))
    with TestClient(app) as client:
        assert sign_in(client, token(["app"])).status_code == 403
        assert sign_in(client, token(["auditor"])).status_code == 303
        page = client.get("/console/events")
        assert page.status_code == 200
        assert "officer-7" in page.text and 'value="legal" readonly' in page.text
