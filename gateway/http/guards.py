"""Role checks for the admin and compliance routes, and the audit of every such access.

`role_required(kind, *roles)` is the `principal` dependency of such a router: a caller without
one of the roles gets 403, and the refusal is itself audited (`admin.action` / `audit.access`
with outcome `denied`).  The access stack comes in as a dependency, never from app state.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from litestar import Request
from litestar.di import NamedDependency, Provide

from ..access.auth import Principal
from ..access.identity import audit_principal
from ..access.stack import Security
from ..audit import AuditEvent, new_event_id
from ..errors import PermissionDenied
from .authn import caller
from .request_log import RequestInfo

__all__ = ["Kind", "record_access", "role_required"]

Kind = Literal["admin.action", "audit.access"]


async def record_access(
    security: Security,
    scope: Any,
    principal: Principal | None,
    *,
    kind: Kind,
    action: str,
    outcome: Literal["success", "denied", "failure"],
    status: int,
    detail: dict[str, str | int] | None = None,
    error_class: str | None = None,
) -> None:
    """Audit one admin or compliance access (see `Security.record`)."""
    info: RequestInfo = scope["state"]["airgate"]
    event = AuditEvent(
        event_id=new_event_id(),
        ts=datetime.now(UTC),
        kind=kind,
        outcome=outcome,
        request_id=info.request_id,
        principal=audit_principal(principal) if principal else None,
        action=action,
        route=info.route,
        http_status=status,
        error_class=error_class,
        detail=detail or {},
    )
    await security.record(event)


def role_required(kind: Kind, *roles: str) -> Provide:
    """The `principal` dependency of routes that need one of `roles`: the caller, or 403 (the
    refusal audited as `kind` with outcome `denied`).  Given as a router's dependency, it
    replaces the app's plain `principal` for that router's routes."""
    wanted = frozenset(roles)

    async def principal(
        request: Request[Any, Any, Any], security: NamedDependency[Security]
    ) -> Principal:
        who = caller(request)
        if who.roles & wanted:
            return who
        handler = request.route_handler
        await record_access(
            security,
            request.scope,
            who,
            kind=kind,
            action=str(handler.name or handler.handler_name),
            outcome="denied",
            status=403,
            detail={"needs": "_or_".join(sorted(wanted))},
            error_class=PermissionDenied.code,
        )
        raise PermissionDenied(f"this route needs the role {' or '.join(sorted(wanted))}")

    return Provide(principal)
