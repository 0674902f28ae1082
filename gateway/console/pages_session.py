"""Sign-in, sign-out, the console's home and its vendored static files.

Sign-in takes an auditor or admin API key (or a JWT when `[auth.jwt]` is configured), checked
exactly as a bearer token is (`access.identity.authenticate`), and starts a session (see
`session.py`).  An app key is refused with a page that says why.  Each attempt is audited:
success as `audit.access` (`console.signin`), a bad credential as `auth.failure` with its
reason code and the client address (never the credential), an app key as a denied
`audit.access`.  Failed attempts spend the same per-address budget as failed bearer tokens
(`http/flood.py`): past it, sign-in answers 429 until the budget refills.

The sign-in form carries its own CSRF token (a short-lived cookie and a hidden field that must
match), so another site cannot sign a browser in under the attacker's key (login CSRF).
"""

from __future__ import annotations

import importlib.resources
import secrets
import time
from datetime import UTC, datetime
from typing import Any

from litestar import Request, Response, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath
from litestar.response import Redirect

from ..access.auth import AuthenticationFailed, KeyStoreUnavailable
from ..access.identity import AuthFailed, audit_principal, authenticate
from ..access.stack import Security
from ..audit import AuditEvent, new_event_id
from ..errors import ServiceUnavailable
from ..http.authn import client_address
from ..http.flood import retry_after_header
from ..http.guards import record_access
from .session import COOKIE, PRE_COOKIE, same_token
from .web import HEADERS, Console, ConsoleError, Viewer, form_of, render_page, secure, viewed

__all__ = ["console_home", "no_such_page", "sign_in", "sign_in_form", "sign_out", "static_file"]

CONSOLE_ROLES = frozenset({"auditor", "admin"})
_PRE_MAX_AGE_S = 3600
_STATIC = {  # the vendored files: name -> media type (nothing else is served)
    "console.css": "text/css; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "favicon.svg": "image/svg+xml",  # else browsers ask /favicon.ico (an audited 401)
}


def _secure_cookie(request: Request[Any, Any, Any]) -> bool:
    """`Secure` when this request came over TLS (airgate's own, `[server] tls_*`)."""
    return request.scope.get("scheme") == "https"


def _sign_in_page(
    request: Request[Any, Any, Any], *, message: str = "", status: int = 200
) -> Response[str]:
    token = secrets.token_urlsafe(32)
    response = render_page(
        request, "signin.html", {"pre": token, "message": message}, status=status
    )
    response.set_cookie(
        PRE_COOKIE,
        token,
        max_age=_PRE_MAX_AGE_S,
        path="/console",
        secure=_secure_cookie(request),
        httponly=True,
        samesite="strict",
    )
    return response


@get("/signin", name="console.signin")
async def sign_in_form(request: Request[Any, Any, Any]) -> Response[str]:
    """The sign-in page."""
    return _sign_in_page(request)


async def _auth_failure(
    request: Request[Any, Any, Any], security: Security, reason: str, status: int
) -> None:
    info = request.scope["state"]["airgate"]
    await security.record(
        AuditEvent(
            event_id=new_event_id(),
            ts=datetime.now(UTC),
            kind="auth.failure",
            outcome="denied",
            request_id=info.request_id,
            principal=None,
            action="console.signin",
            route=info.route,
            http_status=status,
            error_class=reason,
            client_address=client_address(request.scope),
            detail={"via": "console"},
        )
    )


def _reason(exc: Exception) -> str:
    text = getattr(exc, "reason", None) or type(exc).__name__
    code = "".join(ch if ch.isalnum() else "_" for ch in str(text).lower())[:32]
    return code if code[:1].isalpha() else "auth_" + code[:27]


