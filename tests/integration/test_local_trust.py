"""`[auth] local_trust` over real HTTP (uvicorn in a thread on 127.0.0.1, echo engine, the
SQLite audit log): a keyless request over loopback from this OS user is its app; everything
else still needs a key.

    keyless, this user         200 as `local:<user>` (team local, role app), audited so
    a credential               checked as given: a wrong or malformed one is 401, never rescued
    role app only              /admin and /audit answer 403 to the local caller
    policy and limits          the rules for team `local` apply; its own rate budget
    not trusted -> 401         another uid's socket (run as `nobody`), a peer that is not on
                               loopback (X-Forwarded-For ignored), a peer socket the kernel
                               does not know, a browser's request, a rebinding Host
    off (the default)          keyless is 401 as before
    start-up                   a non-loopback host or mTLS with local trust is refused

A peer address that loopback TCP cannot produce (192.0.2.7) is put into the ASGI scope by a
wrapper in front of the app, as a server bound elsewhere would report it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pwd
import shutil
import socket
import sqlite3
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_server import serve_in_thread

from backends.echo import EchoEngine
from gateway.access.auth import LOCAL_TEAM, LocalPeerRefused, LocalTrust, generate_api_key
from gateway.access.auth.local_trust import socket_owner
from gateway.access.keys import key_store
from gateway.access.limits.gcra import default_request_burst
from gateway.app import create_app
from gateway.config import ConfigError, load_settings
from gateway.engines.registry import ModelRegistry, ServedModel

MODEL = "echo"
CHAT = "/v1/chat/completions"
LOCAL_MAX_TOKENS = 16
POLICY = f"""
name = "local-trust-tests"

[[rules]]
name = "laptop"
teams = ["{LOCAL_TEAM}"]
roles = ["app"]
models = ["{MODEL}"]
max_tokens = {LOCAL_MAX_TOKENS}
requests_per_minute = 60

[[rules]]
name = "everyone"
roles = ["app", "admin"]
models = ["*"]

[[rules]]
name = "auditors"
roles = ["auditor"]
deny_models = ["*"]
"""
RPM_BURST = default_request_burst(60)
NOBODY = 65534


def me() -> str:
    return f"local:{pwd.getpwuid(os.geteuid()).pw_name}"


class PeerOverride:
    """ASGI: the app, seeing `client` (when set) as the transport's peer address."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.client: tuple[str, int] | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self.client is not None:
            scope = {**scope, "client": self.client}
        await self.app(scope, receive, send)


@dataclass
class Gateway:
    base: str
    peer: PeerOverride
    db: Path
    keys: dict[str, str]

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=30, **kw)

    def events(self) -> list[dict[str, Any]]:
        with contextlib.closing(sqlite3.connect(self.db)) as conn:
            rows = conn.execute("SELECT body FROM audit_events ORDER BY seq").fetchall()
        return [json.loads(row[0]) for row in rows]

    def failure_reasons(self) -> list[str]:
        return [e["error_class"] for e in self.events() if e["kind"] == "auth.failure"]


@contextlib.contextmanager
def running(root: Path, **overrides: Any) -> Iterator[Gateway]:
    (root / "policy.toml").write_text(POLICY)
    settings = load_settings(
        None,
        environ={},
        overrides={
            "data_dir": str(root / "data"),
            "policy.path": str(root / "policy.toml"),
            "auth.failure_audit_window_s": 0,  # one audit event per failure
            **overrides,
        },
    )

    async def make_keys() -> dict[str, str]:
        async with key_store(settings) as store:
            return {r: (await store.create(r, name=f"test-{r}"))[0] for r in ("app", "admin")}

    keys = asyncio.run(make_keys())
    app = create_app(settings, registry=ModelRegistry([ServedModel(MODEL, EchoEngine())]))
    peer = PeerOverride(app)
    with serve_in_thread(peer) as base:
        yield Gateway(base, peer, root / "data" / "airgate.db", keys)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with running(tmp_path_factory.mktemp("local-trust"), **{"auth.local_trust": True}) as g:
        yield g


def chat(client: httpx.Client, max_tokens: int = 4, **kw: Any) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    return client.post(CHAT, json={**body, "max_tokens": max_tokens}, **kw)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def assert_401(resp: httpx.Response) -> None:
    assert resp.status_code == 401, resp.text
    assert resp.json()["error"]["code"] == "invalid_api_key"
    assert resp.headers["www-authenticate"] == "Bearer"


