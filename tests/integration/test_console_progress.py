"""Verification with progress (issue 18): the progress hook of `verify_log`, and the console's
Integrity page, which streams each chain's progress and then the findings, with no script; and
the events filter by deployment, in the console and the compliance API.

The real app on the echo engine with its SQLite audit log, its signing key pinned, and enough
events that verification reads several pages of rows; the page is fetched by a browser's
requests through Litestar's TestClient, and once as raw ASGI to see the body leave in parts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from litestar import Litestar
from litestar.testing import TestClient

from backends.echo import EchoEngine
from bundles.kms.signer import LocalSigner
from gateway.access.stack import Security
from gateway.app import create_app
from gateway.audit import AuditEvent, AuditPrincipal, AuditWriter, new_event_id, verify_log
from gateway.audit.verify import _PAGE
from gateway.config import load_settings
from gateway.engines.registry import ModelRegistry, ServedModel

SEEDED = 2 * _PAGE + 700  # three pages of rows, the last one partial
T0 = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)
LINE = re.compile(r"<p data-progress( data-done)?>Chain <span class=\"mono\">([0-9a-f]+)</span>: "
                  r"([0-9,]+) of ([0-9,]+) rows checked")  # fmt: skip


@dataclass
class Gateway:
    app: Litestar
    client: TestClient[Litestar]
    security: Security
    data_dir: Path


async def _seed(writer: AuditWriter, n: int) -> None:
    events = [
        AuditEvent(
            event_id=new_event_id(),
            ts=T0 + timedelta(seconds=i),
            kind="inference.completed",
            outcome="success",
            principal=AuditPrincipal(key_id="seed-key", team="seed-team", method="api_key"),
            model="echo",
            deployment="echo-0",
            http_status=200,
        )
        for i in range(n)
    ]
    await asyncio.gather(*(writer.append(e) for e in events))  # group commits take them all


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    root = tmp_path_factory.mktemp("console-progress")
    key_file = root / "audit-signing.key"
    signer = LocalSigner.from_file(key_file, create=True)
    settings = load_settings(
        None,
        environ={},
        overrides={
            "data_dir": str(root / "data"),
            "audit.signer.key_ref": str(key_file),
            "audit.trusted_keys": [signer.verify_key.text],
        },
    )
    app = create_app(settings, registry=ModelRegistry([ServedModel("echo", EchoEngine())]))
    with TestClient(app) as client:
        while client.get("/ready").status_code != 200:  # engines start in the background
            pass
        security: Security = app.state["security_holder"].get()
        client.blocking_portal.call(_seed, security.audit, SEEDED)
        yield Gateway(app, client, security, root / "data")


@contextlib.contextmanager
def signed_in(gw: Gateway) -> Iterator[tuple[TestClient[Litestar], str]]:
    """A fresh browser signed in with a new auditor key, and its session's CSRF token."""
    client = TestClient(gw.app, base_url="http://testserver.local")
    client.blocking_portal = gw.client.blocking_portal
    key, _ = gw.client.blocking_portal.call(functools.partial(gw.security.keys.create, "auditor"))
    form = client.get("/console/signin")
    csrf = re.search(r'name="csrf" value="([^"]*)"', form.text)
    assert csrf is not None
    resp = client.post(
        "/console/signin",
        data={"csrf": csrf.group(1), "credential": key},
        follow_redirects=False,
    )
    assert resp.status_code == 303, resp.text
    page = client.get("/console/integrity")
    token = re.search(r'name="csrf" value="([^"]*)"', page.text)
    assert token is not None
    yield client, token.group(1)


def audited(gw: Gateway, request_id: str) -> list[dict[str, Any]]:
    with contextlib.closing(sqlite3.connect(gw.data_dir / "airgate.db")) as conn:
        rows = conn.execute("SELECT body FROM audit_events ORDER BY ts_us").fetchall()
    bodies = [json.loads(row[0]) for row in rows]
    return [b for b in bodies if b.get("request_id") == request_id]


def progress_of(text: str) -> list[tuple[str, int, int, bool]]:
    return [
        (m.group(2), int(m.group(3).replace(",", "")), int(m.group(4).replace(",", "")),
         bool(m.group(1)))
        for m in LINE.finditer(text)
    ]  # fmt: skip


