"""Graceful drain: on SIGTERM or SIGINT, stop taking work, finish what runs, then stop.

    serving --signal--> draining --nothing in flight, or the deadline--> drained --> shutdown

While draining (`[server] drain_timeout_s`, default 30 s, and at least `drain_min_s`, default
3 s, so that a load balancer has seen /ready fail before the listener closes):
- `/ready` answers 503 at once, so a load balancer or Kubernetes takes this replica out;
- every new request but /health, /ready and /metrics is answered 503 in the OpenAI error shape
  with `Connection: close` and `Retry-After: 1`: the retry belongs on another replica, which
  can take it now (a longer wait would only idle the client; with a single server the restart
  is the wait, and clients back off on their own).  The listener stays open until the drain
  ends: a load balancer keeps sending for a moment after /ready fails, and a refused
  connection cannot be told from a crash;
- requests and streams already running finish.  At the deadline those still running are cut:
  cancelled, which is what a client that disconnects causes (the engine aborts; the audit log
  records `inference.cancelled`), then a stream gets one final error event (the OpenAI
  adapters' `sse_error`; on Ollama's NDJSON, an `{"error": ...}` line) and ends, and a request
  not yet answered gets the 503.

Then uvicorn's own shutdown runs: the listener closes, idle connections close (a cut client
that reads nothing gets `CLOSE_GRACE_S`), the lifespan stops the engines and the audit writer
(which commits what is queued and signs its `close` checkpoint), and the process exits 0.
uvicorn would raise the stopping signal again once done, so that the process ends "killed by
SIGTERM" (status -15); `DrainingServer` does not, so an orderly stop is an exit status of 0.
A second SIGTERM or SIGINT during the drain changes nothing; SIGKILL is the hard stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Final

import uvicorn
from litestar.enums import ScopeType
from litestar.types import ASGIApp, HTTPResponseBodyEvent, Message, Receive, Scope, Send

from ..config import ServerSettings
from ..errors import GatewayError, ServiceUnavailable, error_body_for
from .request_log import request_info, send_error

__all__ = [
    "CLOSE_GRACE_S",
    "EXEMPT",
    "RETRY_AFTER_S",
    "Drain",
    "DrainMiddleware",
    "DrainingServer",
    "draining_error",
]

_log = logging.getLogger("airgate.drain")

RETRY_AFTER_S: Final = 1
CUT_GRACE_S: Final = 2.0  # for a cut request's last bytes (a client may have stopped reading)
CLOSE_GRACE_S: Final = 5  # uvicorn's graceful shutdown, after the drain: connections close
EXEMPT: Final = frozenset({"/health", "/ready", "/metrics"})  # never refused nor counted


def draining_error(message: str) -> ServiceUnavailable:
    """The 503 of a draining server (`/ready`, new requests, requests cut)."""
    return ServiceUnavailable(
        message, headers={"Retry-After": str(RETRY_AFTER_S), "Connection": "close"}
    )


class _Flight:
    """One request in flight: its task (to cut it) and how far its answer has gone."""

    __slots__ = ("complete", "cut", "event_stream", "started", "task")

    def __init__(self, task: asyncio.Task[object]) -> None:
        self.task = task
        self.started = False  # the status line and headers went out
        # a stream a final error can still end: text/event-stream (the adapters' final event)
        # or application/x-ndjson (Ollama's: one `{"error": ...}` line)
        self.event_stream: bytes | None = None
        self.complete = False
        self.cut = False


class Drain:
    """The drain's state: the requests in flight, and whether the server is draining."""

    def __init__(self, timeout_s: float, min_s: float = 0.0) -> None:
        self.timeout_s = timeout_s
        self.min_s = min(min_s, timeout_s)  # refusing, before the listener may close
        self.draining = False
        self.refused = 0  # new requests answered 503 while draining
        self._flights: set[_Flight] = set()
        self._idle = asyncio.Event()  # set while draining once nothing is in flight

    @classmethod
    def of(cls, server: ServerSettings) -> Drain:
        return cls(server.drain_timeout_s, server.drain_min_s)

    @property
    def in_flight(self) -> int:
        return len(self._flights)

    def gauges(self) -> dict[str, tuple[str, float]]:
        """For /metrics (`Metrics.watch`)."""
        return {
            "airgate_draining": ("1 while the server drains before it stops", float(self.draining)),
            "airgate_requests_in_flight": (
                "Requests being answered, open streams included (not /health, /ready, /metrics)",
                float(len(self._flights)),
            ),
        }

    def enter(self) -> _Flight:
        task = asyncio.current_task()
        assert task is not None  # an ASGI request always runs in a task
        flight = _Flight(task)
        self._flights.add(flight)
        return flight

    def leave(self, flight: _Flight) -> None:
        self._flights.discard(flight)
        if self.draining and not self._flights:
            self._idle.set()

    async def run(self) -> None:
        """Drain: refuse new requests from now on, let those in flight finish for up to
        `timeout_s`, then cut the rest and wait (briefly) for their last bytes."""
        if self.draining:
            return
        self.draining = True
        running = len(self._flights)
        _log.info("draining: %d requests in flight, up to %g s", running, self.timeout_s)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await self._settle(self.timeout_s)
        # a load balancer that has not yet seen /ready fail still sends here: answer it 503
        # (which it retries elsewhere) rather than close a connection under it
        if (rest := self.min_s - (loop.time() - started)) > 0:
            await asyncio.sleep(rest)
        cut = list(self._flights)
        for flight in cut:
            flight.cut = True
            flight.task.cancel("drain deadline")
        await self._settle(CUT_GRACE_S)
        _log.info(
            "drained: %d finished, %d cut at the deadline, %d new requests refused",
            running - len(cut),
            len(cut),
            self.refused,
        )

    async def _settle(self, timeout_s: float) -> None:
        if not self._flights:
            return
        self._idle.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()