def test_a_keyless_request_from_this_user_is_its_local_app_and_audited_so(gw: Gateway) -> None:
    with gw.client() as client:
        models = client.get("/v1/models")
        assert models.status_code == 200, models.text
        assert MODEL in [m["id"] for m in models.json()["data"]]
        resp = chat(client)
        assert resp.status_code == 200, resp.text
    request_id = resp.headers["x-request-id"]
    done = [e for e in gw.events() if e.get("request_id") == request_id]
    assert {e["kind"] for e in done} == {"inference.admitted", "inference.completed"}
    for event in done:
        assert event["principal"] == {
            "key_id": me(),
            "team": LOCAL_TEAM,
            "subject": me().removeprefix("local:"),
            "method": "local",
        }


def test_a_credential_is_checked_as_given_and_never_rescued(gw: Gateway) -> None:
    unknown = generate_api_key()  # well formed, never stored
    before = len(gw.failure_reasons())
    with gw.client() as client:
        assert_401(chat(client, headers=bearer(unknown)))
        assert_401(chat(client, headers=bearer("ag_malformed")))
        assert_401(chat(client, headers={"Authorization": "Basic dXNlcjpwYXNz"}))
        assert_401(chat(client, headers={"Authorization": ""}))
        ok = chat(client, headers=bearer(gw.keys["app"]))
        assert ok.status_code == 200, ok.text
    assert gw.failure_reasons()[before:] == [
        "unknown_key",
        "malformed_key",
        "unsupported_scheme",
        "missing_credentials",  # an empty header is a credential given, not none
    ]
    (completed,) = [
        e
        for e in gw.events()
        if e.get("request_id") == ok.headers["x-request-id"] and e["kind"] == "inference.completed"
    ]
    assert completed["principal"]["method"] == "api_key"


def test_the_local_caller_is_an_app_only(gw: Gateway) -> None:
    with gw.client() as client:
        for path in ("/admin/keys", "/audit/events", "/audit/verify"):
            resp = client.get(path)
            assert resp.status_code == 403, (path, resp.text)
        created = client.post("/admin/keys", json={"role": "admin"})
        assert created.status_code == 403, created.text
        assert client.get("/admin/keys", headers=bearer(gw.keys["admin"])).status_code == 200


def test_the_policy_rules_for_team_local_apply(gw: Gateway) -> None:
    with gw.client() as client:
        over = chat(client, max_tokens=LOCAL_MAX_TOKENS + 1)
        assert over.status_code == 400, over.text
        assert over.json()["error"]["param"] == "max_tokens"
        # the same request with an app key (no team): the general rule, no such cap
        keyed = chat(client, max_tokens=LOCAL_MAX_TOKENS + 1, headers=bearer(gw.keys["app"]))
        assert keyed.status_code == 200, keyed.text
    (denied,) = [e for e in gw.events() if e.get("request_id") == over.headers["x-request-id"]]
    assert denied["kind"] == "policy.denied" and denied["decision"] == "max_tokens_exceeded"
    assert denied["principal"]["key_id"] == me()


def test_a_peer_that_is_not_on_loopback_needs_a_key(gw: Gateway) -> None:
    before = len(gw.failure_reasons())
    gw.peer.client = ("192.0.2.7", 40000)
    try:
        with gw.client() as client:
            assert_401(client.get("/v1/models"))
            assert_401(client.get("/v1/models", headers={"X-Forwarded-For": "127.0.0.1"}))
            assert client.get("/v1/models", headers=bearer(gw.keys["app"])).status_code == 200
    finally:
        gw.peer.client = None
    assert gw.failure_reasons()[before:] == ["missing_credentials"] * 2


def test_a_loopback_peer_the_kernel_does_not_know_needs_a_key(gw: Gateway) -> None:
    with socket.socket() as spare:  # a port nobody is connected from
        spare.bind(("127.0.0.1", 0))
        port = spare.getsockname()[1]
        gw.peer.client = ("127.0.0.1", port)
        try:
            with gw.client() as client:
                assert_401(client.get("/v1/models"))
        finally:
            gw.peer.client = None
    assert gw.failure_reasons()[-1] == "local_peer_unknown"