@post("/signin", name="console.signin_post", status_code=200)
async def sign_in(
    request: Request[Any, Any, Any],
    security: NamedDependency[Security],
    console: NamedDependency[Console],
) -> Response[Any]:
    """Check the credential; start a session (303 to the events page) or say why not."""
    fields = await form_of(request, security, None, "console.signin")
    if not same_token(fields.get("csrf"), request.cookies.get(PRE_COOKIE) or "\0"):
        raise ConsoleError(
            403, "The sign-in form has expired or was not sent by this page. Reload and retry."
        )
    credential = fields.get("credential", "").strip()
    address = client_address(request.scope)
    now = time.monotonic()
    wait = console.guard.retry_after(address, now)
    if wait is not None:
        await _auth_failure(request, security, "rate_limited_unauthenticated", 429)
        response = _sign_in_page(
            request,
            message="Too many failed sign-ins from this address: wait a minute and retry.",
            status=429,
        )
        response.headers["Retry-After"] = retry_after_header(wait)
        return response
    try:
        if not credential:
            raise AuthFailed("missing_credentials")
        principal = await authenticate(security, b"Bearer " + credential.encode("utf-8"), None)
    except (AuthenticationFailed, AuthFailed, UnicodeError) as exc:
        console.guard.failed(address, now)
        await _auth_failure(request, security, _reason(exc), 401)
        return _sign_in_page(
            request,
            message="That key or token was not accepted: check it, or ask an admin for an "
            "auditor key.",
            status=401,
        )
    except KeyStoreUnavailable:
        raise ServiceUnavailable("the key store is unavailable; retry shortly") from None
    if not principal.roles & CONSOLE_ROLES:
        await record_access(
            security,
            request.scope,
            principal,
            kind="audit.access",
            action="console.signin",
            outcome="denied",
            status=403,
            detail={"via": "console"},
            error_class="permission_denied",
        )
        return render_page(request, "refused.html", status=403)
    session_id, _ = console.sessions.start(principal)
    await security.record(
        AuditEvent(
            event_id=new_event_id(),
            ts=datetime.now(UTC),
            kind="audit.access",
            outcome="success",
            request_id=request.scope["state"]["airgate"].request_id,
            principal=audit_principal(principal),
            action="console.signin",
            route=request.scope["state"]["airgate"].route,
            http_status=303,
            client_address=address,
            detail={"via": "console"},
        )
    )
    redirect = Redirect("/console/events", status_code=303)
    redirect.set_cookie(
        COOKIE,
        session_id,
        path="/console",
        secure=_secure_cookie(request),
        httponly=True,
        samesite="strict",
    )
    redirect.delete_cookie(PRE_COOKIE, path="/console")
    return secure(redirect)


@post("/signout", name="console.signout", status_code=303)
async def sign_out(
    request: Request[Any, Any, Any],
    security: NamedDependency[Security],
    console: NamedDependency[Console],
    viewer: NamedDependency[Viewer],
) -> Response[Any]:
    """End the session (CSRF-checked) and go back to sign-in."""
    await form_of(request, security, viewer, "console.signout")
    console.sessions.end(viewer.session_id)
    await viewed(request, security, viewer, "console.signout", status=303)
    redirect = Redirect("/console/signin", status_code=303)
    redirect.delete_cookie(COOKIE, path="/console")
    return secure(redirect)


@get("/", name="console.home")
async def console_home(viewer: NamedDependency[Viewer]) -> Response[Any]:
    """The console's front door: the events page (sign-in first, when signed out)."""
    return secure(Redirect("/console/events", status_code=303))


def _static_bytes() -> dict[str, bytes]:
    root = importlib.resources.files("gateway.console") / "static"
    return {name: (root / name).read_bytes() for name in _STATIC}


_FILES = _static_bytes()


@get("/static/{name:str}", name="console.static")
async def static_file(name: FromPath[str]) -> Response[bytes]:
    """A vendored file (CSS, the copy button's script); no other file can be named."""
    body = _FILES.get(name)
    if body is None:
        raise ConsoleError(404, "There is no such console file.")
    response = Response(body, media_type=_STATIC[name])
    response.headers.update(HEADERS)
    response.headers["Cache-Control"] = "no-cache"
    return response


@get("/{rest:path}", name="console.missing")
async def no_such_page(rest: FromPath[str]) -> Response[str]:
    """Any other path under /console: the console's own 404 page (with its headers)."""
    raise ConsoleError(404, "There is no such console page.")
