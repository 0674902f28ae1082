"""API keys in the database: create, authenticate, list, revoke; last use recorded lazily.

`authenticate` is on every request's path, so it does one primary-key SELECT and nothing else:
the `last_used_at` write is throttled (at most one UPDATE per key per interval, remembered in
memory) and done by one background flush task, never awaited by the request.  The owner (the
app's lifespan) calls `aclose()` on shutdown to drain it.

Timing: an unknown key id must cost what a known id with a wrong secret costs, or response
times would tell which ids exist.  Both compute the HMAC of the presented secret and compare it
(an unknown id against a digest no secret has), and a failed attempt is never answered from the
cache: it always costs exactly one SELECT, as an unknown id does (only found rows are cached),
so neither an id's existence nor whether its holder is using it right now (its row cached)
shows.  The SELECT returns one row either way (the key's, or NULLs from an outer join) and only
the columns authentication reads, so the driver decodes the same for both.  Measured with
`python -m bench.key_timing` (median of 2,000 each, a busy 2-core machine): before, an unknown
id cost 0.7-1.3 ms and a wrong secret 0.02 ms (30-100x); now both 0.4-1.0 ms, ratio 0.98-1.02
on SQLite and PostgreSQL.  A success still comes from the cache, and a flood of failures costs
the database what a flood of unknown ids always did: one primary-key SELECT each (concurrent
ones on one id shared).

Revocation: the store that revokes forgets the row at once; every other process (the CLI,
another replica) answers from a row read before the revoking commit for at most `cache_ttl_s`
(1 s) plus one SELECT: a revocation reaches every replica within about a second, against a
promise of 2 s (`tests/e2e/test_revocation_replicas.py` measures it across two servers).  The
price is one primary-key SELECT per busy key per replica per second.  Revocations are not
pushed over Redis pub/sub: the limiter's client (`limits.resp`) matches every reply to a caller
in order, so a pushed message has no place in it; a subscriber would need a connection,
reconnect and resubscribe loop of its own, and the TTL would still be the bound whenever a
message is lost.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import hashlib
import hmac
import logging
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, Final

import msgspec
from sqlalchemy import Row, bindparam, literal, or_, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from . import apikeys
from .errors import (
    AuthConfigError,
    KeyExpired,
    KeyRevoked,
    KeyStoreUnavailable,
    UnknownKey,
    WrongSecret,
)
from .principal import ROLES, Principal
from .schema import UtcDateTime, api_keys

__all__ = ["MAX_LABEL_LENGTH", "ApiKeyRecord", "KeyStore"]

_log = logging.getLogger("airgate.auth")

MAX_LABEL_LENGTH: Final = 128  # team and name
_MAX_CREATED_BY: Final = 300
# Compared against when the id is unknown: no HMAC output is 64 "0"s in practice.
_NO_DIGEST: Final = "0" * 64
_CREATE_ATTEMPTS: Final = 3


class ApiKeyRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A stored key as admins see it: everything but the secret's HMAC."""

    key_id: str
    role: str
    team: str | None
    name: str | None
    created_at: datetime
    created_by: str | None
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None


_RECORD_COLUMNS = [api_keys.c[name] for name in ApiKeyRecord.__struct_fields__]
# A key's row, or one row of NULLs when there is none: a found and an unknown id cost the
# driver the same (one row decoded either way)
_AUTH_COLUMNS = ("key_id", "secret_hmac", "role", "team", "name", "expires_at", "revoked_at")
_KEY_ROW = select(*(api_keys.c[name] for name in _AUTH_COLUMNS)).select_from(
    select(literal(1).label("one"))
    .subquery()
    .outerjoin(api_keys, api_keys.c.key_id == bindparam("b_key_id"))
)


def _record(row: Row[Any]) -> ApiKeyRecord:
    return ApiKeyRecord(**{name: row._mapping[name] for name in ApiKeyRecord.__struct_fields__})


def _utc(value: datetime | None, what: str) -> datetime:
    if value is None:
        return datetime.now(UTC)
    if value.tzinfo is None:
        raise ValueError(f"{what} must be timezone-aware")
    return value


def _label(value: str | None, what: str, limit: int = MAX_LABEL_LENGTH) -> None:
    if value is not None and not 0 < len(value) <= limit:
        raise ValueError(f"{what} must be 1 to {limit} characters")


