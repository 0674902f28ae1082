"""`RedisLimiter`: limits shared by every replica, kept in Redis by one atomic Lua script.

The client is the gateway's `PipelinedRedis` (`limits.resp`: one pipelined connection,
about a tenth of redis-py's CPU per call), or any client with redis-py's `evalsha` and
`script_load` that raises redis-py's exceptions (tests use redis-py's own).  Give it short
timeouts and no client-side retries, so an outage is noticed in a fraction of a second and
`FailoverLimiter` can act (redis-py's defaults are a 5 s socket timeout and 10 retries)::

    limiter = RedisLimiter(PipelinedRedis(url, timeout_s=0.25, connect_timeout_s=0.25))

Keys: `<prefix>{<principal key>}:r` (request TAT), `:t` (token TAT), `:s` (stream slots).  The
braces are a cluster hash tag, so one script's three keys live in one slot.  Values are
numbers only; every key expires on its own (a TAT when it is reached, the slots after
`stream_ttl_s`, so a crashed replica's slots free themselves).

The script is called with EVALSHA and loaded with SCRIPT LOAD when Redis answers NOSCRIPT
(first use, a restart, a failover to a replica, SCRIPT FLUSH).  Every Redis error becomes
`LimiterUnavailable` in one place, `_redis_errors`.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from typing import Any, Protocol

from redis import exceptions as redis_errors

from ._lua import SCRIPT, SCRIPT_SHA
from .admission import Admission, Outcome, Ticket, to_admission
from .errors import LimitArgumentError, LimiterUnavailable
from .gcra import BurstRule, check_key, default_request_burst, default_token_burst, make_plan

__all__ = ["RedisLimiter"]


@contextlib.contextmanager
def _redis_errors() -> Iterator[None]:
    """Redis failures (refused, timed out, read-only, loading, script errors) as one error."""
    try:
        yield
    except redis_errors.RedisError as exc:
        raise LimiterUnavailable(type(exc).__name__) from exc


class RedisClient(Protocol):
    """What the limiter needs of a Redis client (redis-py's signatures and exceptions)."""

    async def evalsha(self, sha: str, numkeys: int, *args: str) -> Any: ...

    async def script_load(self, script: str) -> Any: ...


class RedisLimiter:
    """Limits in Redis, on Redis's clock; see the module docstring for the client settings."""

    def __init__(
        self,
        redis: RedisClient,
        *,
        prefix: str = "airgate:rl:",
        stream_ttl_s: float = 600.0,
        request_burst: BurstRule = default_request_burst,
        token_burst: BurstRule = default_token_burst,
    ) -> None:
        if stream_ttl_s <= 0:
            raise LimitArgumentError("stream_ttl_s must be positive")
        if "{" in prefix or "}" in prefix:
            raise LimitArgumentError("the key prefix must hold no braces (hash tag)")
        self._redis = redis
        self._prefix = prefix
        self._stream_ttl_s = stream_ttl_s
        self._request_burst = request_burst
        self._token_burst = token_burst

    async def admit(
        self, key: str, *, rpm: int | None, tpm: int | None, streams: int | None, tokens: int
    ) -> Admission:
        """See `Limiter.admit`.  Raises `LimiterUnavailable` when Redis does not answer."""
        check_key(key)
        plan = make_plan(
            rpm=rpm,
            tpm=tpm,
            streams=streams,
            tokens=tokens,
            request_burst=self._request_burst,
            token_burst=self._token_burst,
        )
        if plan.unlimited:
            return Admission(allowed=True)
        slot = str(secrets.randbits(62)) if plan.streams is not None else ""
        req_interval = plan.requests.interval_s if plan.requests else 0.0
        req_capacity = plan.requests.capacity_s if plan.requests else 0.0
        tok_interval = plan.tokens.interval_s if plan.tokens else 0.0
        tok_capacity = plan.tokens.capacity_s if plan.tokens else 0.0
        reply = await self._call(
            key,
            "admit",
            repr(req_interval),
            repr(req_capacity),
            repr(tok_interval),
            repr(tok_capacity),
            str(plan.cost),
            str(plan.streams or 0),
            repr(self._stream_ttl_s),
            slot,
        )
        if not isinstance(reply, list) or len(reply) != 6:
            raise LimiterUnavailable("unexpected script reply")
        allowed, req_ahead, req_wait, tok_ahead, tok_wait, full = reply
        outcome = Outcome(
            allowed=int(allowed) == 1,
            requests_ahead_s=float(req_ahead),
            requests_wait_s=float(req_wait),
            tokens_ahead_s=float(tok_ahead),
            tokens_wait_s=float(tok_wait),
            streams_full=int(full) == 1,
        )
        ticket = None
        if outcome.allowed and (plan.tokens is not None or plan.streams is not None):
            ticket = Ticket(
                origin="redis",
                key=key,
                reserved=plan.cost if plan.tokens is not None else 0,
                token_interval_s=tok_interval,
                stream=slot or None,
            )
        return to_admission(plan, outcome, ticket)

    async def finish(self, admission: Admission, *, used_tokens: int) -> None:
        """See `Limiter.finish`.  Tokens used beyond the reservation are charged (the prompt
        estimate was low).  If Redis does not answer, the ticket stays claimed: the slot
        then frees at its TTL and the unused tokens at the TAT, erring on the strict side."""
        if used_tokens < 0:
            raise LimitArgumentError("used_tokens must not be negative")
        ticket = admission.ticket
        if ticket is None:
            return
        if ticket.origin != "redis":
            raise LimitArgumentError("this admission was not made by a RedisLimiter")
        if not ticket.claim():
            return
        delta = used_tokens - ticket.reserved if ticket.token_interval_s else 0
        await self._call(
            ticket.key, "finish", repr(ticket.token_interval_s), str(delta), ticket.stream or ""
        )

    def keys(self, key: str) -> tuple[str, str, str]:
        """The Redis keys of one principal: request TAT, token TAT, stream slots."""
        base = f"{self._prefix}{{{key}}}"
        return f"{base}:r", f"{base}:t", f"{base}:s"

    async def _call(self, key: str, *args: str) -> Any:
        """EVALSHA the script; load it on NOSCRIPT and call again."""
        keys = self.keys(key)
        with _redis_errors():
            try:
                reply = await self._redis.evalsha(SCRIPT_SHA, len(keys), *keys, *args)
            except redis_errors.NoScriptError:
                await self._redis.script_load(SCRIPT)
                reply = await self._redis.evalsha(SCRIPT_SHA, len(keys), *keys, *args)
        return reply
