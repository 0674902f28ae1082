"""A server killed with SIGKILL in the middle of streaming keeps an intact audit log.

Six clients loop streamed chat requests against a real `airgate serve`; once some responses have
arrived whole (`data: [DONE]`) and others are still streaming, the server gets SIGKILL.  The log
it leaves must verify as it is, with the data dir's signing key pinned (rows commit together
with their signed checkpoint, so none is left unsigned).  A new server must then start on the
same data dir (SQLite recovers its WAL), give every admission the kill left without an end its
`inference.interrupted` event before serving anything, and serve and audit a request; after it
stops the log must verify again (hash chain, every tree head and signature; also through
`airgate audit verify`, which trusts only the key it is given), and every request whose client
received the whole stream must have its `inference.completed` event: the gateway makes that
event durable before it sends the final bytes.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
from collections import Counter
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
from sqlalchemy import select

from bundles.kms.signer import LocalSigner, parse_verify_key
from gateway.audit import AuditRecord, VerifyReport, search, verify
from gateway.audit.schema import audit_checkpoints
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


TERMINAL = frozenset(
    {"inference.completed", "inference.failed", "inference.cancelled", "inference.interrupted"}
)


def pinned_key(data_dir: Path) -> str:
    """The public half of the data dir's signing key, as an operator pins it in `[audit]
    trusted_keys` (what verification trusts; never the key file itself)."""
    return LocalSigner.from_file(data_dir / "keys" / "audit-signing.key").verify_key.text


@dataclass(frozen=True)
class AuditState:
    """The data dir's audit log at one moment: its verification and every record."""

    report: VerifyReport
    records: list[AuditRecord]
    last_checkpoint: str  # the kind of the last checkpoint

    def of_kind(self, *kinds: str) -> list[AuditRecord]:
        return [r for r in self.records if r.event.kind in kinds]

    def terminals(self) -> Counter[str | None]:
        """How many terminal events each request id has."""
        return Counter(r.event.request_id for r in self.of_kind(*TERMINAL))

    def orphans(self) -> set[str]:
        """Request ids admitted without a terminal event."""
        ends = self.terminals()
        admitted = self.of_kind("inference.admitted")
        return {
            r.event.request_id
            for r in admitted
            if r.event.request_id and not ends[r.event.request_id]
        }


async def _audit_state(data_dir: Path) -> AuditState:
    key = parse_verify_key(pinned_key(data_dir))
    engine = create_db_engine(database_url(data_dir, ""))
    try:
        report = await verify(engine, [key])
        records: list[AuditRecord] = []
        cursor = None
        while True:
            page, cursor = await search(engine, cursor=cursor, limit=1000)
            records.extend(page)
            if cursor is None:
                break
        async with engine.connect() as conn:
            query = select(audit_checkpoints.c.kind).order_by(audit_checkpoints.c.id.desc())
            last = (await conn.execute(query.limit(1))).scalar_one()
    finally:
        await engine.dispose()
    return AuditState(report, records, str(last))


def audit_state(data_dir: Path) -> AuditState:
    return asyncio.run(_audit_state(data_dir))


@dataclass
class Crash:
    data_dir: Path
    outcomes: list[Outcome]
    exit_code: int | None
    after_kill: AuditState  # read before the restart
    after_restart: AuditState  # read after the restarted server stopped
    served: str  # the request id of a request served by the restarted server


@pytest.fixture(scope="module")
def crash(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Crash]:
    """Streaming load, SIGKILL mid-stream, the log read, a restart that serves one request,
    a clean stop, the log read again."""
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
    after_kill = audit_state(data_dir)
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
    yield Crash(
        data_dir,
        load.outcomes,
        exit_code,
        after_kill,
        audit_state(data_dir),
        resp.headers["x-request-id"],
    )


def test_the_server_was_killed_mid_stream(crash: Crash) -> None:
    assert crash.exit_code == -signal.SIGKILL
    whole = [o for o in crash.outcomes if o.whole]
    assert len(whole) >= WHOLE_BEFORE_KILL
    assert any(o.status == 200 and not o.whole for o in crash.outcomes), "no stream was cut off"


def test_the_killed_servers_log_verifies_as_it_was_left(crash: Crash) -> None:
    """Rows commit with their signed checkpoint, so a SIGKILL leaves no row unsigned: the log
    verifies with the pinned key before any restart, though no close checkpoint was signed."""
    state = crash.after_kill
    assert state.report.ok, state.report
    assert state.report.tree_checked and state.report.chain_only_rows == 0
    assert state.last_checkpoint == "batch"  # killed: no close
    assert state.orphans(), "the kill left no admission without its end"


def test_the_audit_log_verifies_after_the_restart(crash: Crash) -> None:
    state = crash.after_restart
    report = state.report
    assert report.ok, report
    assert report.problems == [] and report.gaps == []
    assert report.chain_only_rows == 0
    assert report.trusted_keys == [parse_verify_key(pinned_key(crash.data_dir)).key_id]
    assert state.last_checkpoint == "close"  # the clean stop
    begun = [o for o in crash.outcomes if o.status == 200]
    assert report.rows > len(begun)  # an admission for each, a completion for most
    # the CLI trusts the key it is given, and nothing it finds in the data dir
    command = [
        sys.executable,
        "-m",
        "gateway",
        "audit",
        "verify",
        "--data-dir",
        str(crash.data_dir),
    ]
    pinned = subprocess.run(
        [*command, "--trusted-key", pinned_key(crash.data_dir)], capture_output=True, text=True
    )
    assert pinned.returncode == 0, pinned.stdout + pinned.stderr
    assert [c["rows"] for c in json.loads(pinned.stdout)["chains"]] == [report.rows]
    unpinned = subprocess.run(command, capture_output=True, text=True)
    assert unpinned.returncode == 2, unpinned.stdout + unpinned.stderr


def test_every_whole_response_has_its_completed_event(crash: Crash) -> None:
    completed = {r.event.request_id for r in crash.after_restart.of_kind("inference.completed")}
    whole = {o.request_id for o in crash.outcomes if o.whole}
    assert None not in whole
    assert whole - completed == set(), "whole responses without an inference.completed event"
    assert crash.served in completed


def test_every_admission_the_kill_left_open_is_interrupted_at_restart(crash: Crash) -> None:
    before, after = crash.after_kill, crash.after_restart
    lost = before.orphans()
    interrupted = after.of_kind("inference.interrupted")
    assert sorted(r.event.request_id or "" for r in interrupted) == sorted(lost)
    assert not before.of_kind("inference.interrupted")
    # appended at the restart, before it served anything: right after the killed run's rows
    last_before = before.records[-1].seq
    assert [r.seq for r in interrupted] == list(range(last_before + 1, last_before + 1 + len(lost)))
    admitted = {r.event.request_id: r.event for r in before.of_kind("inference.admitted")}
    for record in interrupted:
        event, started = record.event, admitted[record.event.request_id]
        assert (event.outcome, event.error_class) == ("failure", "process_ended")
        assert (event.principal, event.action, event.model, event.deployment, event.route) == (
            started.principal,
            started.action,
            started.model,
            started.deployment,
            started.route,
        )
    # now every admission has exactly one end, the cut-off streams' included
    assert after.orphans() == set()
    ends = after.terminals()
    assert all(ends[r.event.request_id] == 1 for r in after.of_kind("inference.admitted"))
    cut = {o.request_id for o in crash.outcomes if o.status == 200 and not o.whole}
    assert cut and all(ends[request_id] == 1 for request_id in cut)
