"""Ollama's model-management routes, refused: models enter airgate only as signed bundles.

    POST /api/pull, /api/push, /api/create, /api/copy;  DELETE /api/delete;
    POST and HEAD /api/blobs/{digest}

Each answers 403 with Ollama's error shape, after authentication like every other route (an
anonymous caller gets the 401); the request log records the refusal.  The body is not read.
"""

from __future__ import annotations

from litestar import delete, head, post
from litestar.params import FromPath

from ..errors import PermissionDenied

__all__ = ["REFUSED"]

MESSAGE = "models enter airgate only as signed bundles: use `airgate bundle import FILE`"


def _refuse() -> PermissionDenied:
    return PermissionDenied(MESSAGE)


@post(["/api/pull", "/api/push", "/api/create", "/api/copy"], status_code=403)
async def manage_models() -> None:
    """Pull, push, create or copy a model: refused (403)."""
    raise _refuse()


@delete("/api/delete", status_code=403)
async def delete_model() -> None:
    """Delete a model: refused (403)."""
    raise _refuse()


@post("/api/blobs/{digest:str}", status_code=403)
async def push_blob(digest: FromPath[str]) -> None:
    """Upload a blob: refused (403)."""
    raise _refuse()


@head("/api/blobs/{digest:str}", status_code=403)
async def check_blob(digest: FromPath[str]) -> None:
    """Whether a blob exists: refused (403, no body)."""
    raise _refuse()


REFUSED = (manage_models, delete_model, push_blob, check_blob)
