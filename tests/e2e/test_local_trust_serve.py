"""`[auth] local_trust` in a real `airgate serve` (echo engine, one for the module): the official
`ollama` client with its defaults — no key, no headers — lists and chats as `ollama` users
expect; the audit log and the request log name the OS user's local key id; another OS user
(`nobody`) on the same machine gets 401 without a key; and a server that would listen beyond
loopback with local trust is refused at start.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ollama
import pytest
from server_process import (
    Server,
    add_test_keys,
    free_port,
    run_cli,
    serve_command,
    start_server,
    stop_and_check,
)

pytestmark = pytest.mark.e2e

CONFIG = """
[auth]
local_trust = true

[[models]]
id = "echo"
engine = "echo"
"""
NOBODY = 65534


def local_key_id() -> str:
    return f"local:{pwd.getpwuid(os.geteuid()).pw_name}"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("local-trust-serve")
    (root / "airgate.toml").write_text(CONFIG)
    add_test_keys(root / "data", ("app",))
    srv = start_server(
        root / "data", root / "server.log", {"AIRGATE_CONFIG": str(root / "airgate.toml")}
    )
    yield srv
    stop_and_check(srv)


@pytest.fixture
def client(server: Server, monkeypatch: pytest.MonkeyPatch) -> ollama.Client:
    monkeypatch.delenv("OLLAMA_API_KEY", raising=False)  # the client would send it as a bearer
    return ollama.Client(host=server.base_url)


def audit_events(data_dir: Path) -> list[dict[str, Any]]:
    db = data_dir / "airgate.db"
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        rows = conn.execute("SELECT body FROM audit_events ORDER BY seq").fetchall()
    return [json.loads(row[0]) for row in rows]


def test_the_ollama_client_without_a_key_lists_and_chats(
    server: Server, client: ollama.Client
) -> None:
    assert "echo" in [m.model for m in client.list().models]
    reply = client.chat(
        model="echo", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 4}
    )
    assert reply.message.content == " tok0 tok1 tok2 tok3"
    streamed = client.chat(
        model="echo",
        messages=[{"role": "user", "content": "hi"}],
        options={"num_predict": 3},
        stream=True,
    )
    assert "".join(part.message.content or "" for part in streamed) == " tok0 tok1 tok2"

    completed = [e for e in audit_events(server.data_dir) if e["kind"] == "inference.completed"]
    assert len(completed) >= 2
    for event in completed:
        assert event["principal"]["key_id"] == local_key_id()
        assert event["principal"]["method"] == "local"
        assert event["principal"]["team"] == "local"
    server.wait_until(
        lambda: any(
            r.get("path") == "/api/chat" and r.get("key_id") == local_key_id()
            for r in server.request_records()
        ),
        "the request log names the local key id",
    )


def test_a_wrong_key_is_still_refused(server: Server) -> None:
    wrong = ollama.Client(host=server.base_url, headers={"Authorization": "Bearer ag_nope"})
    with pytest.raises(ollama.ResponseError) as caught:
        wrong.list()
    assert caught.value.status_code == 401


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None or shutil.which("curl") is None,
    reason="needs root, setpriv and curl to connect as another user",
)
def test_another_os_user_needs_a_key(server: Server) -> None:
    def as_nobody(*headers: str) -> int:
        command = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "curl"]
        command += ["-s", "-o", "/dev/null", "-w", "%{http_code}"]
        for header in headers:
            command += ["-H", header]
        done = subprocess.run(
            [*command, f"{server.base_url}/api/tags"], capture_output=True, text=True, check=True
        )
        return int(done.stdout)

    assert as_nobody() == 401
    assert as_nobody(f"Authorization: Bearer {server.key('app')}") == 200
    failures = [e for e in audit_events(server.data_dir) if e["kind"] == "auth.failure"]
    assert "local_peer_untrusted" in [e["error_class"] for e in failures]


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_local_trust_beyond_loopback_is_refused_at_start(tmp_path: Path, host: str) -> None:
    (tmp_path / "airgate.toml").write_text(CONFIG)
    command = serve_command(
        free_port(), tmp_path / "data", "--config", str(tmp_path / "airgate.toml")
    )
    result = run_cli([*command, "--host", host])
    assert result.returncode == 2, result.stderr
    assert "[auth] local_trust needs a loopback [server] host" in result.stderr
    assert not (tmp_path / "data").exists()  # refused before anything was made
