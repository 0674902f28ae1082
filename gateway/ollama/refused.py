"""Ollama's model-management routes, refused: models enter airgate only as signed bundles.

    POST /api/pull, /api/push, /api/create, /api/copy;  DELETE /api/delete;
    POST and HEAD /api/blobs/{digest}

Each answers 403 with Ollama's error shape, after authentication like every other route (an
anonymous caller gets the 401).  The refusal is audited (`admin.action` `models.<verb>`,
outcome `denied`): an attempt to bring weights in by another door is what a compliance officer
wants to see.  The body is not read.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, delete, head, post
from litestar.di import NamedDependency
from litestar.params import FromPath

from ..access.auth import Principal
from ..access.stack import Security
from ..errors import PermissionDenied
from ..http.guards import record_access

__all__ = ["REFUSED"]

MESSAGE = "models enter airgate only as signed bundles: use `airgate bundle import FILE`"


async def _refuse(
    request: Request[Any, Any, Any], security: Security, principal: Principal, verb: str
) -> PermissionDenied:
    error = PermissionDenied(MESSAGE)
    await record_access(
        security,
        request.scope,
        principal,
        kind="admin.action",
        action=f"models.{verb}",
        outcome="denied",
        status=error.status_code,
        error_class=error.code or error.type,
    )
    return error


@post(["/api/pull", "/api/push", "/api/create", "/api/copy"], status_code=403)
async def manage_models(
    request: Request[Any, Any, Any],
    security: NamedDependency[Security],
    principal: NamedDependency[Principal],
) -> None:
    """Pull, push, create or copy a model: refused (403)."""
    raise await _refuse(request, security, principal, request.url.path.rsplit("/", 1)[-1])


@delete("/api/delete", status_code=403)
async def delete_model(
    request: Request[Any, Any, Any],
    security: NamedDependency[Security],
    principal: NamedDependency[Principal],
) -> None:
    """Delete a model: refused (403)."""
    raise await _refuse(request, security, principal, "delete")


@post("/api/blobs/{digest:str}", status_code=403)
async def push_blob(
    request: Request[Any, Any, Any],
    security: NamedDependency[Security],
    principal: NamedDependency[Principal],
    digest: FromPath[str],
) -> None:
    """Upload a blob: refused (403)."""
    raise await _refuse(request, security, principal, "blob_upload")


@head("/api/blobs/{digest:str}", status_code=403)
async def check_blob(
    request: Request[Any, Any, Any],
    security: NamedDependency[Security],
    principal: NamedDependency[Principal],
    digest: FromPath[str],
) -> None:
    """Whether a blob exists: refused (403, no body)."""
    raise await _refuse(request, security, principal, "blob_check")


REFUSED = (manage_models, delete_model, push_blob, check_blob)
