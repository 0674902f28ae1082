"""Auth failures, audited in aggregate: one event per (client address, reason) per window.

The flood that prompted this wrote one durable `auth.failure` row per request (11,576 rows and
+7.6 MB in 10 s, for ever).  Now the first failure of an address and reason opens a window
(`[auth] failure_audit_window_s`, 10 s by default) and is recorded at once, with its request
id, route and `count = 1`, exactly as a lone failure always was; the rest of the window is
counted in memory and written as one event with `count = n` when the window closes (by the
flush task the app's lifespan runs, or by the next failure of that address and reason, and at
shutdown).  So the counts of the `auth.failure` events always sum to the failures answered, and
an address floods the log with at most two rows per reason per window.

What is given up: a failure after the first of its window has no event of its own (its request
id is in the request log line only), and a crash loses the counts of the open windows (at most
one window's worth, never the first failure).

Memory is bounded: at most `MAX_WINDOWS` open windows; beyond that, failures are counted per
reason under one overflow window without an address (`client_address` absent, detail
`overflow = 1`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

from ..audit import AuditEvent, AuditPrincipal, new_event_id
from ..errors import ServiceUnavailable

__all__ = ["MAX_WINDOWS", "FailureAudit", "Noted"]

_log = logging.getLogger("airgate.auth")

MAX_WINDOWS: Final = 4_096

_Key = tuple[str | None, str]  # (client address, or None for the overflow; reason code)
Record = Callable[[AuditEvent], Awaitable[None]]


class _Window:
    __slots__ = ("opened", "pending", "status")

    def __init__(self, opened: float, status: int) -> None:
        self.opened = opened
        self.status = status
        self.pending = 0  # failures after the first


@dataclass(frozen=True)
class Noted:
    """What one failure asks for: the events to record now (a closed window's total, then a
    new window's first failure), and the window it opened (to `retract` if those events
    could not be recorded)."""

    events: list[AuditEvent] = field(default_factory=list)
    opened: _Key | None = None


class FailureAudit:
    """The open windows of auth failures; `window_s` 0 records every failure on its own."""

    def __init__(
        self,
        window_s: float,
        *,
        max_windows: int = MAX_WINDOWS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s = window_s
        self.clock = clock
        self._max = max_windows
        self._windows: OrderedDict[_Key, _Window] = OrderedDict()  # in the order they opened
        self._wake: asyncio.Event | None = None  # made by `flushing`, on the serving loop

    @property
    def open_windows(self) -> int:
        return len(self._windows)

    def note(
        self,
        address: str,
        reason: str,
        *,
        status: int,
        route: str | None,
        request_id: str | None,
        now: float,
    ) -> Noted:
        """Count one failure of `address` for `reason` (answered with `status`)."""
        if self.window_s <= 0:
            return Noted([_event((address, reason), status, 1, route, request_id)])
        key: _Key = (address, reason)
        if key not in self._windows and len(self._windows) >= self._max:
            key = (None, reason)
        events: list[AuditEvent] = []
        window = self._windows.get(key)
        if window is not None and now - window.opened >= self.window_s:
            del self._windows[key]
            if window.pending:
                events.append(_event(key, window.status, window.pending))
            window = None
        if window is not None:
            window.pending += 1
            return Noted()
        self._windows[key] = _Window(now, status)
        if self._wake is not None:
            self._wake.set()
        events.append(_event(key, status, 1, route, request_id))
        return Noted(events, key)

    def retract(self, key: _Key) -> None:
        """The first failure of `key`'s window was not recorded (nor answered as a failure):
        forget the window unless others have been counted in it since."""
        window = self._windows.get(key)
        if window is not None and not window.pending:
            del self._windows[key]

    def due(self, now: float) -> list[AuditEvent]:
        """The totals of every window that has closed by `now` (those windows are forgotten)."""
        events = []
        while self._windows:
            key, window = next(iter(self._windows.items()))
            if now - window.opened < self.window_s:
                break  # windows close in the order they opened
            del self._windows[key]
            if window.pending:
                events.append(_event(key, window.status, window.pending))
        return events

    def drain(self) -> list[AuditEvent]:
        """The totals of every open window, closing them all (shutdown)."""
        events = [_event(k, w.status, w.pending) for k, w in self._windows.items() if w.pending]
        self._windows.clear()
        return events

    def next_close(self) -> float | None:
        """When the oldest open window closes (the clock's time), or None."""
        for window in self._windows.values():
            return window.opened + self.window_s
        return None

    @contextlib.asynccontextmanager
    async def flushing(self, record: Record) -> AsyncIterator[None]:
        """Write each window's total when it closes, for as long as this is entered; on exit,
        write the totals of the windows still open."""
        wake = self._wake = asyncio.Event()
        task = asyncio.create_task(self._flush(record, wake), name="auth-failure-audit")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self._wake = None
            for event in self.drain():
                await _write(record, event)

    async def _flush(self, record: Record, wake: asyncio.Event) -> None:
        while True:
            close = self.next_close()
            if close is None:
                wake.clear()
                await wake.wait()
                continue
            delay = close - self.clock()
            if delay > 0:
                await asyncio.sleep(delay)
            for event in self.due(self.clock()):
                await _write(record, event)


async def _write(record: Record, event: AuditEvent) -> None:
    try:
        await record(event)
    except ServiceUnavailable:  # strict mode, audit log down: said loudly, nothing to answer
        _log.error("audit log unavailable: %d authentication failures not audited", event.count)


def _event(
    key: _Key,
    status: int,
    count: int,
    route: str | None = None,
    request_id: str | None = None,
) -> AuditEvent:
    address, reason = key
    return AuditEvent(
        event_id=new_event_id(),
        ts=datetime.now(UTC),
        kind="auth.failure",
        outcome="denied",
        request_id=request_id,
        principal=AuditPrincipal(),
        route=route,
        http_status=status,
        error_class=reason,
        client_address=address,
        count=count,
        detail={"overflow": 1} if address is None else {},
    )
