"""The compliance console: server-rendered pages for compliance officers, served by airgate
itself at /console, working with no network at all (templates and static files are package
data; no CDN, no external font, no build step).

    /console/signin            sign in with an auditor or admin key (or a JWT)  [no session]
    /console/static/<file>     the vendored CSS and the copy button's script    [no session]
    /console/events            filter, page through, open an event; export JSONL | CSV | OCSF
    /console/integrity         verify the log: per chain status, first bad seq, checkpoints
    /console/keys              (admin) list, create, revoke
    /console/policies          the policy in force and its lint findings
    /console/usage, /tco       usage per day, team and model (SVG charts); cost per deployment

Every other console path needs the session cookie (`session.py`); the bearer-token middleware
leaves `/console` to it (the route table marks the router `session=True`).  Every page view and
export is audited (`audit.access`, `detail.via` = "console").  `web.py` holds what pages share;
`console_pages(...)` makes a router for pages of another package (e.g. usage and cost).
"""

from __future__ import annotations

from litestar import Router
from litestar.di import Provide
from litestar.handlers import HTTPRouteHandler

from .pages_events import event_page, events_page, export_events
from .pages_integrity import integrity_page, run_verification
from .pages_keys import create_key, keys_page, policies_page, revoke_key
from .pages_reports import tco_page, usage_page
from .pages_session import (
    console_home,
    no_such_page,
    sign_in,
    sign_in_form,
    sign_out,
    static_file,
)
from .session import SessionStore
from .web import Console, Viewer, console_exception_handlers, render_page, viewed, viewer

__all__ = [
    "PATH",
    "Console",
    "SessionStore",
    "Viewer",
    "console_pages",
    "console_router",
    "render_page",
    "viewed",
]

PATH = "/console"


def console_pages(*handlers: HTTPRouteHandler, path: str = PATH) -> Router:
    """A router of console pages at `path`: each handler may take the `viewer` (the signed-in
    officer; none: redirected to sign-in) and renders with `render_page`; errors become console
    error pages.  Register it in the route table with `session=True`."""
    return Router(
        path=path,
        route_handlers=list(handlers),
        dependencies={"viewer": Provide(viewer)},
        exception_handlers=console_exception_handlers,
        include_in_schema=False,
    )


console_router = console_pages(
    sign_in_form,
    sign_in,
    sign_out,
    console_home,
    static_file,
    events_page,
    event_page,
    export_events,
    integrity_page,
    run_verification,
    keys_page,
    create_key,
    revoke_key,
    policies_page,
    usage_page,
    tco_page,
    no_such_page,
)