@contextlib.asynccontextmanager
async def _database() -> AsyncIterator[None]:
    """SQLAlchemy failures become `KeyStoreUnavailable` (a 503, not the caller's fault)."""
    try:
        yield
    except SQLAlchemyError as exc:
        raise KeyStoreUnavailable() from exc


class KeyStore:
    """API keys stored as HMAC-SHA256(pepper, secret) in the `api_keys` table."""

    def __init__(
        self,
        engine: AsyncEngine,
        pepper: bytes,
        *,
        last_used_interval_s: float = 60,
        cache_ttl_s: float = 1.0,
    ) -> None:
        if len(pepper) < 32:
            raise AuthConfigError("the API key pepper must be at least 32 bytes")
        self._engine = engine
        # key id -> (row, monotonic time read): a request re-reads a key at most every
        # `cache_ttl_s`; a revocation through this store takes effect at once, one made by
        # another process (the CLI, another replica) within `cache_ttl_s` (see the module)
        self._cache_ttl = cache_ttl_s
        self._rows: dict[str, tuple[Any, float]] = {}
        self._reads: dict[str, asyncio.Future[Any]] = {}  # key id -> the SELECT in flight
        self._pepper = pepper
        self._interval = last_used_interval_s
        self._last_touch: dict[str, datetime] = {}
        self._pending: dict[str, datetime] = {}
        self._flusher: asyncio.Task[None] | None = None
        self._closed = False

    def derive(self, label: bytes) -> bytes:
        """A secret of this deployment for another purpose: HMAC-SHA256(pepper, label)."""
        return hmac.new(self._pepper, b"airgate-derive\0" + label, hashlib.sha256).digest()

    async def create(
        self,
        role: str,
        team: str | None = None,
        name: str | None = None,
        expires_at: datetime | None = None,
        created_by: str | None = None,
        *,
        now: datetime | None = None,
        key: str | None = None,
    ) -> tuple[str, ApiKeyRecord]:
        """A new key: `(plaintext, record)`.  The plaintext exists only in the return value;
        show it once and drop it (it is neither stored nor logged).  `key`: one the operator
        made offline (`airgate keys new-secret`) to store instead of a fresh one
        (`MalformedKey` if it is not well-formed)."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {sorted(ROLES)}")
        _label(team, "team")
        _label(name, "name")
        _label(created_by, "created_by", _MAX_CREATED_BY)
        if expires_at is not None:
            _utc(expires_at, "expires_at")
        created_at = _utc(now, "now")
        for attempt in range(_CREATE_ATTEMPTS):
            text = key or apikeys.generate_api_key()
            key_id, secret = apikeys.parse_api_key(text)
            record = ApiKeyRecord(
                key_id=key_id,
                role=role,
                team=team,
                name=name,
                created_at=created_at,
                created_by=created_by,
                expires_at=expires_at,
                revoked_at=None,
                last_used_at=None,
            )
            values = msgspec.structs.asdict(record)
            values["secret_hmac"] = apikeys.secret_digest(self._pepper, secret)
            try:
                async with _database(), self._engine.begin() as conn:
                    await conn.execute(api_keys.insert().values(**values))
            except KeyStoreUnavailable as exc:
                # a 71-bit id collision is astronomically unlikely; retry rather than fail
                collided = isinstance(exc.__cause__, IntegrityError) and key is None
                if collided and attempt + 1 < _CREATE_ATTEMPTS:
                    continue
                raise
            return text, record
        raise AssertionError("unreachable")

    async def authenticate(self, text: str, now: datetime | None = None) -> Principal:
        """The principal of an API key, or an `AuthenticationFailed` subclass saying why not:
        `MalformedKey`, `UnknownKey`, `WrongSecret`, `KeyRevoked`, `KeyExpired`."""
        now = _utc(now, "now")
        key_id, secret = apikeys.parse_api_key(text)
        digest = apikeys.secret_digest(self._pepper, secret)
        cached = self._rows.get(key_id)
        from_cache = cached is not None and time.monotonic() - cached[1] < self._cache_ttl
        row = cached[0] if cached is not None and from_cache else await self._read(key_id)
        matched = hmac.compare_digest(digest, row.secret_hmac if row is not None else _NO_DIGEST)
        if not matched and from_cache:
            await self._read(key_id)  # a failure pays the one read an unknown id pays (above)
        if row is None:
            raise UnknownKey()
        if not matched:
            raise WrongSecret()
        if row.revoked_at is not None:
            raise KeyRevoked()
        if row.expires_at is not None and now >= row.expires_at:
            raise KeyExpired()
        self._touch(key_id, now)
        return Principal(
            key_id=key_id,
            method="api_key",
            team=row.team,
            roles=frozenset({row.role}),
            subject=row.name,
            all_teams=row.role == "auditor" and row.team is None,  # a global auditor key
        )

    async def _read(self, key_id: str) -> Any:
        """The key's row from the database (None if unknown), cached for `cache_ttl_s`.
        Concurrent misses on one key share one SELECT: when the cache entry of a busy key
        expires, its in-flight requests do not all query the database at once."""
        while (pending := self._reads.get(key_id)) is not None:
            try:
                return await asyncio.shield(pending)
            except asyncio.CancelledError:
                if not pending.cancelled():
                    raise  # this request was cancelled, not the read
                # the reading request was cancelled: read again (this one may lead)
        read: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._reads[key_id] = read
        try:
            async with _database(), self._engine.connect() as conn:
                row = (await conn.execute(_KEY_ROW, {"b_key_id": key_id})).first()
            if row is not None and row.key_id is None:
                row = None  # the row of NULLs: no such key
        except asyncio.CancelledError:
            read.cancel()
            raise
        except BaseException as exc:
            read.set_exception(exc)
            read.exception()  # retrieved here: no warning when nobody else waited
            raise
        finally:
            del self._reads[key_id]
        if row is not None:
            if len(self._rows) > 100_000:  # bounded: a flood of ids cannot grow it
                self._rows.clear()
            self._rows[key_id] = (row, time.monotonic())
        read.set_result(row)
        return row

    async def get(self, key_id: str) -> ApiKeyRecord | None:
        """One key's record, or None."""
        stmt = select(*_RECORD_COLUMNS).where(api_keys.c.key_id == key_id)
        async with _database(), self._engine.connect() as conn:
            row = (await conn.execute(stmt)).first()
        return None if row is None else _record(row)

    async def list(self) -> builtins.list[ApiKeyRecord]:
        """Every key, oldest first (revoked and expired ones included)."""
        stmt = select(*_RECORD_COLUMNS).order_by(api_keys.c.created_at, api_keys.c.key_id)
        async with _database(), self._engine.connect() as conn:
            rows = (await conn.execute(stmt)).all()
        return [_record(row) for row in rows]

    async def revoke(self, key_id: str, now: datetime | None = None) -> bool:
        """Revoke a key from `now` on; False if it does not exist or was already revoked."""
        now = _utc(now, "now")
        stmt = (
            update(api_keys)
            .where(api_keys.c.key_id == key_id, api_keys.c.revoked_at.is_(None))
            .values(revoked_at=now)
        )
        async with _database(), self._engine.begin() as conn:
            result = await conn.execute(stmt)
        self._rows.pop(key_id, None)
        return result.rowcount == 1

    async def aclose(self) -> None:
        """Stop recording last use and wait for the writes already scheduled."""
        self._closed = True
        await self.drain()

    async def drain(self) -> None:
        """Wait until every scheduled last-used write has been attempted."""
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)

    def _touch(self, key_id: str, now: datetime) -> None:
        if self._closed:
            return
        last = self._last_touch.get(key_id)
        if last is not None and (now - last).total_seconds() < self._interval:
            return
        self._last_touch[key_id] = now
        self._pending[key_id] = now
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(
                self._flush(), name="airgate-api-key-last-used"
            )

    async def _flush(self) -> None:
        # Never moves last_used_at backwards (another replica may have written a later time).
        when = bindparam("b_when", type_=UtcDateTime())
        stmt = (
            update(api_keys)
            .where(
                api_keys.c.key_id == bindparam("b_key_id"),
                or_(api_keys.c.last_used_at.is_(None), api_keys.c.last_used_at < when),
            )
            .values(last_used_at=when)
        )
        while self._pending:
            batch, self._pending = self._pending, {}
            params = [{"b_key_id": key, "b_when": when} for key, when in batch.items()]
            try:
                async with self._engine.begin() as conn:
                    await conn.execute(stmt, params)
            except Exception as exc:
                _log.warning(
                    "could not record the last use of %d API key(s): %s",
                    len(batch),
                    type(exc).__name__,
                )
