"""API keys outside the HTTP API: the first admin key, the `airgate keys` commands' core (each
operation audited), and the rules the admin API shares with them.

The first admin key is made by the first `serve` on a database without an active admin key,
audited as `airgate keys create` is: either the key the operator made offline (`airgate keys
new-secret`) and mounted as `[auth] initial_admin_key_file`, of which only the hash is stored
and nothing is shown; or a fresh one, handed to the operator once (the CLI prints it on a
terminal, else writes it to a 0600 file: never to a log).

A new key's scope (see `auth/principal.py`): an auditor key is created either for one team
(`team`: it reads only that team's audit events) or for every team (`all_teams`, stored without
a team); asking for neither is refused, so a global auditor is never made by omission.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Literal

from sqlalchemy.ext.asyncio import AsyncEngine

from ..audit import AuditError, AuditEvent, AuditPrincipal, AuditWriter, Outcome, new_event_id
from ..config import ConfigError, Settings
from ..db import create_db_engine, database_url
from ..db.migrate import ensure_schema
from .audit_log import open_audit_writer
from .auth import ROLES, ApiKeyRecord, KeyStore, MalformedKey, parse_api_key
from .auth.apikeys import is_key_id
from .secrets import load_pepper, secret_path

__all__ = [
    "AuditScope",
    "KeyAdmin",
    "KeyListing",
    "KeyRefused",
    "audit_scope",
    "bootstrap_admin_key",
    "check_new_key",
    "key_admin",
    "key_store",
]

# team and key names: what the audit log can carry as an identifier (as the admin API takes)
_NAME: Final = re.compile(r"[A-Za-z0-9_.:@/+-]{1,64}", re.ASCII)
AuditScope = Literal["all_teams", "team"]


class KeyRefused(Exception):
    """A key that cannot be made as asked: `param` names the field, `code` goes to the audit
    log; the message is ours (it never repeats a value)."""

    def __init__(self, message: str, *, param: str, code: str) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


def check_new_key(role: str, team: str | None, name: str | None, all_teams: bool) -> None:
    """Refuse (`KeyRefused`) a key the rules do not allow; see the module docstring."""
    if role not in ROLES:
        raise KeyRefused("role must be app, auditor or admin", param="role", code="invalid_role")
    for param, value in (("team", team), ("name", name)):
        if value is not None and _NAME.fullmatch(value) is None:
            raise KeyRefused(
                f"{param} must be 1 to 64 of A-Z a-z 0-9 _ . : @ / + -",
                param=param,
                code=f"invalid_{param}",
            )
    if all_teams and role != "auditor":
        raise KeyRefused("all_teams is for auditor keys", param="all_teams", code="invalid_scope")
    if all_teams and team is not None:
        raise KeyRefused(
            "an auditor of all teams has no team: give team or all_teams, not both",
            param="team",
            code="invalid_scope",
        )
    if role == "auditor" and team is None and not all_teams:
        raise KeyRefused(
            "an auditor key needs a team (it reads only that team's audit events) or "
            "all_teams (it reads every team's)",
            param="team",
            code="missing_scope",
        )


def audit_scope(record: ApiKeyRecord) -> AuditScope | None:
    """Whose audit events the key reads: every team's, its team's, or none (an app key)."""
    if record.role == "admin" or (record.role == "auditor" and record.team is None):
        return "all_teams"
    return "team" if record.role == "auditor" else None


class KeyListing(ApiKeyRecord, frozen=True, kw_only=True):
    """A key as `keys list` and `GET /admin/keys` show it: the record and its audit scope."""

    audit_scope: AuditScope | None

    @classmethod
    def of(cls, record: ApiKeyRecord) -> KeyListing:
        fields = {name: getattr(record, name) for name in ApiKeyRecord.__struct_fields__}
        return cls(**fields, audit_scope=audit_scope(record))


@asynccontextmanager
async def _database(settings: Settings) -> AsyncIterator[tuple[AsyncEngine, KeyStore]]:
    url = database_url(settings.data_dir, settings.audit.database_url)
    Path(settings.data_dir).mkdir(parents=True, exist_ok=True, mode=0o700)  # noqa: ASYNC240
    await ensure_schema(url, migrate=settings.audit.migrate)
    engine = create_db_engine(url)
    store = KeyStore(engine, load_pepper(settings))
    try:
        yield engine, store
    finally:
        await store.aclose()
        await engine.dispose()


@asynccontextmanager
async def key_store(settings: Settings) -> AsyncIterator[KeyStore]:
    """The key store of this configuration's database (migrated first, as `serve` would)."""
    async with _database(settings) as (_, store):
        yield store


