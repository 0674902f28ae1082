"""Every request but the public routes is authenticated here, before routing.

An ASGI middleware (inside the request log, outside Litestar's router, so unrouted paths are
authenticated too and nothing is revealed to anonymous callers); `access.identity` turns the
credential into a `Principal`.  A failure is audited (`auth.failure`, the reason code and the
client address, never the credential) and answered 401 with one fixed message.  The principal
is handed to the handler in the ASGI scope (the one channel from a middleware to a handler);
handlers read it once (`caller`) and pass it on explicitly.

With `[auth] local_trust`, a request without any credential from a loopback peer is judged
first by `access.auth.local_trust` (the peer socket's owner must be this server's OS user); one
it refuses needs a key like any other (401, audited with the refusal's reason).

A router that authenticates its own requests (the compliance console: a session cookie, not a
bearer) is passed as a path prefix in `sessions`; every path under it goes through untouched.

Floods are stopped first: an address that has spent its budget of failures (`flood.py`) is
answered 429 before its credential is looked at, unless that credential has worked here
recently; failures and those 429s are audited in aggregate (`failure_audit.py`).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from litestar import Request
from litestar.enums import ScopeType
from litestar.types import (
    ASGIApp,
    Receive,
    Scope,
    Send,
)

from ..access.auth import AuthenticationFailed, KeyStoreUnavailable, Principal
from ..access.identity import AuthFailed, authenticate
from ..access.stack import Security, SecurityHolder
from ..errors import (
    GatewayError,
    RateLimited,
    ServiceUnavailable,
    Unauthenticated,
)
from .failure_audit import FailureAudit
from .flood import FloodGuard, retry_after_header
from .request_log import RequestInfo, send_error
from .tls import client_cert_pem

__all__ = ["AuthMiddleware", "caller", "client_address", "principal_of"]

_log = logging.getLogger("airgate.auth")
_NOT_ADDRESS = re.compile(r"[^A-Za-z0-9_.:@/+-]")
FLOODED = "rate_limited_unauthenticated"  # the audit reason of a 429 from the flood guard


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


def client_address(scope: Scope) -> str:
    """The peer's address as the audit log keeps it (an IPv6 zone dropped; "unknown" when the
    server knows none, e.g. a Unix socket)."""
    client = scope.get("client")
    host = str(client[0]).partition("%")[0] if client else ""
    return _NOT_ADDRESS.sub("", host)[:128] or "unknown"


class AuthMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        holder: SecurityHolder,
        public: frozenset[str],
        guard: FloodGuard,
        failures: FailureAudit,
        sessions: frozenset[str] = frozenset(),
    ) -> None:
        self.app = app
        self.holder = holder
        self.public = public  # the route table's public paths
        self.sessions = tuple(sessions)  # prefixes of routers with their own authentication
        self.guard = guard
        self.failures = failures
        self.clock = failures.clock  # one clock for budgets and windows (monotonic seconds)

    @property
    def security(self) -> Security:
        return self.holder.get()

    def _public(self, path: str) -> bool:
        if path in self.public:
            return True
        if any(path == p or path.startswith(p + "/") for p in self.sessions):
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
        cert = None if authorization else client_cert_pem(scope)  # a bearer comes first
        credential = authorization or (cert.encode() if cert else b"")
        local = self.security.local_trust
        refused: AuthenticationFailed | None = None
        # a credential (even an empty Authorization header) is always checked as given
        if local is not None and authorization is None and cert is None:
            try:
                trusted = local.authenticate(
                    scope.get("client"), scope.get("server"), scope.get("headers", ())
                )
            except AuthenticationFailed as exc:  # a loopback peer of another user: key needed
                refused = exc
            else:
                if trusted is not None:
                    await self._admit(scope, receive, send, trusted)
                    return
        address = client_address(scope)
        now = self.clock()
        wait = self.guard.retry_after(address, now)
        if wait is not None and not self.guard.known(credential, now):
            limited = RateLimited(
                "too many failed authentication attempts from this address; retry later",
                headers={"Retry-After": retry_after_header(wait)},
            )
            await self._refuse(scope, send, address, FLOODED, limited)
            return
        try:
            if refused is not None:
                raise refused
            principal = await authenticate(self.security, authorization, cert)
        except (AuthenticationFailed, AuthFailed) as exc:
            reason = getattr(exc, "reason", None) or type(exc).__name__
            self.guard.failed(address, now)
            self.guard.forget(credential)
            err = Unauthenticated("authentication failed: send a valid API key as a bearer token")
            err.headers = {"WWW-Authenticate": "Bearer"}
            await self._refuse(scope, send, address, _code(reason), err)
            return
        except KeyStoreUnavailable:
            await send_error(scope, send, ServiceUnavailable("the key store is unavailable"))
            return
        self.guard.remember(credential, now)
        await self._admit(scope, receive, send, principal)

    async def _admit(
        self, scope: Scope, receive: Receive, send: Send, principal: Principal
    ) -> None:
        scope["state"]["principal"] = principal
        _record(scope).key_id = principal.key_id
        await self.app(scope, receive, send)

    async def _refuse(
        self, scope: Scope, send: Send, address: str, reason: str, err: GatewayError
    ) -> None:
        """Audit the refusal (aggregated), then answer `err`."""
        info = _record(scope)
        noted = self.failures.note(
            address,
            reason,
            status=err.status_code,
            route=info.route,
            request_id=info.request_id,
            now=self.clock(),  # after the lookup: windows open in the order of this clock
        )
        try:
            for event in noted.events:
                await self.security.record(event)
        except ServiceUnavailable as exc:  # a refusal it cannot audit is not answered as one
            if noted.opened is not None:
                self.failures.retract(noted.opened)
            await send_error(scope, send, exc)
            return
        if noted.opened is not None:  # one log line per address and reason per window
            _log.info("authentication refused: %s from %s", reason, address)
        await send_error(scope, send, err)


def _code(reason: str) -> str:
    text = "".join(ch if ch.isalnum() else "_" for ch in reason.lower())[:32]
    return text if text[:1].isalpha() else "auth_" + text[:27]


def _record(scope: Scope) -> RequestInfo:
    record: RequestInfo = scope["state"]["airgate"]  # the request log runs outside this
    return record
