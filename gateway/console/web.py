"""What every console page shares: the templates, the security headers, the signed-in viewer,
the CSRF check, the audit record of a view, and the error pages.

Pages are rendered on the server with Jinja2 (autoescape on for every template: a team name,
key name or model id is text, never markup).  Every console response goes through `secure()`,
which adds the security headers: a Content-Security-Policy with `default-src 'self'` (no inline
script or style anywhere; the only script is the vendored `static/console.js`), no framing, no
referrer, no MIME sniffing, and `Cache-Control: no-store` on pages.

A page of another package (e.g. usage and cost) is a handler in a router made by
`gateway.console.console_pages(...)`, which gives it the dependencies `viewer` (the signed-in
`Viewer`; none: a redirect to sign-in) and `security`; `render_page` builds the page:

    @get("/usage")
    async def usage(request, viewer: NamedDependency[Viewer],
                    security: NamedDependency[Security]) -> Response[str]:
        await viewed(request, security, viewer, "console.usage")
        return render_page(request, "reports/usage.html", {...}, viewer=viewer)

Its template `{% extends "base.html" %}`, fills `{% block content %}`, and lives in
`gateway/<package>/templates/`, named `<package>/<file>` (here `reports/usage.html`).
"""

from __future__ import annotations

import functools
import importlib.resources
import logging
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import jinja2
from litestar import Request, Response
from litestar.datastructures import UploadFile
from litestar.di import NamedDependency
from litestar.exceptions import HTTPException
from litestar.response import Redirect

from ..access.auth import Principal
from ..access.stack import Security
from ..audit import AuditCorrupt
from ..errors import GatewayError
from ..http.flood import FloodGuard
from ..http.guards import Kind, record_access
from .session import COOKIE, Session, SessionStore, same_token

__all__ = [
    "HEADERS",
    "PAGE_HEADERS",
    "Console",
    "ConsoleError",
    "SignInRequired",
    "Viewer",
    "console_exception_handlers",
    "form_of",
    "page_text",
    "render_page",
    "secure",
    "templates",
    "viewed",
    "viewer",
]

_log = logging.getLogger("airgate.console")

CSP = "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
HEADERS: Mapping[str, str] = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cross-Origin-Opener-Policy": "same-origin",
}
PAGE_HEADERS: Mapping[str, str] = {**HEADERS, "Cache-Control": "no-store"}
SIGN_IN = "/console/signin"
MAX_FORM_FIELD = 16 * 1024  # a JWT fits; nothing a form of ours sends is longer


class SignInRequired(Exception):
    """No live session: the browser is sent to the sign-in page."""


class ConsoleError(Exception):
    """A refusal shown as an error page: `status` and a message of ours (never client text)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Viewer:
    """The signed-in officer of this request: the cookie's id, the session, the principal."""

    session_id: str
    session: Session

    @property
    def principal(self) -> Principal:
        return self.session.principal

    @property
    def is_admin(self) -> bool:
        return "admin" in self.principal.roles


def _package_template(name: str) -> str | None:
    """`<package>/<file>` from `gateway/<package>/templates/<file>` (another package's page)."""
    package, sep, file = name.partition("/")
    if not sep or not package.isidentifier() or not file or ".." in file or file[0] == "/":
        return None
    try:
        return (importlib.resources.files(f"gateway.{package}") / "templates" / file).read_text(
            encoding="utf-8"
        )
    except (ModuleNotFoundError, OSError):
        return None


