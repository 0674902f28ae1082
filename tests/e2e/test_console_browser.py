"""The compliance console in a real browser: Playwright driving Debian's Chromium against a
real `airgate serve` (echo engine, SQLite, a pinned checkpoint key).  A compliance officer
signs in by keyboard, filters, opens an event, verifies the log, exports CSV, and signs out; an
admin creates a key (copy button), revokes it, and sees a hostile key name render inert; after a
row is tampered with in the database, verification shows the first bad sequence number.  The
usage page charts the requests made (server-rendered SVG) and the cost page prices the
deployment from `[cost]`.

A screenshot of each page is kept: under `$AIRGATE_TEST_ARTIFACTS/console` when that is set,
else in the test's tmp directory.  Chromium comes from `scripts/test-services.sh` (Playwright's
own browser download cannot work offline).
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import os
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_process import Server, add_test_keys, start_server, stop_and_check

from bundles import create_signing_key
from bundles.kms.signer import VerifyKey
from gateway.access.keys import key_store
from gateway.config import load_settings

pytestmark = pytest.mark.e2e

playwright = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"  # Debian's package (scripts/test-services.sh)
XSS_NAME = "<img src=x onerror=alert(document.domain)>"
CONFIG = """
[audit]
trusted_keys = ["{pinned}"]

[[models]]
id = "echo"
engine = "echo"

# the issue's published example: $2,182 + $150 + $500 a month against $4.37 per 1M tokens
[cost]
api_price_per_million = 4.37

