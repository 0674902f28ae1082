"""Role checks for the admin and compliance routes, and the audit of every such access.

`requires(*roles)` is a Litestar guard: a caller without one of the roles gets 403, and the
refusal is itself audited (`admin.action` / `audit.access` with outcome `denied`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from .audit import AuditEvent, new_event_id
from .auth import Principal
from .errors import PermissionDenied, Unauthenticated
from .gate import audit_principal
from .identity import principal_of
from .reqlog import route_of
from .security import Security

__all__ = ["record_access", "requires"]

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
) -> None:
    """Audit one admin or compliance access (see `Security.record`)."""
    info = scope.get("state", {}).get("airgate")
    event = AuditEvent(
        event_id=new_event_id(),
        ts=datetime.now(UTC),
        kind=kind,
        outcome=outcome,
        request_id=info.request_id if info else None,
        principal=audit_principal(principal) if principal else None,
        action=action,
        route=route_of(scope.get("path", "")),
        http_status=status,
        detail=detail or {},
    )
    await security.record(event)


def requires(kind: Kind, *roles: str) -> Any:
    """A guard admitting callers holding any of `roles`."""
    wanted = frozenset(roles)

    async def guard(
        connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
    ) -> None:
        principal = principal_of(connection.scope)
        if principal is None:
            raise Unauthenticated("authentication failed: send a valid API key as a bearer token")
        if principal.roles & wanted:
            return
        security: Security = connection.app.state["security_holder"].get()
        await record_access(
            security,
            connection.scope,
            principal,
            kind=kind,
            action=str(handler.name or handler.handler_name),
            outcome="denied",
            status=403,
            detail={"needs": "_or_".join(sorted(wanted))},
        )
        raise PermissionDenied(f"this route needs the role {' or '.join(sorted(wanted))}")

    return guard
