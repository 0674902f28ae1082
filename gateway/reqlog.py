"""One structured log line per request, and the request id.

An ASGI middleware (not Litestar's logging middleware, which logs bodies by default): it assigns
the request id, times the whole exchange including a streamed body, and logs metadata only —
never a body, a header value or a query string.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from typing import Any

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from .metrics import Metrics

__all__ = ["RequestInfo", "RequestLogMiddleware", "request_info", "route_of"]

_log = logging.getLogger("airgate.request")
_VALID_ID = re.compile(rb"^[A-Za-z0-9._:-]{1,64}$")
_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})


_ROUTES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
    "/admin/keys",
    "/audit/events",
    "/audit/export",
    "/audit/verify",
    "/health",
    "/ready",
    "/metrics",
    "/openapi.json",
)


def route_of(path: str) -> str:
    """The route template a raw path falls under, for logs, metric labels and the audit log:
    a raw path (or an unknown one) may carry anything a client typed."""
    for route in _ROUTES:
        if path == route:
            return route
        if path.startswith(route + "/"):
            return route + "/{id}"
    return "/other"


class RequestInfo:
    """Facts a handler learns about its request, for the log line (and later the audit)."""

    __slots__ = (
        "attempts",
        "completion_tokens",
        "deployment",
        "error_code",
        "finish_reason",
        "key_id",
        "model",
        "prompt_tokens",
        "request_id",
        "route_reason",
        "started",
        "stream",
        "ttft_s",
    )

    def __init__(self, request_id: str, started: float | None = None) -> None:
        self.request_id = request_id
        self.started = time.perf_counter() if started is None else started
        self.deployment: str | None = None  # where the router sent it (the last attempt)
        self.route_reason: str | None = None
        self.attempts = 0
        self.model: str | None = None
        self.stream = False
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.finish_reason: str | None = None
        self.ttft_s: float | None = None
        self.error_code: str | None = None
        self.key_id: str | None = None  # the caller (an id, never a credential)


def request_info(scope: Scope) -> RequestInfo:
    info: RequestInfo = scope["state"]["airgate"]
    return info


class RequestLogMiddleware:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        request_id = _request_id(scope)
        info = RequestInfo(request_id, start)
        scope.setdefault("state", {})["airgate"] = info
        status = 500
        header = (b"x-request-id", request_id.encode())

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), header]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self._log(scope, info, status, time.perf_counter() - start)

    def _log(self, scope: Scope, info: RequestInfo, status: int, elapsed: float) -> None:
        route = route_of(scope.get("path", ""))
        self.metrics.requests.labels(route, str(status)).inc()
        method = scope.get("method", "")
        fields: dict[str, Any] = {
            "request_id": info.request_id,
            "method": method if method in _METHODS else "OTHER",
            "path": route,
            "status": status,
            "latency_ms": round(elapsed * 1000, 2),
        }
        if info.model is not None:
            fields.update(
                model=info.model,
                stream=info.stream,
                prompt_tokens=info.prompt_tokens,
                completion_tokens=info.completion_tokens,
                finish_reason=info.finish_reason,
                ttft_ms=None if info.ttft_s is None else round(info.ttft_s * 1000, 2),
            )
        if info.deployment is not None:
            fields.update(
                deployment=info.deployment, route=info.route_reason, attempts=info.attempts
            )
        if info.key_id is not None:
            fields["key_id"] = info.key_id
        if info.error_code is not None:
            fields["error"] = info.error_code
        _log.info("request", extra={"fields": fields})


def _request_id(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id" and _VALID_ID.match(value):
            return value.decode()
    return secrets.token_hex(12)
