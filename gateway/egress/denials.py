"""What the serving process does with a refusal: count it, log it, audit it.

    DENIALS.denied(dest)       from the guard's hook, on any thread: counted at once, then
                               handed to the event loop without blocking
    DENIALS.listen()           the socket children (vLLM's engine core) report refusals to
    DENIALS.auditing(append)   while the audit writer is open: `egress.denied` events

Refusals of one destination are aggregated per window: the first is audited (and logged) at
once, the rest of the window as one event with `count`, so a client library retrying in a
loop cannot flood the audit log.  Refusals before the writer opens wait (at most
`_MAX_PENDING`) and are audited when it does.  Only the destination's address is kept, never
anything of a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Literal

from ..audit import AuditEvent, new_event_id

__all__ = ["DENIALS", "Denials", "Process"]

_log = logging.getLogger("airgate.egress")

Process = Literal["gateway", "child"]
_MAX_PENDING = 256
_IDENT = re.compile(r"^[A-Za-z0-9_.:@/+-]{1,128}$")  # the audit event's identifier shape
_UCRED = struct.Struct("iII")  # pid, uid, gid


def _split(destination: str) -> tuple[str, int | None]:
    host, sep, port = destination.rpartition(":")
    if not sep or not port.isdigit() or (":" in host and not host.startswith("[")):
        host, port = destination, ""
    host = host.removeprefix("[").removesuffix("]")
    return (host if _IDENT.match(host) else "unprintable"), (int(port) if port else None)


class Denials:
    """Refusals of this process and its children, counted by process; audited when attached."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._counts: dict[Process, int] = {"gateway": 0, "child": 0}
        self._lock = threading.Lock()
        self._target: tuple[asyncio.AbstractEventLoop, Callable[[AuditEvent], None]] | None = None
        self._pending: list[tuple[str, Process]] = []
        self._windows: dict[tuple[str, Process], int] = {}
        self._timers: dict[tuple[str, Process], asyncio.TimerHandle] = {}
        self._listening: str | None = None

    def counts(self) -> dict[str, float]:
        """process -> refusals so far (the metric)."""
        with self._lock:
            return {k: float(v) for k, v in self._counts.items()}

    def denied(self, destination: str, process: Process = "gateway") -> None:
        """One refusal.  Called inside the refused call, on any thread: never blocks."""
        with self._lock:
            self._counts[process] += 1
            target = self._target
            if target is None:
                if len(self._pending) < _MAX_PENDING:
                    self._pending.append((destination, process))
                return
        loop, _ = target
        with contextlib.suppress(RuntimeError):  # the loop has closed
            loop.call_soon_threadsafe(self._on_loop, destination, process)

    @contextlib.contextmanager
    def auditing(self, append: Callable[[AuditEvent], None]) -> Iterator[None]:
        """Audit refusals through `append` (non-blocking) on the running loop for the block;
        open windows are audited on the way out."""
        loop = asyncio.get_running_loop()
        with self._lock:
            self._target = (loop, append)
            pending, self._pending = self._pending, []
        for destination, process in pending:
            self._on_loop(destination, process)
        try:
            yield
        finally:
            with self._lock:
                self._target = None
            for timer in self._timers.values():
                timer.cancel()
            self._timers.clear()
            for (destination, process), count in self._windows.items():
                if count:
                    self._audit(append, destination, process, count)
            self._windows.clear()

    def _on_loop(self, destination: str, process: Process) -> None:
        target = self._target
        if target is None:
            return
        loop, append = target
        key = (destination, process)
        if key in self._windows:
            self._windows[key] += 1
            return
        self._windows[key] = 0
        _log.warning("egress refused (%s process): %s", process, destination)
        self._audit(append, destination, process, 1)
        self._timers[key] = loop.call_later(self.window_s, self._close, key)

    def _close(self, key: tuple[str, Process]) -> None:
        self._timers.pop(key, None)
        target = self._target
        count = self._windows.pop(key, 0)
        if target is None or not count:
            return
        loop, append = target
        self._audit(append, *key, count)
        self._windows[key] = 0  # still refused: the next window counts on
        self._timers[key] = loop.call_later(self.window_s, self._close, key)

    @staticmethod
    def _audit(
        append: Callable[[AuditEvent], None], destination: str, process: Process, count: int
    ) -> None:
        host, port = _split(destination)
        detail: dict[str, str | int] = {"host": host, "process": process}
        if port is not None:
            detail["port"] = port
        append(
            AuditEvent(
                event_id=new_event_id(),
                ts=datetime.now(UTC),
                kind="egress.denied",
                outcome="denied",
                action="egress.connect",
                count=count if count > 1 else None,
                detail=detail,
            )
        )

    def listen(self) -> str:
        """The abstract unix socket children report refusals to (one datagram each); a thread
        receives them.  Only datagrams from this user's processes count (the kernel vouches
        for the sender).  Idempotent."""
        if self._listening is not None:
            return self._listening
        name = f"airgate-egress-{os.getpid()}-{secrets.token_hex(8)}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        sock.bind("\0" + name)
        threading.Thread(
            target=self._receive, args=(sock,), name="airgate-egress-reports", daemon=True
        ).start()
        self._listening = name
        return name

    def _receive(self, sock: socket.socket) -> None:
        uid = os.getuid()
        while True:
            data, ancillary, _, _ = sock.recvmsg(512, socket.CMSG_SPACE(_UCRED.size))
            sender = [
                _UCRED.unpack(d[: _UCRED.size])
                for level, kind, d in ancillary
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS
            ]
            if not sender or sender[0][1] != uid:
                continue
            self.denied(data.decode("utf-8", "replace"), "child")


DENIALS = Denials()  # the process's one guard has one place its refusals go
