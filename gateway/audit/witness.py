"""Witnesses: copies of the signed checkpoints kept outside the database.

Whoever can write the database can truncate it, roll it back or replace it, and no signature
inside it can show that.  What shows it is a checkpoint kept elsewhere: once a witness holds
"log L, epoch E, size N, root R", any later log that is shorter, or whose first N rows hash to
another root, is caught (by `verify`, and at start).  As with CloudTrail's digest files, the
checkpoints are chained (`prev_hash`), so a witness holding a later one vouches for every
earlier one.

- `DirectoryWitness`: append-only JSONL files, one per log and UTC day, under a directory that
  should be another mount (WORM storage, or `chattr +a`, in production).  Reads back.
- `SyslogWitness`: one line per checkpoint to a syslog collector (UDP, TCP or a unix socket),
  `airgate-audit-checkpoint {json}`.  Write-only; a file of such lines reads back with
  `read_witness_path`.
- A compliance officer's offline copy is a JSONL file of the same lines
  (`airgate audit witness`).

Checkpoints carry ids, sizes, roots, times and signatures: never any event content.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import msgspec

from .checkpoint import Checkpoint, decode_checkpoint, encode_checkpoint

__all__ = [
    "DirectoryWitness",
    "SyslogWitness",
    "Witness",
    "WitnessError",
    "collect",
    "latest_of",
    "open_witnesses",
    "read_witness_path",
]

_log = logging.getLogger("airgate.audit")
_MARK = b"airgate-audit-checkpoint "


class WitnessError(Exception):
    """A witness cannot be written or read (the message names the witness, never content)."""


class Witness(Protocol):
    name: str

    def publish(self, checkpoint: Checkpoint) -> None:
        """Keep `checkpoint` (blocking; raises `WitnessError`)."""
        ...

    def checkpoints(self, log_id: str) -> list[Checkpoint] | None:
        """Every checkpoint kept for `log_id`, or None for a write-only witness."""
        ...

    def latest(self, log_id: str) -> Checkpoint | None:
        """The newest checkpoint kept for `log_id` (None: none, or write-only)."""
        ...


def latest_of(checkpoints: Iterable[Checkpoint]) -> Checkpoint | None:
    return max(checkpoints, key=lambda c: (c.epoch, c.id), default=None)


def _lines(data: bytes) -> Iterator[Checkpoint]:
    """Checkpoints in a JSONL or syslog file: one per line, after an optional prefix."""
    for line in data.splitlines():
        start = line.find(b"{")
        if start < 0:
            continue
        try:
            yield decode_checkpoint(line[start:])
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue  # a torn last line, or a foreign syslog line


def read_witness_path(path: Path, log_id: str | None = None) -> list[Checkpoint]:
    """Every checkpoint in a witness directory (its *.jsonl files) or one file; raises
    `WitnessError` when it cannot be read."""
    try:
        files = sorted(path.rglob("*.jsonl")) if path.is_dir() else [path]
        found = [cp for f in files for cp in _lines(f.read_bytes())]
    except OSError as exc:
        raise WitnessError(f"witness {path} cannot be read ({type(exc).__name__})") from None
    return [cp for cp in found if log_id is None or cp.log_id == log_id]


class DirectoryWitness:
    """Append-only JSONL files `<dir>/<log_id>/<YYYY-MM-DD>.jsonl`, fsynced per checkpoint."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.name = f"dir:{self.path}"

    def publish(self, checkpoint: Checkpoint) -> None:
        day = datetime.fromtimestamp(checkpoint.ts_us / 1e6, UTC).strftime("%Y-%m-%d")
        folder = self.path / checkpoint.log_id
        line = encode_checkpoint(checkpoint) + b"\n"
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(folder / f"{day}.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise WitnessError(
                f"witness {self.name} cannot be written ({type(exc).__name__})"
            ) from None

    def _mounted(self) -> None:
        if not self.path.is_dir():
            # never created silently: an unmounted witness would look like an empty one
            raise WitnessError(f"witness {self.name} is not an existing directory")

    def checkpoints(self, log_id: str) -> list[Checkpoint]:
        self._mounted()
        folder = self.path / log_id
        return read_witness_path(folder, log_id) if folder.exists() else []

    def latest(self, log_id: str) -> Checkpoint | None:
        """From the newest day's file alone (appends are in order): a start reads one file,
        not the witness's whole history."""
        self._mounted()
        try:
            days = sorted((self.path / log_id).glob("*.jsonl"), reverse=True)
        except OSError as exc:
            raise WitnessError(
                f"witness {self.name} cannot be read ({type(exc).__name__})"
            ) from None
        for day in days:
            if (found := latest_of(read_witness_path(day, log_id))) is not None:
                return found
        return None


