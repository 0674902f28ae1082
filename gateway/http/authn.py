"""Every request but the public routes is authenticated here, before routing.

An ASGI middleware (inside the request log, outside Litestar's router, so unrouted paths are
authenticated too and nothing is revealed to anonymous callers); `access.identity` turns the
credential into a `Principal`.  A failure is audited (`auth.failure`, the reason code, never
the credential) and answered 401 with one fixed message.  The principal is handed to the
handler in the ASGI scope (the one channel from a middleware to a handler); handlers read it
once (`caller`) and pass it on explicitly.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from litestar import Request
from litestar.enums import ScopeType
from litestar.types import (
    ASGIApp,
    HTTPResponseBodyEvent,
    HTTPResponseStartEvent,
    Receive,
    Scope,
    Send,
)

from ..access.auth import AuthenticationFailed, KeyStoreUnavailable, Principal
from ..access.identity import AuthFailed, authenticate
from ..access.stack import Security, SecurityHolder
from ..audit import AuditEvent, AuditPrincipal, new_event_id
from ..errors import GatewayError, ServiceUnavailable, Unauthenticated, error_body
from .request_log import RequestInfo
from .tls import client_cert_pem

__all__ = ["AuthMiddleware", "caller", "principal_of"]

_log = logging.getLogger("airgate.auth")


def principal_of(scope: Scope) -> Principal | None:
    principal: Principal | None = scope.get("state", {}).get("principal")
    return principal


def caller(request: Request[Any, Any, Any]) -> Principal:
    """The authenticated caller of a route that is not public (the middleware below guarantees
    one there); a dependency of the inference, admin and compliance handlers."""
    principal = principal_of(request.scope)
    if principal is None:
        raise Unauthenticated("authentication failed: send a valid API key as a bearer token")
    return principal


class AuthMiddleware:
    def __init__(self, app: ASGIApp, holder: SecurityHolder, public: frozenset[str]) -> None:
        self.app = app
        self.holder = holder
        self.public = public  # the route table's public paths

    @property
    def security(self) -> Security:
        return self.holder.get()

    def _public(self, path: str) -> bool:
        if path in self.public:
            return True
        return path == "/metrics" and self.security.settings.auth.public_metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP or self._public(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        authorization = None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                authorization = value
                break
        try:
            cert = None if authorization else client_cert_pem(scope)  # a bearer comes first
            principal = await authenticate(self.security, authorization, cert)
        except (AuthenticationFailed, AuthFailed) as exc:
            reason = getattr(exc, "reason", None) or type(exc).__name__
            await self._refuse(scope, send, reason)
            return
        except KeyStoreUnavailable:
            await _send_error(scope, send, ServiceUnavailable("the key store is unavailable"))
            return
        state = scope["state"]
        state["principal"] = principal
        _record(scope).key_id = principal.key_id
        await self.app(scope, receive, send)

    async def _refuse(self, scope: Scope, send: Send, reason: str) -> None:
        info = _record(scope)
        event = AuditEvent(
            event_id=new_event_id(),
            ts=datetime.now(UTC),
            kind="auth.failure",
            outcome="denied",
            request_id=info.request_id,
            principal=AuditPrincipal(),
            route=info.route,
            http_status=401,
            error_class=_code(reason),
        )
        try:
            await self.security.record(event)
        except ServiceUnavailable as exc:  # a refusal it cannot audit is not answered as one
            await _send_error(scope, send, exc)
            return
        _log.info("authentication failed: %s", _code(reason))
        err = Unauthenticated("authentication failed: send a valid API key as a bearer token")
        err.headers = {"WWW-Authenticate": "Bearer"}
        await _send_error(scope, send, err)


def _code(reason: str) -> str:
    text = "".join(ch if ch.isalnum() else "_" for ch in reason.lower())[:32]
    return text if text[:1].isalpha() else "auth_" + text[:27]


def _record(scope: Scope) -> RequestInfo:
    record: RequestInfo = scope["state"]["airgate"]  # the request log runs outside this
    return record


async def _send_error(scope: Scope, send: Send, err: GatewayError) -> None:
    info = _record(scope)
    if info.error_code is None:
        info.error_code = err.code or err.type
    body = error_body(err)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
    start: HTTPResponseStartEvent = {
        "type": "http.response.start",
        "status": err.status_code,
        "headers": headers,
    }
    await send(start)
    end: HTTPResponseBodyEvent = {"type": "http.response.body", "body": body, "more_body": False}
    await send(end)
