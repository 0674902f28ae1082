"""One structured log line per request, and the request id.

An ASGI middleware (not Litestar's logging middleware, which logs bodies by default): it assigns
the request id, times the whole exchange including a streamed body, and logs metadata only —
never a body, a header value or a query string.

The request id is always the server's (`x-request-id` on the response): it names the log line,
the audit events and the completion, so a client must not choose it (to write its own tokens
to disk, or to make two requests share an id).  A client's own `x-request-id`, when it is a
plain token, is only echoed back as `x-client-request-id`, for its own correlation; it is never
logged or audited.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable
from typing import Any

from litestar.enums import ScopeType
from litestar.types import (
    ASGIApp,
    HTTPResponseBodyEvent,
    HTTPResponseStartEvent,
    Message,
    Receive,
    Scope,
    Send,
)

from ..errors import GatewayError, error_body_for
from ..ids import random_hex
from ..pipeline.facts import Progress
from ..telemetry.metrics import Metrics

__all__ = ["RequestInfo", "RequestLogMiddleware", "RouteTemplates", "request_info", "send_error"]

_log = logging.getLogger("airgate.request")
_CLIENT_ID = re.compile(rb"^[A-Za-z0-9._:-]{1,64}\Z")
_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})


class RouteTemplates:
    """Raw paths -> the route templates of the app's route table, for logs, metric labels and
    the audit log: a raw path (or an unknown one) may carry anything a client typed.  A path
    parameter shows as `{id}`; anything unrouted as `/other`."""

    def __init__(self, paths: Iterable[str]) -> None:
        exact: dict[str, str] = {}
        prefixes: list[tuple[str, str]] = []
        for path in paths:
            head, brace, _ = path.partition("{")
            if brace:
                prefixes.append((head, head + "{id}"))
            else:
                exact[path] = path
        self._exact = exact
        self._prefixes = tuple(sorted(prefixes, key=lambda p: -len(p[0])))

    def __call__(self, path: str) -> str:
        found = self._exact.get(path)
        if found is not None:
            return found
        for head, template in self._prefixes:
            if path.startswith(head) and len(path) > len(head):
                return template
        return "/other"


class RequestInfo:
    """One request's log record: made by the middleware below, read back when the exchange is
    over.  The route template and the caller's key id are filled in on the way in; an
    inference's `Progress` is attached by the pipeline, an error code by the error renderer."""

    __slots__ = ("error_code", "key_id", "progress", "request_id", "route", "started")

    def __init__(self, request_id: str, route: str, started: float | None = None) -> None:
        self.request_id = request_id
        self.route = route
        self.started = time.perf_counter() if started is None else started
        self.key_id: str | None = None  # the caller (an id, never a credential)
        self.progress: Progress | None = None
        self.error_code: str | None = None


def request_info(scope: Scope) -> RequestInfo:
    info: RequestInfo = scope["state"]["airgate"]
    return info


class RequestLogMiddleware:
    def __init__(self, app: ASGIApp, metrics: Metrics, routes: RouteTemplates) -> None:
        self.app = app
        self.metrics = metrics
        self.route_of = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        request_id = random_hex(12)
        info = RequestInfo(request_id, self.route_of(scope.get("path", "")), start)
        scope.setdefault("state", {})["airgate"] = info
        status = 500
        headers = [(b"x-request-id", request_id.encode())]
        client_id = _client_request_id(scope)
        if client_id is not None:
            headers.append((b"x-client-request-id", client_id))

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), *headers]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self._log(scope, info, status, time.perf_counter() - start)

    def _log(self, scope: Scope, info: RequestInfo, status: int, elapsed: float) -> None:
        route = info.route
        self.metrics.requests.labels(route, str(status)).inc()
        method = scope.get("method", "")
        fields: dict[str, Any] = {
            "request_id": info.request_id,
            "method": method if method in _METHODS else "OTHER",
            "path": route,
            "status": status,
            "latency_ms": round(elapsed * 1000, 2),
        }
        error = info.error_code
        p = info.progress
        if p is not None:
            fields.update(
                model=p.model,
                stream=p.stream,
                prompt_tokens=p.prompt_tokens,
                completion_tokens=p.completion_tokens,
                finish_reason=p.finish_reason,
                ttft_ms=None if p.ttft_s is None else round(p.ttft_s * 1000, 2),
            )
            if p.deployment is not None:
                fields.update(deployment=p.deployment, route=p.route_reason, attempts=p.attempts)
            error = error or p.error_code
        if info.key_id is not None:
            fields["key_id"] = info.key_id
        if error is not None:
            fields["error"] = error
        _log.info("request", extra={"fields": fields})


def _client_request_id(scope: Scope) -> bytes | None:
    """The client's `x-request-id` when it is a plain token (echoed only, never kept)."""
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            return value if _CLIENT_ID.match(value) else None
    return None


async def send_error(scope: Scope, send: Send, err: GatewayError) -> None:
    """Answer `err` from ASGI middleware (before or instead of the app), in the error shape
    of the route's protocol, and note its code in the request log (the first code wins)."""
    info = request_info(scope)
    if info.error_code is None:
        info.error_code = err.code or err.type
    body = error_body_for(scope.get("path", ""), err)
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    headers += [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
    start: HTTPResponseStartEvent = {
        "type": "http.response.start",
        "status": err.status_code,
        "headers": headers,
    }
    await send(start)
    end: HTTPResponseBodyEvent = {"type": "http.response.body", "body": body, "more_body": False}
    await send(end)
