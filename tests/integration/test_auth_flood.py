"""Anonymous flooding over real HTTP (uvicorn in a thread, echo engine, the SQLite audit log):
failed authentications are limited per client address before any credential is looked up,
and audited as a handful of aggregated events whose counts add up to every refusal.

Before this, each of the red team's 11,575 bad requests was looked up and written as its own
durable `auth.failure` row.

The server listens on 127.0.0.1; the flood comes from 127.0.0.1 and a bystander connects from
127.0.0.2 (the whole 127/8 is loopback on Linux), so two client addresses are real.  The audit
log is read back with plain `sqlite3`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from live_server import serve_in_thread

from backends.echo import EchoEngine
from gateway.access.auth import generate_api_key
from gateway.access.keys import key_store
from gateway.access.stack import Security
from gateway.app import create_app
from gateway.config import Settings, load_settings
from gateway.engines.registry import ModelRegistry, ServedModel

MODEL = "echo"
BURST = 50
RATE_PER_S = 0.01  # one more attempt per 100 s: the flood's 401s are the burst, give or take
FLOOD = 2_000
BYSTANDER = "127.0.0.2"
DEADLINE_S = 60.0
CHAT = "/v1/chat/completions"


@dataclass
class Gateway:
    base: str
    security: Security
    db: Path
    keys: dict[str, str]
    lookups: list[int]  # how many credentials the key store was asked about

    def client(self, local_address: str = "127.0.0.1") -> httpx.Client:
        transport = httpx.HTTPTransport(local_address=local_address)
        return httpx.Client(base_url=self.base, transport=transport, timeout=DEADLINE_S)

    def failures(self) -> list[dict[str, Any]]:
        """Every `auth.failure` event in the audit log, in order."""
        with contextlib.closing(sqlite3.connect(self.db)) as conn:
            rows = conn.execute("SELECT body FROM audit_events ORDER BY seq").fetchall()
        events = [json.loads(row[0]) for row in rows]
        return [e for e in events if e["kind"] == "auth.failure"]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def chat(client: httpx.Client, key: str) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return client.post(CHAT, json=body, headers=bearer(key))


def settings_for(data_dir: Path, **overrides: Any) -> Settings:
    return load_settings(None, environ={}, overrides={"data_dir": str(data_dir), **overrides})


@contextlib.contextmanager
def running(data_dir: Path, roles: tuple[str, ...], **overrides: Any) -> Iterator[Gateway]:
    """A gateway on a fresh data dir with one app key per name in `roles`; on exit the server
    has shut down (its lifespan flushed the audit totals)."""
    settings = settings_for(data_dir, **overrides)

    async def make_keys() -> dict[str, str]:
        async with key_store(settings) as store:
            return {name: (await store.create("app", name=name))[0] for name in roles}

    keys = asyncio.run(make_keys())
    app = create_app(settings, registry=ModelRegistry([ServedModel(MODEL, EchoEngine())]))
    with serve_in_thread(app) as base:
        security: Security = app.state["security_holder"].get()
        lookups = [0]
        authenticate = security.keys.authenticate

        async def counted(text: str, now: Any = None) -> Any:
            lookups[0] += 1
            return await authenticate(text, now)

        security.keys.authenticate = counted  # type: ignore[method-assign]
        yield Gateway(base, security, data_dir / "airgate.db", keys, lookups)


def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Poll `condition` (each poll reads the database) until it holds; fail at the deadline."""
    end = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not true within {DEADLINE_S}s")


def assert_429(resp: httpx.Response) -> None:
    assert resp.status_code == 429, resp.text
    assert int(resp.headers["retry-after"]) >= 1
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "rate_limit_exceeded"