class DrainMiddleware:
    """Counts the requests in flight, refuses new ones while draining and ends those cut.

    Inside the request log (a refusal has a request id and a log line), outside
    authentication (a draining server looks no credential up).  `final_event` renders the
    error that ends a cut stream (the OpenAI adapters' `sse_error`)."""

    def __init__(
        self, app: ASGIApp, drain: Drain, final_event: Callable[[GatewayError], bytes]
    ) -> None:
        self.app = app
        self.drain = drain
        self.final_event = final_event

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP or scope.get("path", "") in EXEMPT:
            await self.app(scope, receive, send)
            return
        drain = self.drain
        if drain.draining:
            drain.refused += 1
            await send_error(scope, send, draining_error("the server is draining: retry elsewhere"))
            return
        flight = drain.enter()

        async def tracked(message: Message) -> None:
            if message["type"] == "http.response.start":
                flight.started = True
                flight.event_stream = _stream_kind(message.get("headers", ()))
            elif not message.get("more_body", False):
                flight.complete = True
            await send(message)

        try:
            try:
                await self.app(scope, receive, tracked)
            except asyncio.CancelledError:
                if not flight.cut or flight.task.uncancel() > 0:
                    raise  # not (only) the drain's cut: uvicorn's, or the loop's end
            if flight.cut and not flight.complete:
                await self._end(scope, send, flight)
        finally:
            drain.leave(flight)

    async def _end(self, scope: Scope, send: Send, flight: _Flight) -> None:
        """The last bytes of a request cut at the deadline, if the client takes them in time
        (else uvicorn closes the connection, and the client sees it end unfinished)."""
        err = draining_error("the server stopped before this request was finished: retry it")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CUT_GRACE_S):
                if not flight.started:
                    await send_error(scope, send, err)
                elif flight.event_stream is not None:
                    request_info(scope).error_code = err.code
                    if flight.event_stream == _SSE:
                        last = self.final_event(err)
                    else:
                        last = error_body_for(scope.get("path", ""), err) + b"\n"
                    end: HTTPResponseBodyEvent = {
                        "type": "http.response.body",
                        "body": last,
                        "more_body": False,
                    }
                    await send(end)


_SSE, _NDJSON = b"text/event-stream", b"application/x-ndjson"


def _stream_kind(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The response's stream media type, when it is one a final error can end."""
    for name, value in headers:
        if name.lower() == b"content-type":
            kind = value.partition(b";")[0].strip()
            return kind if kind in (_SSE, _NDJSON) else None
    return None


class DrainingServer(uvicorn.Server):
    """uvicorn's server, stopped by a drain instead of at once, exiting 0 when done."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining: asyncio.Task[None] | None = None

    async def main_loop(self) -> None:
        self._loop = asyncio.get_running_loop()  # serving: a signal drains from now on
        await super().main_loop()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not recorded in `_captured_signals`, which uvicorn raises again after its shutdown.
        # A signal handler may interrupt the loop anywhere: the drain starts as a callback.
        loop = self._loop
        if loop is None:  # still starting up: nothing to drain
            self.should_exit = True
            return
        loop.call_soon_threadsafe(self._on_signal)

    def _on_signal(self) -> None:
        if self._draining is None:
            self._draining = asyncio.ensure_future(self._drain_then_stop())
        else:
            _log.info("signal during the drain: still draining (SIGKILL stops at once)")

    async def _drain_then_stop(self) -> None:
        try:
            await self.drain.run()
        finally:
            self.should_exit = True  # uvicorn's shutdown, at its next tick (0.1 s)
