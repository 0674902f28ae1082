"""Role checks for the admin and compliance routes, and the audit of every such access.

`requires(*roles)` is a Litestar guard: a caller without one of the roles gets 403, and the
refusal is itself audited (`admin.action` / `audit.access` with outcome `denied`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from .audit import AuditEvent, AuditUnavailable, new_event_id
from .auth import Principal
from .errors import PermissionDenied, ServiceUnavailable, Unauthenticated
from .gate import audit_principal
from .identity import audit_route, principal_of
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
    """Audit one admin or compliance access (durable in strict mode; 503 if it cannot be)."""
    info = scope.get("state", {}).get("airgate")
    event = AuditEvent(
        event_id=new_event_id(),
        ts=datetime.now(UTC),
        kind=kind,
        outcome=outcome,
        request_id=info.request_id if info else None,
        principal=audit_principal(principal) if principal else None,
        action=action,
        route=audit_route(scope.get("path", "")),
        http_status=status,
        detail=detail or {},
    )
    try:
        if security.strict:
            await security.audit.append(event)
        else:
            security.audit.append_nowait(event)
    except AuditUnavailable:
        raise ServiceUnavailable("the audit log is unavailable") from None


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