class SyslogWitness:
    """RFC 5424 lines to a syslog collector: `udp://host:port`, `tcp://host:port` or a unix
    socket path (a datagram socket such as /dev/log)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.name = f"syslog:{address}"
        parts = urlsplit(address)
        if parts.scheme in ("udp", "tcp"):
            if not parts.hostname or not parts.port:
                raise ValueError("a syslog witness address is udp://host:port or tcp://host:port")
            self._target: tuple[str, int] | str = (parts.hostname, parts.port)
            self._kind = socket.SOCK_DGRAM if parts.scheme == "udp" else socket.SOCK_STREAM
            self._family = socket.AF_INET6 if ":" in parts.hostname else socket.AF_INET
        elif address.startswith("/"):
            self._target, self._kind, self._family = address, socket.SOCK_DGRAM, socket.AF_UNIX
        else:
            raise ValueError("a syslog witness address is udp://, tcp:// or a socket path")

    def _frame(self, checkpoint: Checkpoint) -> bytes:
        ts = datetime.fromtimestamp(checkpoint.ts_us / 1e6, UTC).isoformat().replace("+00:00", "Z")
        # <110> = facility log audit (13) * 8 + informational (6)
        header = f"<110>1 {ts} {socket.gethostname() or '-'} airgate - checkpoint - ".encode()
        return header + _MARK + encode_checkpoint(checkpoint)

    def publish(self, checkpoint: Checkpoint) -> None:
        frame = self._frame(checkpoint)
        try:
            with socket.socket(self._family, self._kind) as sock:
                sock.settimeout(2.0)
                sock.connect(self._target)
                if self._kind == socket.SOCK_STREAM:  # RFC 6587 octet counting
                    sock.sendall(str(len(frame)).encode() + b" " + frame)
                else:
                    sock.send(frame)
        except OSError as exc:
            raise WitnessError(
                f"witness {self.name} cannot be written ({type(exc).__name__})"
            ) from None

    def checkpoints(self, log_id: str) -> None:
        return None

    def latest(self, log_id: str) -> None:
        return None


def open_witnesses(directory: str, syslog: str) -> Sequence[Witness]:
    """The witnesses configuration names (`[audit] witness_dir`, `witness_syslog`)."""
    witnesses: list[Witness] = []
    if directory:
        witnesses.append(DirectoryWitness(directory))
    if syslog:
        witnesses.append(SyslogWitness(syslog))
    return witnesses


def collect(
    witnesses: Sequence[Witness], log_id: str | None, paths: Sequence[Path] = ()
) -> list[tuple[str, list[Checkpoint]]]:
    """What each readable witness, and each witness file or directory named, kept (blocking;
    raises `WitnessError`).  `log_id` None: every log's."""
    found: list[tuple[str, list[Checkpoint]]] = []
    for witness in witnesses:
        kept = witness.checkpoints(log_id) if log_id else None
        if kept is None and isinstance(witness, DirectoryWitness):
            kept = read_witness_path(witness.path)
        if kept is not None:
            found.append((witness.name, kept))
    found.extend((f"file:{path}", read_witness_path(path, log_id)) for path in paths)
    return found