class KeyAdmin:
    """The `airgate keys` operations, each appended to the audit log as an `admin.action` by
    `actor` (method `cli`, the OS user): the same record the admin API leaves.  An operation
    the log cannot record raises `AuditError`; a key made meanwhile is revoked first."""

    def __init__(self, store: KeyStore, writer: AuditWriter, actor: str) -> None:
        self.store = store
        self._writer = writer
        self._actor = actor

    async def _record(
        self,
        action: str,
        outcome: Outcome,
        *,
        error_class: str | None = None,
        detail: dict[str, str | int] | None = None,
    ) -> None:
        await self._writer.append(
            AuditEvent(
                event_id=new_event_id(),
                ts=datetime.now(UTC),
                kind="admin.action",
                outcome=outcome,
                principal=AuditPrincipal(subject=self._actor, method="cli"),
                action=action,
                error_class=error_class,
                detail=detail or {},
            )
        )

    async def create(
        self,
        role: str,
        *,
        team: str | None = None,
        name: str | None = None,
        expires_at: datetime | None = None,
        all_teams: bool = False,
        key: str | None = None,
    ) -> tuple[str, ApiKeyRecord]:
        """A new key `(plaintext, record)` (`key`: the operator's own, else a fresh one);
        `KeyRefused` (audited) when the rules forbid it."""
        try:
            check_new_key(role, team, name, all_teams)
        except KeyRefused as exc:
            await self._record("keys.create", "failure", error_class=exc.code)
            raise
        text, record = await self.store.create(
            role,
            team=team,
            name=name,
            expires_at=expires_at,
            created_by=f"cli:{self._actor}",
            key=key,
        )
        detail: dict[str, str | int] = {"target": record.key_id, "role": record.role}
        if (scope := audit_scope(record)) is not None:
            detail["audit_scope"] = scope
        try:
            await self._record("keys.create", "success", detail=detail)
        except AuditError:
            await self.store.revoke(record.key_id)  # no key without its audit record
            raise
        return text, record

    async def revoke(self, key_id: str) -> bool:
        """Revoke a key; False (audited as a failure) if there is no such active key."""
        known = is_key_id(key_id) and await self.store.get(key_id) is not None
        revoked = known and await self.store.revoke(key_id)
        await self._record(
            "keys.revoke",
            "success" if revoked else "failure",
            error_class=None if revoked else "not_found",
            detail={"target": key_id} if known else {},
        )
        return revoked

    async def list(self) -> builtins.list[KeyListing]:
        """Every key, with its audit scope."""
        records = await self.store.list()
        await self._record("keys.list", "success", detail={"count": len(records)})
        return [KeyListing.of(r) for r in records]


@asynccontextmanager
async def key_admin(settings: Settings, actor: str) -> AsyncIterator[KeyAdmin]:
    """Audited key operations on this configuration's database, by `actor` (a Subject: printable
    ASCII without spaces, at most 256 characters)."""
    async with (
        _database(settings) as (engine, store),
        open_audit_writer(settings, engine, store) as writer,
    ):
        yield KeyAdmin(store, writer, actor)


async def bootstrap_admin_key(
    settings: Settings, actor: str, hand_over: Callable[[str], None]
) -> bool:
    """On a database without an active admin key, make the first one (see the module), by
    `actor`; a fresh key goes to `hand_over`, and is revoked if that fails.  True when a key
    was made.  `ConfigError` for an unusable `initial_admin_key_file`."""
    async with key_store(settings) as store:
        if any(r.role == "admin" and r.revoked_at is None for r in await store.list()):
            return False
        given = _initial_admin_key(settings)
        if given is not None and await store.get(parse_api_key(given)[0]) is not None:
            raise ConfigError(
                "[auth] initial_admin_key_file holds a key this database knows already (revoked, "
                "or not an admin key): mount a new one (`airgate keys new-secret`)"
            )
    async with key_admin(settings, actor) as admin:
        text, record = await admin.create("admin", name="first-admin", key=given)
        if given is None:
            try:
                hand_over(text)
            except BaseException:
                await admin.revoke(record.key_id)  # nobody has it: it must not stay valid
                raise
    return True


def _initial_admin_key(settings: Settings) -> str | None:
    """The key in `[auth] initial_admin_key_file`, if set; errors name the file, never the
    text."""
    if not settings.auth.initial_admin_key_file:
        return None
    path = secret_path(settings.auth.initial_admin_key_file)
    try:
        text = path.read_text(encoding="ascii").strip()
        parse_api_key(text)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"[auth] initial_admin_key_file {path} cannot be read ({type(exc).__name__})"
        ) from None
    except MalformedKey:
        raise ConfigError(
            f"[auth] initial_admin_key_file {path} does not hold an airgate API key "
            "(make one with `airgate keys new-secret`)"
        ) from None
    return text
