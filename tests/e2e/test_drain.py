"""SIGTERM drains a real `airgate serve` (echo engine): /ready fails at once, a new request gets
503 with `Retry-After` and `Connection: close`, a stream in flight runs to its end (or is cut
at `[server] drain_timeout_s`, audited as a client disconnect is), the audit writer signs its
`close` checkpoint, and the process exits 0.

The stream is held in flight without a clock: the client reads its first event and then nothing
until the checks are done, so the server waits on the socket (the stream is ~40 MB, far more
than the kernel buffers).  Every wait is for a condition under a generous deadline.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import sqlite3
import subprocess
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_process import Server, add_test_keys, airgate, start_server

from bundles import create_signing_key
from bundles.kms.signer import VerifyKey

pytestmark = pytest.mark.e2e

CONFIG = """
[server]
drain_timeout_s = {drain}

[policy]
path = "{policy}"

[audit]
trusted_keys = ["{pinned}"]

[[models]]
id = "echo"
engine = "echo"
context_length = 1048576
"""
# no caps: one stream of a million echo tokens
POLICY = """
name = "drain"

[[rules]]
name = "everyone"
roles = ["app", "admin"]
models = ["*"]
"""
LONG = 200_000  # tokens: ~40 MB of events, a few seconds once read
EXIT_MARGIN_S = 60.0  # beyond drain_timeout_s: the cut's last bytes, shutdown, slow machines


@contextlib.contextmanager
def serving(tmp_path: Path, drain_timeout_s: float) -> Iterator[Server]:
    """A ready server; killed if a failed test left it running."""
    data = tmp_path / "data"
    pinned = VerifyKey(create_signing_key(data / "keys" / "audit-signing.key")).text
    (tmp_path / "policy.toml").write_text(POLICY)
    config = tmp_path / "airgate.toml"
    config.write_text(
        CONFIG.format(drain=drain_timeout_s, policy=tmp_path / "policy.toml", pinned=pinned)
    )
    add_test_keys(data)
    server = start_server(data, tmp_path / "server.log", {"AIRGATE_CONFIG": str(config)})
    try:
        yield server
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()


@contextlib.contextmanager
def stream(server: Server, max_tokens: int) -> Iterator[tuple[httpx.Response, Iterator[str]]]:
    """A streamed chat completion, its first event already read."""
    with (
        httpx.Client(timeout=120) as client,
        client.stream(
            "POST",
            f"{server.base_url}/v1/chat/completions",
            headers=server.auth(),
            json={
                "model": "echo",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": max_tokens,
                "stream": True,
            },
        ) as response,
    ):
        assert response.status_code == 200
        events = (line for line in response.iter_lines() if line)
        assert next(events).startswith("data: {")
        yield response, events


def metric(server: Server, name: str) -> float:
    text = httpx.get(f"{server.base_url}/metrics", headers=server.auth(), timeout=30).text
    (value,) = re.findall(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(value)


def exit_code(server: Server, deadline_s: float) -> int:
    try:
        return server.process.wait(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        server.process.kill()
        raise AssertionError(f"not stopped within {deadline_s}s of SIGTERM") from None


def ended(server: Server, request_id: str) -> tuple[dict[str, Any], str]:
    """The audit event that ended the request, and the kind of the log's last checkpoint."""
    db = server.data_dir / "airgate.db"
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        events = [json.loads(r[0]) for r in conn.execute("SELECT body FROM audit_events")]
        (last,) = conn.execute("SELECT kind FROM audit_checkpoints ORDER BY id DESC LIMIT 1")
    (end,) = [
        e for e in events if e.get("request_id") == request_id and e["kind"] != "inference.admitted"
    ]
    return end, str(last[0])


def verified(server: Server) -> None:
    config = str(server.data_dir.parent / "airgate.toml")
    result = airgate("audit", "verify", "--data-dir", server.data_dir, "--config", config)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert json.loads(result.stdout)["ok"]


def test_sigterm_drains_a_stream_to_its_end_and_exits_0(tmp_path: Path) -> None:
    with serving(tmp_path, drain_timeout_s=120) as server:
        ready = httpx.get(f"{server.base_url}/ready", timeout=30).json()
        assert ready["version"] == version("airgate")
        info = httpx.get(f"{server.base_url}/metrics", headers=server.auth(), timeout=30).text
        assert f'airgate_policy_info{{version="{ready["policy_version"]}"}} 1.0' in info
        with stream(server, LONG) as (response, events):
            request_id = response.headers["x-request-id"]
            assert metric(server, "airgate_requests_in_flight") == 1.0
            server.process.send_signal(signal.SIGTERM)
            server.wait_until(lambda: server.ready_status() == 503, "GET /ready == 503")
            not_ready = httpx.get(f"{server.base_url}/ready", timeout=30)
            assert "draining" in not_ready.json()["error"]["message"]
            assert not_ready.headers["retry-after"] == "1"

            refused = httpx.get(f"{server.base_url}/v1/models", headers=server.auth(), timeout=30)
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "1"
            assert refused.headers["connection"] == "close"
            assert refused.json()["error"]["code"] == "service_unavailable"
            assert metric(server, "airgate_draining") == 1.0
            assert metric(server, "airgate_requests_in_flight") == 1.0

            server.process.send_signal(signal.SIGTERM)  # a second one: still draining
            rest = list(events)
        assert rest[-1] == "data: [DONE]"
        assert '"finish_reason":"length"' in rest[-2]
        assert len(rest) == LONG + 2  # a chunk per token, the finish chunk, [DONE]
        assert exit_code(server, 120 + EXIT_MARGIN_S) == 0

    log = server.log_text()
    assert "draining: 1 requests in flight, up to 120 s" in log
    assert "drained: 1 finished, 0 cut at the deadline, 1 new requests refused" in log
    assert "still draining" in log
    end, last_checkpoint = ended(server, request_id)
    assert end["kind"] == "inference.completed" and end["outcome"] == "success"
    assert last_checkpoint == "close"
    verified(server)


def test_a_stream_longer_than_the_drain_is_cut_and_the_process_exits_0(tmp_path: Path) -> None:
    with serving(tmp_path, drain_timeout_s=1) as server:
        with stream(server, 1_000_000) as (response, events):  # ~25 s of tokens
            request_id = response.headers["x-request-id"]
            server.process.send_signal(signal.SIGTERM)
            rest: list[str] = []
            with contextlib.suppress(httpx.RemoteProtocolError):  # or closed unfinished
                rest.extend(events)
        assert "data: [DONE]" not in rest
        if rest and '"error"' in rest[-1]:  # the client read on: it got the error event
            error = json.loads(rest[-1].removeprefix("data: "))["error"]
            assert error["code"] == "service_unavailable"
        assert exit_code(server, 1 + EXIT_MARGIN_S) == 0

    assert "drained: 0 finished, 1 cut at the deadline" in server.log_text()
    end, last_checkpoint = ended(server, request_id)
    assert end["kind"] == "inference.cancelled" and end["outcome"] == "cancelled"  # as a disconnect
    assert last_checkpoint == "close"
    verified(server)