def _environment() -> jinja2.Environment:
    loader = jinja2.ChoiceLoader(
        [
            jinja2.PackageLoader("gateway.console", "templates"),
            jinja2.FunctionLoader(_package_template),
        ]
    )
    env = jinja2.Environment(
        loader=loader,
        autoescape=True,  # every template, whatever its name
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["plural"] = lambda n, word: f"{n:,} {word}{'' if n == 1 else 's'}"
    return env


def secure(response: Response[Any], *, page: bool = True) -> Response[Any]:
    """`response` with the console's security headers (and no-store on a page)."""
    response.headers.update(PAGE_HEADERS if page else HEADERS)
    return response


@functools.cache
def templates() -> jinja2.Environment:
    """The console's template environment (built once; templates are package data)."""
    return _environment()


def render_page(
    request: Request[Any, Any, Any],
    template: str,
    context: Mapping[str, Any] | None = None,
    *,
    viewer: Viewer | None = None,
    status: int = 200,
) -> Response[str]:
    """A console page: `template` rendered with `context` plus what the base template needs
    (`viewer`, `csrf`, `path`), with the security headers."""
    body = page_text(request, template, context, viewer=viewer)
    return secure(Response(body, status_code=status, media_type="text/html"))


def page_text(
    request: Request[Any, Any, Any],
    template: str,
    context: Mapping[str, Any] | None = None,
    *,
    viewer: Viewer | None = None,
) -> str:
    """The HTML of `render_page` (for a page streamed in parts)."""
    base = {
        "viewer": viewer,
        "csrf": viewer.session.csrf if viewer is not None else "",
        "path": request.url.path,
    }
    return templates().get_template(template).render({**base, **(context or {})})


class Console:
    """The console of one app: its sessions and its sign-in flood guard."""

    def __init__(self, sessions: SessionStore, guard: FloodGuard) -> None:
        self.sessions = sessions
        self.guard = guard


async def viewer(
    request: Request[Any, Any, Any],
    console: NamedDependency[Console],
    security: NamedDependency[Security],
) -> Viewer:
    """The `viewer` dependency of every page but sign-in: the live session of the cookie, or
    `SignInRequired`.  A session of an API key that was revoked (or has expired) since
    sign-in ends here."""
    session_id = request.cookies.get(COOKIE)
    session = console.sessions.get(session_id)
    if session is None or session_id is None:
        raise SignInRequired()
    who = session.principal
    if who.method == "api_key":
        record = await security.keys.get(who.key_id)
        ended = record is None or record.revoked_at is not None
        if record is not None and record.expires_at is not None:
            ended = ended or record.expires_at <= datetime.now(UTC)
        if ended:
            console.sessions.end(session_id)
            raise SignInRequired()
    request.scope["state"]["airgate"].key_id = who.key_id  # the request log's caller
    return Viewer(session_id, session)


async def form_of(
    request: Request[Any, Any, Any], security: Security, viewer: Viewer | None, action: str
) -> dict[str, str]:
    """The fields of a POSTed form whose CSRF token (`csrf`) is the session's; else a 403
    page (audited).  Only text fields; each at most MAX_FORM_FIELD characters."""
    fields: dict[str, str] = {}
    for name, value in (await request.form()).items():
        if isinstance(value, UploadFile) or len(value) > MAX_FORM_FIELD:
            raise ConsoleError(400, "This form takes only short text fields.")
        fields[name] = value
    if viewer is not None and not same_token(fields.get("csrf"), viewer.session.csrf):
        await record_access(
            security,
            request.scope,
            viewer.principal,
            kind="audit.access",
            action=action,
            outcome="denied",
            status=403,
            detail={"via": "console"},
            error_class="csrf_failed",
        )
        raise ConsoleError(
            403,
            "This form was not sent by this console page (its security token is missing or "
            "wrong). Reload the page and try again.",
        )
    return fields


async def viewed(
    request: Request[Any, Any, Any],
    security: Security,
    viewer: Viewer,
    action: str,
    *,
    kind: Kind = "audit.access",
    outcome: str = "success",
    status: int = 200,
    detail: Mapping[str, str | int] | None = None,
    error_class: str | None = None,
) -> None:
    """Audit a console view or action (`detail.via` = "console")."""
    await record_access(
        security,
        request.scope,
        viewer.principal,
        kind=kind,
        action=action,
        outcome=outcome,  # type: ignore[arg-type]
        status=status,
        detail={"via": "console", **(detail or {})},
        error_class=error_class,
    )


def _error_page(request: Request[Any, Any, Any], status: int, message: str) -> Response[Any]:
    context = {"status": status, "message": message}
    return render_page(request, "error.html", context, status=status)


def _on_sign_in_required(request: Request[Any, Any, Any], _: SignInRequired) -> Response[Any]:
    redirect = Redirect(SIGN_IN, status_code=303)
    redirect.delete_cookie(COOKIE, path="/console")
    return secure(redirect)


def _on_console_error(request: Request[Any, Any, Any], exc: ConsoleError) -> Response[Any]:
    return _error_page(request, exc.status, exc.message)


def _on_gateway_error(request: Request[Any, Any, Any], exc: GatewayError) -> Response[Any]:
    info = request.scope.get("state", {}).get("airgate")
    if info is not None and info.error_code is None:
        info.error_code = exc.code or exc.type
    response = _error_page(request, exc.status_code, str(exc))  # our messages, never input
    response.headers.update(exc.headers)
    return response


_HTTP_MESSAGES = {
    404: "There is no such console page.",
    405: "This page does not take that method.",
    413: "The form is larger than this server accepts.",
}


def _on_http_exception(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    status = exc.status_code
    if status >= 500:
        return _on_unexpected(request, exc)
    message = _HTTP_MESSAGES.get(status, "The request was not understood: check the form.")
    return _error_page(request, status, message)


def _on_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    frames = "".join(traceback.format_tb(exc.__traceback__))  # never the message: it may echo
    _log.error("unhandled %s on console %s\n%s", type(exc).__name__, request.url.path, frames)
    return _error_page(request, 500, "Something went wrong on the server; it has been logged.")


def _on_corrupt(request: Request[Any, Any, Any], _: AuditCorrupt) -> Response[Any]:
    message = (
        "A stored audit event cannot be read: the log may have been tampered with. "
        "Run verification on the Integrity page to find the first bad row."
    )
    return _error_page(request, 500, message)


console_exception_handlers: dict[type[Exception] | int, Any] = {
    SignInRequired: _on_sign_in_required,
    AuditCorrupt: _on_corrupt,
    ConsoleError: _on_console_error,
    GatewayError: _on_gateway_error,
    HTTPException: _on_http_exception,
    Exception: _on_unexpected,
}