def test_a_request_from_a_web_page_needs_a_key(gw: Gateway) -> None:
    before = len(gw.failure_reasons())
    with gw.client() as client:
        assert_401(chat(client, headers={"Origin": "https://evil.example"}))
        assert_401(client.get("/v1/models", headers={"Sec-Fetch-Site": "cross-site"}))
        assert_401(client.get("/v1/models", headers={"Host": "rebound.evil.example:8000"}))
        for host in ("localhost:8000", "127.0.0.1", "[::1]:8000"):
            assert client.get("/v1/models", headers={"Host": host}).status_code == 200, host
    assert gw.failure_reasons()[before:] == [
        "local_browser_request",
        "local_browser_request",
        "local_host_not_loopback",
    ]


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None or shutil.which("curl") is None,
    reason="needs root, setpriv and curl to connect as another user",
)
def test_another_users_connection_needs_a_key(gw: Gateway) -> None:
    def curl_as_nobody(*headers: str) -> int:
        command = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        command += ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}"]
        for header in headers:
            command += ["-H", header]
        done = subprocess.run(
            [*command, f"{gw.base}/v1/models"], capture_output=True, text=True, check=True
        )
        return int(done.stdout)

    assert curl_as_nobody() == 401
    assert gw.failure_reasons()[-1] == "local_peer_untrusted"
    assert curl_as_nobody(f"Authorization: Bearer {gw.keys['app']}") == 200  # keys still work


@pytest.mark.parametrize("netlink", [True, False], ids=["sock_diag", "proc_tables"])
def test_the_socket_owner_comes_from_the_kernel(gw: Gateway, netlink: bool) -> None:
    port = int(gw.base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as conn:
        here, there = conn.getsockname()[:2], conn.getpeername()[:2]
        assert socket_owner(here, there, netlink=netlink) == os.geteuid()
        assert socket_owner(there, here, netlink=netlink) == os.geteuid()  # the server's end
        assert socket_owner(here, (there[0], there[1] + 1), netlink=netlink) is None
    # an IPv6 socket talking IPv4 (a v4-mapped address) is found too
    with socket.socket(socket.AF_INET6) as mapped:
        mapped.connect(("::ffff:127.0.0.1", port))
        own_port = mapped.getsockname()[1]
        assert socket_owner(("127.0.0.1", own_port), ("127.0.0.1", port), netlink=netlink) == (
            os.geteuid()
        )


def test_the_limits_are_the_local_callers_own(tmp_path: Path) -> None:
    with running(tmp_path, **{"auth.local_trust": True}) as g, g.client() as client:
        statuses = [chat(client).status_code for _ in range(RPM_BURST + 1)]
        assert statuses[:RPM_BURST] == [200] * RPM_BURST and statuses[-1] == 429, statuses
        # an app key has its own budget
        assert chat(client, headers=bearer(g.keys["app"])).status_code == 200
    (limited,) = [e for e in g.events() if e["kind"] == "rate.limited"]
    assert limited["principal"]["key_id"] == me()


def test_off_by_default_keyless_is_401(tmp_path: Path) -> None:
    with running(tmp_path) as g, g.client() as client:
        assert_401(client.get("/v1/models"))
    assert g.failure_reasons() == ["missing_credentials"]


def test_without_sock_diag_or_the_kernels_tables_every_loopback_peer_is_trusted_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="airgate.auth"):
        trust = LocalTrust.for_this_process(tables=(str(tmp_path / "no-tcp"),), netlink=False)
    assert trust.uid is None
    assert "can be read here" in caplog.text and "single-user" in caplog.text
    assert trust.authenticate(("127.0.0.1", 1), ("127.0.0.1", 8000)) == trust.principal
    assert trust.authenticate(("10.1.2.3", 1), ("127.0.0.1", 8000)) is None
    with pytest.raises(LocalPeerRefused):
        trust.authenticate(("::1", 1), ("::1", 8000), [(b"origin", b"null")])


@pytest.mark.parametrize(
    ("host", "mtls", "refused"),
    [
        ("0.0.0.0", False, "needs a loopback [server] host"),
        ("192.168.1.20", False, "needs a loopback [server] host"),
        ("::", False, "needs a loopback [server] host"),
        ("127.0.0.1", True, "exclude each other"),
        ("127.0.0.1", False, None),
        ("::1", False, None),
        ("localhost", False, None),
    ],
)
def test_start_up_refuses_local_trust_where_remote_callers_could_look_local(
    tmp_path: Path, host: str, mtls: bool, refused: str | None
) -> None:
    overrides: dict[str, Any] = {"auth.local_trust": True, "server.host": host}
    if mtls:
        overrides["auth.mtls"] = {"ca_file": "ca.pem", "cert_file": "c.pem", "key_file": "k.pem"}
    if refused is None:
        assert load_settings(None, environ={}, overrides=overrides).auth.local_trust
        return
    with pytest.raises(ConfigError, match=refused.replace("[", r"\[").replace("]", r"\]")):
        load_settings(None, environ={}, overrides=overrides)
