"""The drain's state machine and middleware, on a fake ASGI app (no server, no sockets):
requests are counted while in flight; a draining server refuses new ones in the OpenAI error
shape; the drain waits for those in flight and cuts the rest at its deadline, ending a stream
with one error event and answering a request not yet answered with the 503."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from gateway.http.drain import RETRY_AFTER_S, Drain, DrainMiddleware
from gateway.http.request_log import RequestInfo
from gateway.openai.sse import sse_error

Message = dict[str, Any]


class FakeApp:
    """An ASGI app that starts its answer (a stream or not) and then waits to be released."""

    def __init__(
        self, *, stream: bool = True, start: bool = True, media: bytes = b"text/event-stream"
    ) -> None:
        self.stream = stream
        self.media = media
        self.start = start
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        media = self.media if self.stream else b"application/json"
        try:
            if self.start:
                await send(
                    {
                        "type": "http.response.start",
                        "status": 200,
                        "headers": [(b"content-type", media)],
                    }
                )
                await send(
                    {"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True}
                )
            self.entered.set()
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True  # what a client's disconnect does to the pipeline
            raise
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


def scope(path: str = "/v1/chat/completions") -> dict[str, Any]:
    return {
        "type": "http",
        "path": path,
        "method": "POST",
        "headers": [],
        "state": {"airgate": RequestInfo("0" * 24, path)},
    }


async def nothing() -> Message:
    return {"type": "http.disconnect"}


class Call:
    """One request through the middleware, in a task of its own (as uvicorn runs it)."""

    def __init__(self, middleware: DrainMiddleware, path: str = "/v1/chat/completions") -> None:
        self.sent: list[Message] = []
        self.scope = scope(path)

        async def send(message: Message) -> None:
            self.sent.append(message)

        self.task = asyncio.ensure_future(middleware(self.scope, nothing, send))

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.sent[0]["headers"])

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent[1:])


def middleware(app: Any, drain: Drain) -> DrainMiddleware:
    return DrainMiddleware(app, drain, sse_error)


async def test_a_request_is_in_flight_until_its_answer_is_complete() -> None:
    drain, app = Drain(30), FakeApp()
    call = Call(middleware(app, drain))
    await app.entered.wait()
    assert drain.in_flight == 1
    assert drain.gauges()["airgate_requests_in_flight"][1] == 1.0
    assert drain.gauges()["airgate_draining"][1] == 0.0
    app.release.set()
    await call.task
    assert drain.in_flight == 0
    assert call.body == b"data: 1\n\ndata: [DONE]\n\n"


async def test_a_draining_server_refuses_new_requests_but_not_health_ready_metrics() -> None:
    drain = Drain(30)
    await drain.run()  # nothing in flight: drained at once
    app = FakeApp(stream=False)
    app.release.set()
    refused = Call(middleware(app, drain))
    await refused.task
    assert refused.status == 503
    assert refused.headers[b"retry-after"] == str(RETRY_AFTER_S).encode()
    assert refused.headers[b"connection"] == b"close"
    error = json.loads(refused.body)["error"]
    assert error["type"] == "server_error" and error["code"] == "service_unavailable"
    assert "draining" in error["message"]
    assert refused.scope["state"]["airgate"].error_code == "service_unavailable"
    assert drain.refused == 1 and drain.gauges()["airgate_draining"][1] == 1.0
    for path in ("/health", "/ready", "/metrics"):
        passed = Call(middleware(app, drain), path)
        await passed.task
        assert passed.status == 200, path


async def test_an_idle_drain_keeps_refusing_for_its_minimum_before_it_ends() -> None:
    """A load balancer still sends until it has seen /ready fail: the drain answers those 503
    (retried elsewhere) for `min_s` rather than let the listener close under them."""
    drain = Drain(30, min_s=0.3)
    loop = asyncio.get_running_loop()
    started = loop.time()
    running = asyncio.create_task(drain.run())
    await asyncio.sleep(0)  # the drain's first step: draining from now on
    assert drain.draining
    app = FakeApp(stream=False)
    app.release.set()
    refused = Call(middleware(app, drain))
    await refused.task
    assert refused.status == 503 and not running.done()
    await running
    assert loop.time() - started >= 0.3
    assert Drain(1, min_s=5).min_s == 1  # never beyond the drain's timeout


async def test_the_drain_waits_for_a_stream_that_ends_in_time() -> None:
    drain, app = Drain(3600), FakeApp()
    call = Call(middleware(app, drain))
    await app.entered.wait()
    draining = asyncio.ensure_future(drain.run())
    await asyncio.sleep(0)  # one turn of the loop: the drain starts and waits
    assert drain.draining and not draining.done() and drain.in_flight == 1
    app.release.set()
    await draining
    await call.task
    assert not app.cancelled
    assert call.body.endswith(b"data: [DONE]\n\n")
    assert drain.in_flight == 0


async def test_at_the_deadline_a_stream_is_cut_with_one_error_event() -> None:
    drain, app = Drain(0), FakeApp()
    call = Call(middleware(app, drain))
    await app.entered.wait()
    await drain.run()
    await call.task  # ended by the middleware, not by the cancellation
    assert app.cancelled
    assert call.status == 200
    last = call.sent[-1]
    assert last["more_body"] is False
    error = json.loads(last["body"].removeprefix(b"data: "))["error"]
    assert error["code"] == "service_unavailable"
    assert b"[DONE]" not in call.body
    assert drain.in_flight == 0


async def test_at_the_deadline_an_ollama_stream_is_cut_with_one_error_line() -> None:
    drain, app = Drain(0), FakeApp(media=b"application/x-ndjson")
    call = Call(middleware(app, drain), "/api/chat")
    await app.entered.wait()
    await drain.run()
    await call.task
    assert app.cancelled and call.status == 200
    last = call.sent[-1]
    assert last["more_body"] is False and last["body"].endswith(b"\n")
    error = json.loads(last["body"])
    assert list(error) == ["error"] and "stopped" in error["error"]


async def test_at_the_deadline_a_request_not_yet_answered_gets_the_503() -> None:
    drain, app = Drain(0), FakeApp(stream=False, start=False)
    call = Call(middleware(app, drain))
    await app.entered.wait()
    await drain.run()
    await call.task
    assert app.cancelled
    assert call.status == 503 and call.headers[b"connection"] == b"close"
    assert json.loads(call.body)["error"]["code"] == "service_unavailable"


async def test_a_cancellation_that_is_not_the_drains_goes_on() -> None:
    drain, app = Drain(30), FakeApp()
    call = Call(middleware(app, drain))
    await app.entered.wait()
    call.task.cancel()  # e.g. uvicorn's own graceful-shutdown timeout
    with pytest.raises(asyncio.CancelledError):
        await call.task
    assert drain.in_flight == 0