def test_the_progress_hook_reports_each_chain_from_zero_to_its_total(gw: Gateway) -> None:
    calls: list[tuple[str, int, int]] = []
    report = gw.client.blocking_portal.call(
        functools.partial(
            verify_log,
            gw.security.engine,
            gw.security.trusted_audit_keys,
            progress=lambda *update: calls.append(update),
        )
    )
    assert report.ok
    for chain in report.chains:
        mine = [(done, total) for name, done, total in calls if name == chain.log_id]
        total = chain.rows
        assert mine[0] == (0, total) and mine[-1] == (total, total)
        assert [d for d, _ in mine] == sorted(d for d, _ in mine)  # never backwards
        assert len(mine) == 1 + -(-total // _PAGE)  # at the start, then after every page
    assert sum(c.rows for c in report.chains) >= SEEDED


def test_the_integrity_page_streams_progress_then_the_findings(gw: Gateway) -> None:
    with signed_in(gw) as (browser, csrf):
        ran = browser.post("/console/integrity", data={"csrf": csrf})
    assert ran.status_code == 200
    assert ran.headers["content-type"].startswith("text/html")
    csp = ran.headers["content-security-policy"]
    assert csp.startswith("default-src 'self'") and "unsafe-inline" not in csp
    assert ran.headers["x-frame-options"] == "DENY"
    assert ran.headers["cache-control"] == "no-store"
    text = ran.text
    assert "<script>" not in text and " on" + "load=" not in text  # no inline script
    lines = progress_of(text)
    assert lines, text[:3000]
    assert len({name for name, *_ in lines}) == 1  # this gateway writes one chain
    done = [d for _, d, _, _ in lines]
    assert done == sorted(done)  # a line a tick: a small log may show only its last
    _, last, total, finished = lines[-1]
    assert last == total >= SEEDED and finished
    # the progress comes first, then the outcome, then the rest of the page, once
    assert (
        text.index("Verification progress")
        < text.index("data-progress")
        < text.index('id="result"')
    )
    assert "The log is intact" in text and text.count("</html>") == 1
    assert text.count("Latest checkpoints") == 1
    (event,) = [
        e for e in audited(gw, ran.headers["x-request-id"]) if e["action"] == "audit.verify"
    ]
    assert event["detail"]["via"] == "console" and event["detail"]["ok"] == 1
    assert event["detail"]["rows"] >= total


async def _raw_post(
    app: Litestar, path: str, body: bytes, cookie: str, *, leave: bool = False
) -> list[dict[str, Any]]:
    """The ASGI messages the app sends for one POST (the body in the parts it was sent in);
    `leave`: the browser goes away as soon as the request is sent."""
    messages: list[dict[str, Any]] = []
    received = False
    complete = asyncio.Event()
    if leave:
        complete.set()

    async def receive() -> dict[str, Any]:
        nonlocal received
        if not received:
            received = True
            return {"type": "http.request", "body": body, "more_body": False}
        await complete.wait()  # the browser stays until the page is complete
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            complete.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"testserver.local"),
            (b"content-type", b"application/x-www-form-urlencoded"),
            (b"content-length", str(len(body)).encode()),
            (b"cookie", cookie.encode()),
        ],
        "client": ("127.0.0.1", 40000),
        "server": ("testserver.local", 80),
    }
    await app(scope, receive, send)  # type: ignore[arg-type]
    return messages


def test_the_page_leaves_in_parts_before_verification_ends(gw: Gateway) -> None:
    with signed_in(gw) as (browser, csrf):
        cookie = "; ".join(f"{k}={v}" for k, v in browser.cookies.items())
        messages = gw.client.blocking_portal.call(
            _raw_post, gw.app, "/console/integrity", urlencode({"csrf": csrf}).encode(), cookie
        )
    assert messages[0]["type"] == "http.response.start" and messages[0]["status"] == 200
    parts = [m["body"].decode() for m in messages if m["type"] == "http.response.body"]
    assert len(parts) >= 4  # the head, progress, the section's end, the findings
    first = parts[0]
    assert "Verification progress" in first and "The log is" not in first  # sent before the outcome
    assert any("data-progress" in p for p in parts[1:-1])
    assert "The log is intact" in "".join(parts)


def test_a_browser_that_goes_away_is_shown_nothing_and_nothing_is_recorded(gw: Gateway) -> None:
    with signed_in(gw) as (browser, csrf):
        cookie = "; ".join(f"{k}={v}" for k, v in browser.cookies.items())
        messages = gw.client.blocking_portal.call(
            functools.partial(
                _raw_post,
                gw.app,
                "/console/integrity",
                urlencode({"csrf": csrf}).encode(),
                cookie,
                leave=True,
            )
        )
    start = messages[0]
    assert start["type"] == "http.response.start"
    request_id = dict(start["headers"])[b"x-request-id"].decode()
    sent = "".join(m["body"].decode() for m in messages if m["type"] == "http.response.body")
    assert "The log is" not in sent  # stopped before the outcome: nothing shown, nothing run on
    assert [e for e in audited(gw, request_id) if e["action"] == "audit.verify"] == []


def test_without_the_csrf_token_nothing_is_verified(gw: Gateway) -> None:
    with signed_in(gw) as (browser, _):
        refused = browser.post("/console/integrity", data={"csrf": "forged"})
    assert refused.status_code == 403
    assert "data-progress" not in refused.text and "The log is" not in refused.text
    events = audited(gw, refused.headers["x-request-id"])
    assert [e["outcome"] for e in events if e["action"] == "audit.verify"] == ["denied"]


def test_events_are_filtered_by_deployment_in_the_console_and_the_api(gw: Gateway) -> None:
    with signed_in(gw) as (browser, _):
        page = browser.get("/console/events", params={"deployment": "echo-0"})
        assert page.status_code == 200 and 'id="f-deployment"' in page.text
        assert 'name="deployment" value="echo-0"' in page.text  # the filter is shown back
        assert page.text.count("<tr") > 10
        none = browser.get("/console/events", params={"deployment": "echo-1"})
        assert none.status_code == 200 and "No events match this filter" in none.text
    key, _ = gw.client.blocking_portal.call(functools.partial(gw.security.keys.create, "auditor"))
    headers = {"Authorization": f"Bearer {key}"}
    found = gw.client.get("/audit/events", params={"deployment": "echo-0"}, headers=headers)
    assert found.status_code == 200
    data = found.json()["data"]
    assert data and {r["event"]["deployment"] for r in data} == {"echo-0"}
    other = gw.client.get("/audit/events", params={"deployment": "echo-1"}, headers=headers)
    assert other.status_code == 200 and other.json()["data"] == []
