"""Keys (admins only): every key's metadata, create one (its secret shown once, on the page that
answers the form, with a copy button), revoke one.  Policies (auditors and admins): the
documents and version in force, and the lint findings of the policy files.

Key operations follow the admin API's rules (`access.keys.check_new_key`) and leave the same
`admin.action` audit records, marked `via: console`; forms are CSRF-checked.  Revoking a key
also ends the console sessions signed in with it.
"""

from __future__ import annotations

from datetime import UTC, datetime, time
from pathlib import Path
from typing import Any

import msgspec
from litestar import Request, Response, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath

from policies import lint, load_default_policy
from policies.lint import lint_documents

from ..access.auth.apikeys import is_key_id
from ..access.keys import KeyListing, KeyRefused, audit_scope, check_new_key
from ..access.stack import Security
from .web import Console, ConsoleError, Viewer, form_of, render_page, viewed

__all__ = ["create_key", "keys_page", "policies_page", "revoke_key"]


async def _admin(
    request: Request[Any, Any, Any], security: Security, viewer: Viewer, action: str
) -> None:
    """Refuse (403 page, audited) a viewer without the admin role."""
    if viewer.is_admin:
        return
    await viewed(
        request,
        security,
        viewer,
        action,
        kind="admin.action",
        outcome="denied",
        status=403,
        error_class="permission_denied",
    )
    raise ConsoleError(403, "Only an admin may manage keys: sign in with an admin key.")


async def _keys_page(
    request: Request[Any, Any, Any],
    security: Security,
    viewer: Viewer,
    *,
    created: tuple[str, KeyListing] | None = None,
    message: str = "",
    status: int = 200,
) -> Response[str]:
    records = [KeyListing.of(r) for r in await security.keys.list()]
    context: dict[str, Any] = {
        "keys": records,
        "created": created,
        "message": message,
        "form": {},
        "now": datetime.now(UTC),
    }
    return render_page(request, "keys.html", context, viewer=viewer, status=status)


@get("/keys", name="console.keys")
async def keys_page(
    request: Request[Any, Any, Any],
    security: NamedDependency[Security],
    viewer: NamedDependency[Viewer],
) -> Response[str]:
    """Every key (never a secret), the create form and a revoke button per active key."""
    await _admin(request, security, viewer, "keys.list")
    response = await _keys_page(request, security, viewer)
    await viewed(request, security, viewer, "keys.list", kind="admin.action")
    return response


def _expiry(text: str) -> datetime | None:
    """A date (the key expires at its start, UTC) or a date and time (UTC unless zoned)."""
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ConsoleError(400, "Expires: give a date such as 2027-01-31.") from None
    if len(text) <= 10:
        value = datetime.combine(value.date(), time(0))
    value = value.replace(tzinfo=UTC) if value.tzinfo is None else value
    if value <= datetime.now(UTC):
        raise ConsoleError(400, "Expires: the date is in the past.")
    return value


@post("/keys", name="console.keys_create", status_code=200)
async def create_key(
    request: Request[Any, Any, Any],
    security: NamedDependency[Security],
    viewer: NamedDependency[Viewer],
) -> Response[str]:
    """Create a key; the answer shows its secret once."""
    fields = await form_of(request, security, viewer, "keys.create")
    await _admin(request, security, viewer, "keys.create")
    role = fields.get("role", "")
    team = fields.get("team", "").strip() or None
    name = fields.get("name", "").strip() or None
    all_teams = fields.get("all_teams") == "on"
    try:
        expires_at = _expiry(fields.get("expires", "").strip())
        check_new_key(role, team, name, all_teams)
    except (KeyRefused, ConsoleError) as exc:
        code = exc.code if isinstance(exc, KeyRefused) else "invalid_expiry"
        await viewed(
            request,
            security,
            viewer,
            "keys.create",
            kind="admin.action",
            outcome="failure",
            status=400,
            error_class=code,
        )
        return await _keys_page(request, security, viewer, message=_sentence(exc), status=400)
    key, record = await security.keys.create(
        role,
        team=team,
        name=name,
        expires_at=expires_at,
        created_by=viewer.principal.key_id,
    )
    detail: dict[str, str | int] = {"target": record.key_id, "role": record.role}
    if (scope := audit_scope(record)) is not None:
        detail["audit_scope"] = scope
    await viewed(
        request, security, viewer, "keys.create", kind="admin.action", status=200, detail=detail
    )
    return await _keys_page(request, security, viewer, created=(key, KeyListing.of(record)))


def _sentence(exc: Exception) -> str:
    text = exc.message if isinstance(exc, ConsoleError) else str(exc)
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


@post("/keys/{key_id:str}/revoke", name="console.keys_revoke", status_code=200)
async def revoke_key(
    key_id: FromPath[str],
    request: Request[Any, Any, Any],
    security: NamedDependency[Security],
    viewer: NamedDependency[Viewer],
    console: NamedDependency[Console],
) -> Response[str]:
    """Revoke a key at once (its next request gets 401; its console sessions end)."""
    await form_of(request, security, viewer, "keys.revoke")
    await _admin(request, security, viewer, "keys.revoke")
    known = is_key_id(key_id) and await security.keys.get(key_id) is not None
    revoked = known and await security.keys.revoke(key_id)
    await viewed(
        request,
        security,
        viewer,
        "keys.revoke",
        kind="admin.action",
        outcome="success" if revoked else "failure",
        status=200 if revoked else 404,
        detail={"target": key_id} if known else {},
        error_class=None if revoked else "not_found",
    )
    if not revoked:
        return await _keys_page(
            request, security, viewer, message="There is no such active key.", status=404
        )
    console.sessions.end_key(key_id)
    return await _keys_page(request, security, viewer, message=f"Key {key_id} is revoked.")


def _lint(security: Security) -> tuple[str, list[str]]:
    """What the lint looked at, and its findings."""
    path = security.settings.policy.path
    if path:
        return str(Path(path).name), lint(path)
    shipped = load_default_policy()
    return "the shipped default policy", lint_documents(
        list(zip(shipped.sources, shipped.documents, strict=True))
    )


@get("/policies", name="console.policies")
async def policies_page(
    request: Request[Any, Any, Any],
    security: NamedDependency[Security],
    viewer: NamedDependency[Viewer],
) -> Response[str]:
    """The policy version in force, its documents and rules, and the lint findings."""
    policy = security.policy.current
    linted, findings = _lint(security)
    documents = [
        {
            "source": source,
            "name": doc.name,
            "description": doc.description or "",
            "rules": [msgspec.to_builtins(rule) for rule in doc.rules],
        }
        for source, doc in zip(policy.sources, policy.documents, strict=True)
    ]
    await viewed(request, security, viewer, "console.policies", detail={"findings": len(findings)})
    context: dict[str, Any] = {
        "version": policy.version,
        "documents": documents,
        "linted": linted,
        "findings": findings,
    }
    return render_page(request, "policies.html", context, viewer=viewer)
