"""What `airgate serve` prints (echo engine, a fresh data dir each): on a terminal (a pty), short
text lines — the readiness line, the listen address, one line per request — and no JSON; with
stderr a pipe (a service, a pod log), one JSON object per line; on a terminal with
`[server] log_format = "json"`, JSON again.  `serving` (from the first-admin-key tests) drives
the pty or the pipe.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_process import Server
from test_first_admin_key import CONFIG, serving

from gateway.access.auth import SCANNER_PATTERN

pytestmark = pytest.mark.e2e

JSON_CONFIG = CONFIG + '\n[server]\nlog_format = "json"\n'
CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
STAMP = r"\d\d:\d\d:\d\d"


def lines(server: Server) -> list[str]:
    return [line.rstrip("\r") for line in server.log_text().splitlines() if line.strip()]


def admin_key(server: Server) -> str:
    """The first admin key, as the terminal shows it (a pty), or as the file holds it."""
    server.wait_until(
        lambda: (
            bool(re.findall(SCANNER_PATTERN, server.log_text()))
            or (server.data_dir / "initial-admin-key").exists()
        ),
        "the first admin key handed over",
    )
    shown = re.findall(SCANNER_PATTERN, server.log_text())
    if shown:
        return str(shown[0])
    return (server.data_dir / "initial-admin-key").read_text().strip()


def one_chat(server: Server, *, terminal: bool = True) -> str:
    """POST one chat completion; its request id (on a terminal, once its log line is out; a
    pipe's output reaches the log file when the server has stopped)."""
    headers = {"Authorization": f"Bearer {admin_key(server)}"}
    resp = httpx.post(f"{server.base_url}/v1/chat/completions", json=CHAT, headers=headers)
    assert resp.status_code == 200, resp.text
    request_id = resp.headers["x-request-id"]
    if terminal:
        server.wait_until(lambda: request_id in server.log_text(), "the request's log line")
    return request_id


def json_records(server: Server) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines(server) if line.startswith("{")]


def test_on_a_terminal_the_log_is_short_text_lines(tmp_path: Path) -> None:
    with serving(tmp_path, CONFIG, terminal=True) as server:
        request_id = one_chat(server)
        text = lines(server)
    assert not [line for line in text if line.startswith("{")], text  # no JSON at all
    assert any(re.fullmatch(rf"{STAMP} ready: serving echo", line) for line in text), text
    listening = rf"{STAMP} Uvicorn running on http://127\.0\.0\.1:{server.port} .*"
    assert any(re.fullmatch(listening, line) for line in text), text
    assert any(
        re.fullmatch(rf"{STAMP} WARNING model echo is served by the echo engine.*", line)
        for line in text
    ), text
    (request,) = [line for line in text if line.endswith(f"req {request_id}")]
    assert re.fullmatch(
        rf"{STAMP} POST /v1/chat/completions 200 echo \d+ ms \d+\+4 tokens \S+ \(length\) "
        rf"req {request_id}",
        request,
    ), request
    assert "hi" not in request.split()  # never content


def test_with_stderr_a_pipe_the_log_is_json(tmp_path: Path) -> None:
    with serving(tmp_path, CONFIG, terminal=False) as server:
        request_id = one_chat(server, terminal=False)
    records = json_records(server)
    assert any(r["msg"] == "ready: serving echo" for r in records)
    (request,) = [r for r in records if r.get("request_id") == request_id]
    assert request["logger"] == "airgate.request" and request["completion_tokens"] == 4
    assert not [line for line in lines(server) if re.match(rf"{STAMP} ", line)]


def test_log_format_json_on_a_terminal_is_json(tmp_path: Path) -> None:
    with serving(tmp_path, JSON_CONFIG, terminal=True) as server:
        request_id = one_chat(server)
        records = json_records(server)
        text = lines(server)
    assert any(r["msg"] == "ready: serving echo" for r in records)
    assert [r["path"] for r in records if r.get("request_id") == request_id] == [
        "/v1/chat/completions"
    ]
    assert not [line for line in text if re.match(rf"{STAMP} (ready|POST) ", line)], text