[[cost.deployments]]
deployment = "echo"
hardware_per_month = 2182
operations_per_month = 650
"""


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = os.environ.get("AIRGATE_TEST_ARTIFACTS")
    path = Path(root) / "console" if root else tmp_path_factory.mktemp("console-screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def hostile_key(data: Path) -> None:
    """An app key whose name is markup (the key store takes any text up to 128 characters)."""

    async def create() -> None:
        settings = load_settings(None, environ={}, overrides={"data_dir": str(data)})
        async with key_store(settings) as store:
            await store.create("app", team="hostile", name=XSS_NAME)

    asyncio.run(create())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("console-e2e")
    data = root / "data"
    pinned = VerifyKey(create_signing_key(data / "keys" / "audit-signing.key")).text
    config = root / "airgate.toml"
    config.write_text(CONFIG.format(pinned=pinned))
    add_test_keys(data, ("app", "auditor", "admin"))
    hostile_key(data)
    srv = start_server(data, root / "server.log", {"AIRGATE_CONFIG": str(config)})
    try:
        for n in range(3):
            resp = httpx.post(
                f"{srv.base_url}/v1/chat/completions",
                headers=srv.auth(),
                json={"model": "echo", "messages": [{"role": "user", "content": f"hi {n}"}]},
                timeout=30,
            )
            assert resp.status_code == 200, resp.text
        yield srv
    finally:
        stop_and_check(srv)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} is missing: run scripts/test-services.sh")
    with playwright.sync_playwright() as p:
        # --no-sandbox: CI containers run as root, where Chromium's sandbox cannot start
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


@contextlib.contextmanager
def page_of(browser: object, server: Server) -> Iterator[object]:
    context = browser.new_context(  # type: ignore[attr-defined]
        base_url=server.base_url,
        accept_downloads=True,
        permissions=["clipboard-read", "clipboard-write"],
    )
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    try:
        yield page
    finally:
        context.close()
    assert dialogs == [], f"a script ran: {dialogs}"
    assert not [e for e in errors if "Content Security Policy" in e], errors


def press(page: object, selector: str) -> None:
    """Move the keyboard focus to `selector` and press Enter (no mouse anywhere)."""
    page.focus(selector)  # type: ignore[attr-defined]
    page.keyboard.press("Enter")  # type: ignore[attr-defined]


def type_into(page: object, selector: str, text: str) -> None:
    page.focus(selector)  # type: ignore[attr-defined]
    page.keyboard.type(text)  # type: ignore[attr-defined]


def sign_in(page: object, key: str) -> None:
    page.goto("/console")  # type: ignore[attr-defined]
    page.wait_for_url("**/console/signin")  # type: ignore[attr-defined]
    # the field has autofocus: the officer just types and presses Enter
    page.keyboard.type(key)  # type: ignore[attr-defined]
    page.keyboard.press("Enter")  # type: ignore[attr-defined]
    page.wait_for_url("**/console/events")  # type: ignore[attr-defined]


def sign_out(page: object) -> None:
    press(page, "form.signout button")
    page.wait_for_url("**/console/signin")  # type: ignore[attr-defined]


def verify(page: object) -> str:
    press(page, 'a[href="/console/integrity"]')
    page.wait_for_url("**/console/integrity")  # type: ignore[attr-defined]
    press(page, "form[action='/console/integrity'] button")
    page.wait_for_selector("#result")  # type: ignore[attr-defined]
    text: str = page.inner_text("#result")  # type: ignore[attr-defined]
    return text


def test_an_officer_reviews_verifies_and_exports_by_keyboard(
    server: Server, browser: object, shots: Path, tmp_path: Path
) -> None:
    with page_of(browser, server) as page:
        page.goto("/console/signin")
        page.screenshot(path=shots / "01-signin.png", full_page=True)
        sign_in(page, server.key("auditor"))
        page.keyboard.press("Tab")  # the first stop is the skip link, then the navigation
        assert page.evaluate("document.activeElement.className") == "skip"
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.getAttribute('href')") == "/console/events"
        page.screenshot(path=shots / "02-events.png", full_page=True)

        type_into(page, "#f-model", "echo")
        page.keyboard.press("Enter")  # submits the filter form
        page.wait_for_url("**/console/events?*model=echo*")
        models = page.locator("table.events tbody tr td:nth-child(6)").all_inner_texts()
        assert models and set(models) == {"echo"}, models
        page.screenshot(path=shots / "03-filtered.png", full_page=True)

        with page.expect_download() as download:
            press(page, "p.exports a:nth-of-type(2)")  # CSV of the current filter
        saved = tmp_path / "export.csv"
        download.value.save_as(saved)
        rows = list(csv.DictReader(io.StringIO(saved.read_text())))
        assert rows and {r["model"] for r in rows} == {"echo"}
        assert len(rows) >= len(models)

        press(page, "table.events tbody tr:first-child a")
        page.wait_for_url("**/console/events/*")
        body = page.inner_text("main")
        assert "Row hash" in body and "Covering checkpoint" in body
        assert "pinned" in body and "not pinned" not in body  # signed by the pinned key
        page.screenshot(path=shots / "04-event.png", full_page=True)

        assert "The log is intact" in verify(page)
        page.screenshot(path=shots / "05-integrity.png", full_page=True)

        sign_out(page)
        page.goto("/console/events")
        page.wait_for_url("**/console/signin")  # the session is gone
    # every request the browser made was answered by the console (no /favicon.ico 401s)
    failures = httpx.get(
        f"{server.base_url}/audit/events",
        params={"kind": "auth.failure"},
        headers=server.auth("auditor"),
        timeout=30,
    ).json()["data"]
    assert failures == []
    views = httpx.get(
        f"{server.base_url}/audit/events",
        params={"kind": "audit.access", "limit": 1000},
        headers=server.auth("auditor"),
        timeout=30,
    ).json()["data"]
    console = {e["event"]["action"] for e in views if e["event"]["detail"].get("via") == "console"}
    assert {"console.signin", "console.events", "console.event", "audit.export"} <= console
    assert {"audit.verify", "console.signout"} <= console


def test_an_admin_creates_copies_and_revokes_a_key(
    server: Server, browser: object, shots: Path
) -> None:
    with page_of(browser, server) as page:
        sign_in(page, server.key("admin"))
        press(page, 'a[href="/console/keys"]')
        page.wait_for_url("**/console/keys")
        assert XSS_NAME in page.inner_text("table.keys")  # shown as text, run as nothing
        assert page.locator("table.keys img").count() == 0

        page.focus("#k-role")
        page.keyboard.press("ArrowDown")  # app -> auditor
        type_into(page, "#k-team", "audit-blue")
        type_into(page, "#k-name", "browser-made")
        press(page, "form.create button")
        page.wait_for_selector("#new-key")
        key = page.input_value("#new-key")
        assert key.startswith("ag_")
        press(page, "button[data-copy]")
        # a selector, not wait_for_function: its polling evaluates a string, which the console's
        # CSP (no unsafe-eval) refuses
        page.locator(".copied:not(:empty)").wait_for(state="attached")
        if page.inner_text(".copied") == "Copied":
            assert page.evaluate("navigator.clipboard.readText()") == key
        page.screenshot(path=shots / "06-key-created.png", full_page=True)

        key_id = key.split("_")[1]
        api = f"{server.base_url}/audit/events"
        assert httpx.get(api, headers={"Authorization": f"Bearer {key}"}).status_code == 200
        press(page, f"button[aria-label='Revoke key {key_id}']")
        page.wait_for_selector(f"text=Key {key_id} is revoked")
        assert httpx.get(api, headers={"Authorization": f"Bearer {key}"}).status_code == 401
        page.screenshot(path=shots / "07-key-revoked.png", full_page=True)

        press(page, 'a[href="/console/policies"]')
        page.wait_for_url("**/console/policies")
        assert "Version in force" in page.inner_text("main")
        page.screenshot(path=shots / "08-policies.png", full_page=True)
        sign_out(page)


def test_an_officer_reads_usage_and_cost(server: Server, browser: object, shots: Path) -> None:
    with page_of(browser, server) as page:
        sign_in(page, server.key("auditor"))
        press(page, 'a[href="/console/usage"]')
        page.wait_for_url("**/console/usage")
        assert page.locator("figure.chart svg").count() >= 1  # drawn by the server, no script
        cells = [c.split("\t") for c in page.inner_text("table.usage tbody").splitlines()]
        echo = [row for row in cells if "echo" in row]
        assert echo and sum(int(row[3]) for row in echo) >= 3  # the fixture's three chats
        page.screenshot(path=shots / "10-usage.png", full_page=True)

        press(page, 'a[href="/console/tco"]')
        page.wait_for_url("**/console/tco")
        row = page.inner_text("table.tco tbody tr").replace(",", "")
        # V = (2182 + 650) / 0.00000437 = 648,054,920 tokens a month, whatever was measured
        assert "echo" in row and "2832" in row and "648054920" in row
        page.screenshot(path=shots / "11-tco.png", full_page=True)
        sign_out(page)


def test_a_tampered_row_is_the_first_bad_seq(server: Server, browser: object, shots: Path) -> None:
    # the attacker of the design: it can write the database (and drop its triggers)
    with contextlib.closing(sqlite3.connect(server.data_dir / "airgate.db", timeout=30)) as db:
        for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'"):
            db.execute(f"DROP TRIGGER {name}")
        db.execute("UPDATE audit_events SET body = body || ' ' WHERE seq = 2")
        db.commit()
    with page_of(browser, server) as page:
        sign_in(page, server.key("auditor"))
        result = verify(page)
        assert "NOT intact" in result
        assert page.inner_text(".first-bad") == "2"
        assert "edited" in page.inner_text("section.report")
        page.screenshot(path=shots / "09-tampered.png", full_page=True)
