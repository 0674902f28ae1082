"""A server killed with SIGKILL in the middle of streaming keeps an intact audit log.

Six clients loop streamed chat requests against a real `airgate serve`; once some responses have
arrived whole (`data: [DONE]`) and others are still streaming, the server gets SIGKILL.  A new
server must then start on the same data dir (SQLite recovers its WAL) and serve and audit a
request, and after it stops the audit log must verify (hash chain and signed checkpoints, with
the data dir's checkpoint key from `keys/audit-signing.key.pub`), and every request whose client
received the whole stream must have its `inference.completed` event: the gateway makes that
event durable before it sends the final bytes.  Requests cut off by the kill may lack it.

When the `airgate audit verify` command exists, it must pass on the data dir too.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from server_process import (
    MODEL,
    NO_END,
    Server,
    auth,
    seed_data_dir,
    start_server,
    stop_and_check,
)

from bundles.signing import parse_public_key
from gateway.audit import VerifyReport, search, verify
from gateway.db import create_db_engine, database_url

pytestmark = pytest.mark.e2e

CLIENTS = 6
WHOLE_BEFORE_KILL = 6  # responses that arrived whole before the kill (at least)
LOAD_DEADLINE_S = 180.0
BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Tell me about the tides."}],
    "max_tokens": 16,
    "temperature": 0,
    "logit_bias": NO_END,
    "stream": True,
}


@dataclass(frozen=True)
class Outcome:
    request_id: str | None  # the x-request-id header, when the response began
    status: int | None
    whole: bool  # the client read `data: [DONE]`


class Load:
    """Clients looping streamed requests; what each request got, and how many stream now."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.headers = auth(server.data_dir, "app")
        self.changed = threading.Condition()
        self.outcomes: list[Outcome] = []
        self.streaming = 0  # responses begun (200, headers read) and not yet ended
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._client) for _ in range(CLIENTS)]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()

    def _client(self) -> None:
        with httpx.Client(base_url=self.server.base_url, timeout=120) as http:
            while not self.stop.is_set():
                self._one(http)

    def _one(self, http: httpx.Client) -> None:
        request_id: str | None = None
        status: int | None = None
        whole = begun = False
        try:
            with http.stream("POST", "/v1/chat/completions", json=BODY, headers=self.headers) as r:
                request_id, status = r.headers.get("x-request-id"), r.status_code
                if status == 200:
                    with self.changed:
                        self.streaming += 1
                        begun = True
                    for line in r.iter_lines():
                        whole = whole or line == "data: [DONE]"
                else:
                    r.read()
        except httpx.TransportError:
            pass  # the server was killed under this request
        finally:
            with self.changed:
                if begun:
                    self.streaming -= 1
                self.outcomes.append(Outcome(request_id, status, whole))
                self.changed.notify_all()

    def kill_when_streaming(self, process: subprocess.Popen[bytes]) -> bool:
        """SIGKILL the server if enough responses arrived whole and one streams right now
        (checked and done under the lock, so no stream can end in between)."""
        with self.changed:
            if sum(o.whole for o in self.outcomes) < WHOLE_BEFORE_KILL or self.streaming < 1:
                return False
            self.stop.set()  # each client ends with the request it has in flight
            process.send_signal(signal.SIGKILL)
            return True


async def audit_state(data_dir: Path) -> tuple[VerifyReport, set[str]]:
    """The verification report of the data dir's audit log, and the request ids that have an
    `inference.completed` event."""
    public = parse_public_key((data_dir / "keys" / "audit-signing.key.pub").read_text().strip())
    engine = create_db_engine(database_url(data_dir, ""))
    try:
        report = await verify(engine, [public])
        completed: set[str] = set()
        cursor = None
        while True:
            records, cursor = await search(
                engine, kind="inference.completed", cursor=cursor, limit=1000
            )
            completed.update(r.event.request_id for r in records if r.event.request_id)
            if cursor is None:
                return report, completed
    finally:
        await engine.dispose()


@dataclass
class Crash:
    data_dir: Path
    outcomes: list[Outcome]
    exit_code: int | None
    after_restart: str  # the request id of a request served by the restarted server


@pytest.fixture(scope="module")
def crash(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Crash]:
    """Streaming load, SIGKILL mid-stream, a restart that serves one request, a clean stop."""
    root = tmp_path_factory.mktemp("crash-audit")
    data_dir = seed_data_dir(root / "data", model_dir)
    server = start_server(data_dir, root / "server.log")
    try:
        with Load(server) as load:
            server.wait_until(
                lambda: load.kill_when_streaming(server.process),
                f"{WHOLE_BEFORE_KILL} whole responses, one streaming",
                LOAD_DEADLINE_S,
            )
            exit_code = server.process.wait()
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()
    restarted = start_server(data_dir, root / "restarted.log")
    try:
        resp = httpx.post(
            f"{restarted.base_url}/v1/chat/completions",
            json={**BODY, "stream": False},
            headers=auth(data_dir, "app"),
            timeout=120,
        )
        assert resp.status_code == 200, resp.text
    finally:
        stop_and_check(restarted)
    yield Crash(data_dir, load.outcomes, exit_code, resp.headers["x-request-id"])


def test_the_server_was_killed_mid_stream(crash: Crash) -> None:
    assert crash.exit_code == -signal.SIGKILL
    whole = [o for o in crash.outcomes if o.whole]
    assert len(whole) >= WHOLE_BEFORE_KILL
    assert any(o.status == 200 and not o.whole for o in crash.outcomes), "no stream was cut off"


def test_the_audit_log_verifies_after_the_crash(crash: Crash) -> None:
    report, _ = asyncio.run(audit_state(crash.data_dir))
    assert report.ok, report
    assert report.problems == [] and report.gaps == []
    assert report.chain_only_rows == 0  # the clean stop signed a checkpoint over every row
    begun = [o for o in crash.outcomes if o.status == 200]
    assert report.rows > len(begun)  # an admission for each, a completion for most
    # the CLI, once it exists (until then the offline verification above stands for it)
    command = [sys.executable, "-m", "gateway", "audit", "verify"]
    if subprocess.run([*command, "--help"], capture_output=True).returncode == 0:
        done = subprocess.run(
            [*command, "--data-dir", str(crash.data_dir)], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_every_whole_response_has_its_completed_event(crash: Crash) -> None:
    _, completed = asyncio.run(audit_state(crash.data_dir))
    whole = {o.request_id for o in crash.outcomes if o.whole}
    assert None not in whole
    assert whole - completed == set(), "whole responses without an inference.completed event"
    assert crash.after_restart in completed