def test_a_flood_is_refused_before_lookup_and_audited_in_a_handful_of_rows(
    tmp_path: Path,
) -> None:
    bad = generate_api_key()  # well-formed, never stored: each attempt would cost a lookup
    overrides = {
        "auth.failure_burst": BURST,
        "auth.failure_rate_per_s": RATE_PER_S,
        "auth.failure_audit_window_s": 3600,  # one window: the totals come at shutdown
    }
    with running(tmp_path / "data", ("known", "new", "bystander"), **overrides) as gw:
        with gw.client() as client:
            assert chat(client, gw.keys["known"]).status_code == 200  # seen to work here
            looked_up = gw.lookups[0]
            started = time.monotonic()
            statuses = []
            for _ in range(FLOOD):
                resp = client.get("/v1/models", headers=bearer(bad))
                statuses.append(resp.status_code)
                if resp.status_code == 429:
                    assert_429(resp)
                else:
                    assert resp.status_code == 401, resp.text
            elapsed = time.monotonic() - started
            refused_401 = statuses.count(401)
            assert statuses[:BURST] == [401] * BURST
            assert BURST <= refused_401 <= BURST + 1 + int(elapsed * RATE_PER_S), refused_401
            assert statuses.count(429) == FLOOD - refused_401
            # a 429 never reached the key store
            assert gw.lookups[0] - looked_up == refused_401

            # while the address is limited: a key that has worked from here still works ...
            assert chat(client, gw.keys["known"]).status_code == 200
            # ... a valid key never seen yet waits, like the flood (it cannot be told apart
            # from it without the lookup the limit exists to avoid)
            assert_429(chat(client, gw.keys["new"]))
        with gw.client(BYSTANDER) as other:  # another address is not limited at all
            assert chat(other, gw.keys["bystander"]).status_code == 200
            assert other.get("/v1/models", headers=bearer(bad)).status_code == 401
            assert chat(other, gw.keys["bystander"]).status_code == 200
        during = gw.failures()
    after = gw.failures()

    flooded = [e for e in after if e.get("client_address") == "127.0.0.1"]
    by_reason: dict[str, list[dict[str, Any]]] = {}
    for event in flooded:
        by_reason.setdefault(event["error_class"], []).append(event)
    assert set(by_reason) == {"unknown_key", "rate_limited_unauthenticated"}
    assert sum(e["count"] for e in flooded) == FLOOD + 1  # the flood, and the new key's 429
    assert sum(e["count"] for e in by_reason["unknown_key"]) == refused_401
    for reason, status in (("unknown_key", 401), ("rate_limited_unauthenticated", 429)):
        first, total = by_reason[reason]  # the first at once, the rest in one total
        assert (first["count"], first["http_status"], first["route"]) == (1, status, "/v1/models")
        assert first["request_id"] and first["outcome"] == "denied"
        assert total["count"] > 1 and "request_id" not in total
        assert first in during and total not in during  # the total came with the shutdown
    bystander = [e for e in after if e.get("client_address") == BYSTANDER]
    assert [(e["error_class"], e["count"]) for e in bystander] == [("unknown_key", 1)]
    assert len(after) == 5
    print(
        f"{FLOOD} bad requests: {refused_401} x 401, {FLOOD - refused_401} x 429 in "
        f"{elapsed:.2f} s; {len(flooded)} audit rows for them"
    )


def test_a_window_total_is_written_when_the_window_closes(tmp_path: Path) -> None:
    """The flush task writes a window's total while the server runs (not only at shutdown),
    and failures beyond the first of a window add no rows of their own."""
    overrides = {"auth.failure_burst": 0, "auth.failure_audit_window_s": 0.2}
    failures = 40
    with running(tmp_path / "data", (), **overrides) as gw, gw.client() as client:
        for _ in range(failures):
            assert client.get("/v1/models").status_code == 401  # no credential at all
        wait_for(
            lambda: sum(e["count"] for e in gw.failures()) == failures,
            f"the counts of the auth.failure events add up to {failures}",
        )
        events = gw.failures()
        assert len(events) < failures
        assert {e["error_class"] for e in events} == {"missing_credentials"}
        assert {e["client_address"] for e in events} == {"127.0.0.1"}


def test_without_a_limit_or_a_window_every_failure_is_its_own_event(tmp_path: Path) -> None:
    """`failure_burst = 0` and `failure_audit_window_s = 0`: the old behaviour, for a site
    that wants one event per failed request (and takes the cost)."""
    overrides = {"auth.failure_burst": 0, "auth.failure_audit_window_s": 0}
    with running(tmp_path / "data", (), **overrides) as gw, gw.client() as client:
        ids = [client.get("/v1/models").headers["x-request-id"] for _ in range(BURST + 10)]
        events = gw.failures()
    assert [e["request_id"] for e in events] == ids
    assert {e["count"] for e in events} == {1}
