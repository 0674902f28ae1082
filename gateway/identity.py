"""Who is calling: every request but the public probes is authenticated here, before routing.

An ASGI middleware (inside the request log, outside Litestar's router, so unrouted paths are
authenticated too and nothing is revealed to anonymous callers).  The credential decides the
method: `Authorization: Bearer ag_...` is an API key, a bearer with two dots a JWT (when
configured), none with a verified client certificate an mTLS principal.  A failure is audited
(`auth.failure`, the reason code, never the credential) and answered 401 with one fixed message.
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

from .audit import AuditEvent, AuditPrincipal, new_event_id
from .auth import AuthenticationFailed, KeyStoreUnavailable, Principal, principal_from_client_cert
from .errors import GatewayError, ServiceUnavailable, Unauthenticated, error_body
from .reqlog import request_info, route_of
from .security import Security
from .tls import client_cert_pem

__all__ = ["PUBLIC_PATHS", "AuthMiddleware", "SecurityHolder", "caller", "principal_of"]

_log = logging.getLogger("airgate.auth")
PUBLIC_PATHS = frozenset({"/health", "/ready", "/openapi.json"})
_MAX_CREDENTIAL = 16 * 1024


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


class AuthFailed(Exception):
    def __init__(self, reason: str) -> None:
        self.reason = reason


async def _authenticate(security: Security, scope: Scope) -> Principal:
    header = b""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            header = value
            break
    if header:
        if len(header) > _MAX_CREDENTIAL:
            raise AuthFailed("too_large")
        scheme, _, token = header.decode("latin-1").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise AuthFailed("unsupported_scheme")
        if token.startswith("ag_"):
            return await security.keys.authenticate(token)
        if security.jwt is not None and token.count(".") == 2:
            return security.jwt.verify(token)
        raise AuthFailed("malformed")
    pem = client_cert_pem(scope)
    if pem is not None and security.subjects is not None:
        return principal_from_client_cert(pem.encode(), subject_map=security.subjects)
    raise AuthFailed("missing_credentials")


class SecurityHolder:
    """The app's access stack, set by the lifespan once it is open (before any request)."""

    security: Security | None = None

    def get(self) -> Security:
        if self.security is None:
            raise RuntimeError("the access stack is not open")
        return self.security


class AuthMiddleware:
    def __init__(self, app: ASGIApp, holder: SecurityHolder) -> None:
        self.app = app
        self.holder = holder

    @property
    def security(self) -> Security:
        return self.holder.get()

    def _public(self, path: str) -> bool:
        if path in PUBLIC_PATHS:
            return True
        return path == "/metrics" and self.security.settings.auth.public_metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP or self._public(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        try:
            principal = await _authenticate(self.security, scope)
        except (AuthenticationFailed, AuthFailed) as exc:
            reason = getattr(exc, "reason", None) or type(exc).__name__
            await self._refuse(scope, send, reason)
            return
        except KeyStoreUnavailable:
            await _send_error(scope, send, ServiceUnavailable("the key store is unavailable"))
            return
        scope.setdefault("state", {})["principal"] = principal
        info = scope["state"].get("airgate")
        if info is not None:
            info.key_id = principal.key_id
        await self.app(scope, receive, send)

    async def _refuse(self, scope: Scope, send: Send, reason: str) -> None:
        info = request_info(scope) if "airgate" in scope.get("state", {}) else None
        event = AuditEvent(
            event_id=new_event_id(),
            ts=datetime.now(UTC),
            kind="auth.failure",
            outcome="denied",
            request_id=info.request_id if info else None,
            principal=AuditPrincipal(),
            route=route_of(scope.get("path", "")),
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


async def _send_error(scope: Scope, send: Send, err: GatewayError) -> None:
    info = scope.get("state", {}).get("airgate")
    if info is not None and info.error_code is None:
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
