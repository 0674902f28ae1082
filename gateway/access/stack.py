"""The access stack every request goes through, built once from settings and owned by the app.

    Security
    ├── Authenticator   API keys (KeyStore), JWT (offline JWKS), mTLS subjects -> Principal
    │                   (+ LocalTrust: keyless loopback peers of this OS user, if enabled)
    ├── PolicyHolder    the current PolicySet; reloads on SIGHUP, keeps the old one if broken
    ├── Limiter         GCRA in Redis (fail-open to local, or 503) or in process
    └── AuditWriter     the hash-chained audit log (SQLite in the data dir, or PostgreSQL)

`open_security(settings)` is an async context manager: it migrates (SQLite always; PostgreSQL
only with `[audit] migrate = true`), starts the audit writer and closes everything on exit.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from bundles.kms.signer import VerifyKey
from policies import Judge, PolicyError, PolicySet, load_default_policy, load_policy_dir

from ..audit import AuditEvent, AuditUnavailable, AuditWriter
from ..config import Settings
from ..db import create_db_engine, database_url
from ..db.migrate import ensure_schema
from ..errors import ServiceUnavailable
from . import audit_log
from .auth import JwtVerifier, KeyStore, LocalTrust, Principal, SubjectMap
from .limits import FailoverLimiter, Limiter, LocalLimiter, RedisLimiter
from .limits.resp import PipelinedRedis
from .secrets import load_pepper

__all__ = ["PolicyHolder", "Security", "SecurityHolder", "open_security"]

_log = logging.getLogger("airgate.security")


class PolicyHolder:
    """The policy in force, and its `Judge` (decisions memoised per principal and model).
    `reload()` swaps in a new set only if it loads cleanly."""

    def __init__(self, settings: Settings) -> None:
        self._path = settings.policy.path
        self.judge = Judge(self._load())

    @property
    def current(self) -> PolicySet:
        return self.judge.policy

    @current.setter
    def current(self, policy: PolicySet) -> None:
        self.judge = Judge(policy)  # one swap: a request sees the old judge or the new one

    def _load(self) -> PolicySet:
        return load_policy_dir(self._path) if self._path else load_default_policy()

    def reload(self) -> bool:
        """True when a new policy is in force; a broken document keeps the old one."""
        try:
            fresh = self._load()
        except PolicyError as exc:
            _log.error("policy reload refused, keeping version %s: %s", self.current.version, exc)
            return False
        if fresh.version != self.current.version:
            _log.info("policy %s replaces %s", fresh.version, self.current.version)
        self.current = fresh
        return True


@dataclass
class Security:
    settings: Settings
    engine: AsyncEngine
    keys: KeyStore
    jwt: JwtVerifier | None
    subjects: SubjectMap | None
    policy: PolicyHolder
    limiter: Limiter
    audit: AuditWriter
    trusted_audit_keys: list[VerifyKey]  # what verification trusts: pinned keys only
    closers: list[Any] = field(default_factory=list)
    # admitted requests whose end has not run yet (`pipeline.completion.Admitted`)
    open_requests: set[Any] = field(default_factory=set)
    local_trust: LocalTrust | None = None  # `[auth] local_trust`

    def cache_salt(self, principal: Principal) -> str:
        """The prefix-cache salt of the caller's tenant (its team, else its key): engines share
        cached prompt prefixes only within a tenant, so no tenant can time another's prompts
        out of the cache.  Derived from the server's secret pepper, so it cannot be guessed."""
        tenant = principal.team if principal.team else f"key:{principal.key_id}"
        return _salt(self.keys, tenant)

    async def end_open_requests(self) -> None:
        """At shutdown, before the audit log's close checkpoint: end every admitted request
        whose end has not run.  A stream cut while its chunk was being sent (a client gone, or
        the drain's deadline) leaves its generator to the garbage collector, which could run
        the generator's cleanup only after the audit writer has stopped."""
        for request in list(self.open_requests):
            try:
                await request.close()
            except Exception:  # the limiter's refund: Redis may be gone by now
                _log.warning("a request could not be ended at shutdown", exc_info=False)

    @property
    def strict(self) -> bool:
        return self.settings.audit.strict

    async def record(self, event: AuditEvent) -> None:
        """Audit `event`: durable when this returns in strict mode (else queued).  Raises
        ServiceUnavailable when strict mode cannot record it: nothing is answered unaudited."""
        if not self.strict:
            self.audit.append_nowait(event)
            return
        try:
            await self.audit.append(event)
        except AuditUnavailable:
            _log.error("audit log unavailable: refusing the request (strict mode)")
            raise ServiceUnavailable(
                "the audit log is unavailable; no request is served unaudited",
                headers={"Retry-After": "5"},
            ) from None


def _limiter(settings: Settings) -> tuple[Limiter, Any]:
    local = LocalLimiter()
    if not settings.limits.redis_url:
        return local, None
    # short timeouts: an outage must fail over at once, not after seconds (the URL was
    # checked when the settings loaded)
    client = PipelinedRedis(settings.limits.redis_url, timeout_s=0.25, connect_timeout_s=0.25)
    limiter = FailoverLimiter(RedisLimiter(client), local, fail_mode=settings.limits.fail_mode)
    return limiter, client


@asynccontextmanager
async def open_security(settings: Settings) -> AsyncIterator[Security]:
    """Build, migrate and start the access stack; close it on exit."""
    url = database_url(settings.data_dir, settings.audit.database_url)
    Path(settings.data_dir).mkdir(parents=True, exist_ok=True, mode=0o700)  # noqa: ASYNC240
    await ensure_schema(url, migrate=settings.audit.migrate)
    engine = create_db_engine(url, sqlite_synchronous=settings.audit.sqlite_synchronous)
    keys = KeyStore(engine, load_pepper(settings))
    jwt = None
    if (j := settings.auth.jwt) is not None:
        jwt = JwtVerifier(
            j.jwks_file,
            issuer=j.issuer,
            audience=j.audience,
            algorithms=tuple(j.algorithms),
            leeway_s=j.leeway_s,
            team_claim=j.team_claim,
            roles_claim=j.roles_claim,
            role_map=dict(j.role_map) or None,
        )
    subjects = SubjectMap(settings.auth.mtls.subjects) if settings.auth.mtls else None
    limiter, redis_client = _limiter(settings)
    trusted = audit_log.trusted_audit_keys(settings)
    try:
        async with audit_log.open_audit_writer(settings, engine, keys, reconcile=True) as writer:
            security = Security(
                settings,
                engine,
                keys,
                jwt,
                subjects,
                PolicyHolder(settings),
                limiter,
                writer,
                trusted,
                local_trust=LocalTrust.for_this_process() if settings.auth.local_trust else None,
            )
            try:
                yield security
            finally:
                await security.end_open_requests()
    finally:
        await keys.aclose()
        if redis_client is not None:
            await redis_client.aclose()
        await engine.dispose()


class SecurityHolder:
    """The app's access stack, set by the lifespan once it is open (before any request)."""

    security: Security | None = None

    def get(self) -> Security:
        if self.security is None:
            raise RuntimeError("the access stack is not open")
        return self.security


@functools.lru_cache(maxsize=4096)
def _salt(keys: KeyStore, tenant: str) -> str:
    return keys.derive(b"prefix-cache-salt\0" + tenant.encode()).hex()[:32]
