"""Admin API: API keys.  Every route needs the admin role and every call is audited.

POST   /admin/keys           {"role", "team"?, "name"?, "expires_at"?, "all_teams"?} -> the key,
                             once (an auditor key: a team, or "all_teams": true)
GET    /admin/keys           every key's metadata and audit scope (never a secret)
DELETE /admin/keys/{key_id}  revoke

A refused call (a bad field, bad JSON, an unknown key) is audited as well: `admin.action` with
the status and the error code, never the body.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import msgspec
from litestar import Request, Response, Router, delete, get, post
from litestar.di import NamedDependency
from litestar.exceptions import HTTPException
from litestar.params import FromPath
from msgspec import Meta

from ..access.auth import ApiKeyRecord, Principal
from ..access.keys import KeyListing, KeyRefused, audit_scope, check_new_key
from ..access.stack import Security
from ..errors import GatewayError, InvalidRequest, NotFound
from ..http.decode import decode
from ..http.guards import record_access, role_required

__all__ = ["admin_router"]

Name = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:@/+-]+$")]


class CreateKey(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Exactly these fields: no mass assignment of ids, secrets or timestamps."""

    role: Literal["app", "auditor", "admin"]
    team: Name | None = None
    name: Name | None = None
    expires_at: datetime | None = None
    all_teams: bool = False  # an auditor of every team (else of `team` only)


class CreatedKey(msgspec.Struct, kw_only=True):
    key: str  # shown once; airgate keeps only an HMAC of its secret
    record: ApiKeyRecord


_decoder = msgspec.json.Decoder(CreateKey)
_encode = msgspec.json.Encoder().encode


def _json(payload: Any, status: int = 200) -> Response[bytes]:
    return Response(_encode(payload), status_code=status, media_type="application/json")


@asynccontextmanager
async def _refusal_audited(
    request: Request[Any, Any, Any], security: Security, principal: Principal, action: str
) -> AsyncIterator[None]:
    """An error raised inside is audited as this call's `admin.action`, then re-raised."""
    try:
        yield
    except (GatewayError, HTTPException) as exc:
        if isinstance(exc, GatewayError):
            code = exc.code or exc.type
        else:  # Litestar's own: the body over the size cap
            code = "request_too_large" if exc.status_code == 413 else f"http_{exc.status_code}"
        await record_access(
            security,
            request.scope,
            principal,
            kind="admin.action",
            action=action,
            outcome="denied" if exc.status_code in (401, 403) else "failure",
            status=exc.status_code,
            error_class=code,
        )
        raise


@post("/keys", status_code=201)
async def create_key(
    request: Request[Any, Any, Any],
    security: NamedDependency[Security],
    principal: NamedDependency[Principal],
) -> Response[bytes]:
    """Create an API key; the response holds the key, which is never shown again."""
    async with _refusal_audited(request, security, principal, "keys.create"):
        return await _create_key(request, security, principal)


async def _create_key(
    request: Request[Any, Any, Any], security: Security, principal: Principal
) -> Response[bytes]:
    body = decode(_decoder, await request.body())
    if body.expires_at is not None:
        if body.expires_at.tzinfo is None:
            raise InvalidRequest("expires_at needs a timezone (e.g. Z)", param="expires_at")
        if body.expires_at <= datetime.now(UTC):
            raise InvalidRequest("expires_at is in the past", param="expires_at")
    try:
        check_new_key(body.role, body.team, body.name, body.all_teams)
    except KeyRefused as exc:
        raise InvalidRequest(str(exc), param=exc.param) from None
    key, record = await security.keys.create(
        body.role,
        team=body.team,
        name=body.name,
        expires_at=body.expires_at,
        created_by=principal.key_id,
    )
    detail: dict[str, str | int] = {"target": record.key_id, "role": record.role}
    if (scope := audit_scope(record)) is not None:
        detail["audit_scope"] = scope
    await record_access(
        security,
        request.scope,
        principal,
        kind="admin.action",
        action="keys.create",
        outcome="success",
        status=201,
        detail=detail,
    )
    return _json(CreatedKey(key=key, record=record), 201)


@get("/keys")
async def list_keys(
    request: Request[Any, Any, Any],
    security: NamedDependency[Security],
    principal: NamedDependency[Principal],
) -> Response[bytes]:
    """Every key's metadata."""
    records = await security.keys.list()
    await record_access(
        security,
        request.scope,
        principal,
        kind="admin.action",
        action="keys.list",
        outcome="success",
        status=200,
        detail={"count": len(records)},
    )
    return _json({"data": [KeyListing.of(r) for r in records]})


@delete("/keys/{key_id:str}", status_code=200)
async def revoke_key(
    key_id: FromPath[str],
    request: Request[Any, Any, Any],
    security: NamedDependency[Security],
    principal: NamedDependency[Principal],
) -> Response[bytes]:
    """Revoke a key (at once: the next request with it gets 401)."""
    known = (await security.keys.get(key_id)) is not None if len(key_id) <= 64 else False
    revoked = known and await security.keys.revoke(key_id)
    await record_access(
        security,
        request.scope,
        principal,
        kind="admin.action",
        action="keys.revoke",
        outcome="success" if revoked else "failure",
        status=200 if revoked else 404,
        detail={"target": key_id} if known else {},
        error_class=None if revoked else NotFound.code,
    )
    if not revoked:
        raise NotFound("no such active key")
    return _json({"key_id": key_id, "revoked": True})


admin_router = Router(
    path="/admin",
    route_handlers=[create_key, list_keys, revoke_key],
    dependencies={"principal": role_required("admin.action", "admin")},
    include_in_schema=False,
)
