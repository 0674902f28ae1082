"""Witnesses outside the database: a syslog collector on loopback (UDP, TCP with RFC 6587
octet counting, a unix datagram socket) receives each published checkpoint as one line that
reads back as the signed checkpoint; a witness directory that does not exist is an error, never
an empty witness; what a writer publishes is only checkpoints, never event content.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bundles.kms.signer import LocalSigner
from gateway.audit import AuditEvent, AuditWriter, new_event_id
from gateway.audit.checkpoint import check_signature, trusted_by_id
from gateway.audit.witness import (
    DirectoryWitness,
    SyslogWitness,
    WitnessError,
    read_witness_path,
)
from gateway.db import create_db_engine
from gateway.db.migrate import upgrade

SIGNER = LocalSigner(Ed25519PrivateKey.generate())
CANARY = "witness-canary-model"


class Collector:
    """A syslog collector on loopback: every datagram or framed TCP message it receives."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.messages: list[bytes] = []
        self.got = threading.Condition()
        if kind == "udp":
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.sock.bind(("127.0.0.1", 0))
            self.address = f"udp://127.0.0.1:{self.sock.getsockname()[1]}"
        elif kind == "tcp":
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.sock.bind(("127.0.0.1", 0))
            self.sock.listen()
            self.address = f"tcp://127.0.0.1:{self.sock.getsockname()[1]}"
        else:
            path = str(tmp_path / "log.sock")
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self.sock.bind(path)
            self.address = path
        self.kind = kind
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                if self.kind == "tcp":
                    conn, _ = self.sock.accept()
                    with conn:
                        data = b""
                        while chunk := conn.recv(65536):
                            data += chunk
                    length, _, frame = data.partition(b" ")
                    assert int(length) == len(frame)
                else:
                    frame = self.sock.recv(65536)
            except OSError:
                return
            with self.got:
                self.messages.append(frame)
                self.got.notify_all()

    def wait_for(self, count: int) -> list[bytes]:
        with self.got:
            assert self.got.wait_for(lambda: len(self.messages) >= count, timeout=30)
            return list(self.messages)


@pytest.fixture(params=["udp", "tcp", "unix"])
def collector(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Collector]:
    found = Collector(request.param, tmp_path)
    yield found
    found.sock.close()


async def test_a_syslog_collector_keeps_each_published_checkpoint(
    collector: Collector, tmp_path: Path
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'audit.db'}"
    await upgrade(url)
    engine = create_db_engine(url)
    witness = SyslogWitness(collector.address)
    try:
        async with AuditWriter(engine, signer=SIGNER, log_id="feed", witnesses=[witness]) as w:
            event = AuditEvent(
                event_id=new_event_id(),
                ts=datetime.now(UTC),
                kind="inference.completed",
                outcome="success",
                model=CANARY,
            )
            await w.append(event)
        assert witness.checkpoints("feed") is None  # write-only
    finally:
        await engine.dispose()
    messages = collector.wait_for(2)  # at least the open and the close checkpoints
    assert all(m.startswith(b"<110>1 ") and b" airgate-audit-checkpoint {" in m for m in messages)
    assert not any(CANARY.encode() in m for m in messages)
    lines = tmp_path / "collected.log"
    lines.write_bytes(b"\n".join(messages) + b"\n")
    kept = read_witness_path(lines, "feed")
    last = max(kept, key=lambda cp: cp.id)
    assert {"open", "close"} <= {cp.kind for cp in kept}
    assert (last.kind, last.size) == ("close", 1)
    trusted = trusted_by_id([SIGNER.verify_key])
    assert all(check_signature(cp, trusted) == "ok" for cp in kept)


def test_a_missing_witness_directory_is_an_error_not_an_empty_witness(tmp_path: Path) -> None:
    with pytest.raises(WitnessError, match="not an existing directory"):
        DirectoryWitness(tmp_path / "unmounted").checkpoints("feed")


def test_syslog_addresses_are_checked() -> None:
    for bad in ("syslog.example:514", "udp://host-without-port", "http://127.0.0.1:514"):
        with pytest.raises(ValueError, match="syslog witness address"):
            SyslogWitness(bad)
