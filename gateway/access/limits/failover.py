"""`FailoverLimiter`: Redis first; when Redis does not answer, local limits or a 503.

    fail_mode="open"    admit with the in-process `LocalLimiter`; the admission says
                        `degraded=True` (each replica then limits on its own, so a key may get
                        up to replicas x its limit until Redis is back)
    fail_mode="closed"  raise `LimiterUnavailable` (the gateway answers 503)

While Redis is down it is tried again at most every `probe_interval_s` (a request in between
goes straight to the fallback, or fails fast when closed), and the first answer switches back
to Redis.  `degraded` and the `on_degraded(bool)` callback (called on each switch) feed the
metrics.  Give the Redis client short timeouts and no retries (see `remote`), or every
request waits the full timeout before failing over.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Literal

import msgspec

from .admission import Admission
from .errors import LimitArgumentError, LimiterUnavailable
from .local import LocalLimiter
from .remote import RedisLimiter

__all__ = ["FailoverLimiter"]

_log = logging.getLogger("airgate.limits")


class FailoverLimiter:
    """A `Limiter` over a `RedisLimiter` with a `LocalLimiter` to fall back on."""

    def __init__(
        self,
        primary: RedisLimiter,
        fallback: LocalLimiter,
        *,
        fail_mode: Literal["open", "closed"],
        probe_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        on_degraded: Callable[[bool], None] | None = None,
    ) -> None:
        if fail_mode not in ("open", "closed"):
            raise LimitArgumentError("fail_mode must be 'open' or 'closed'")
        if probe_interval_s < 0:
            raise LimitArgumentError("probe_interval_s must not be negative")
        self._primary = primary
        self._fallback = fallback
        self._fail_mode = fail_mode
        self._probe_interval_s = probe_interval_s
        self._clock = clock
        self._on_degraded = on_degraded
        self._degraded = False
        self._next_probe = 0.0

    @property
    def degraded(self) -> bool:
        """True while Redis is considered down."""
        return self._degraded

    async def admit(
        self, key: str, *, rpm: int | None, tpm: int | None, streams: int | None, tokens: int
    ) -> Admission:
        """See `Limiter.admit`.  Fail-closed while Redis is down: `LimiterUnavailable`."""
        if not self._degraded or self._clock() >= self._next_probe:
            try:
                result = await self._primary.admit(
                    key, rpm=rpm, tpm=tpm, streams=streams, tokens=tokens
                )
            except LimiterUnavailable as exc:
                self._went_down(exc)
            else:
                self._came_back()
                return result
        if self._fail_mode == "closed":
            raise LimiterUnavailable("degraded")
        result = await self._fallback.admit(key, rpm=rpm, tpm=tpm, streams=streams, tokens=tokens)
        return msgspec.structs.replace(result, degraded=True)

    async def finish(self, admission: Admission, *, used_tokens: int) -> None:
        """See `Limiter.finish`; never raises for an outage (it runs in `finally:` blocks):
        a Redis slot then frees at its TTL."""
        ticket = admission.ticket
        if ticket is None:
            return
        if ticket.origin == "local":
            await self._fallback.finish(admission, used_tokens=used_tokens)
            return
        try:
            await self._primary.finish(admission, used_tokens=used_tokens)
        except LimiterUnavailable as exc:
            self._went_down(exc)

    def _went_down(self, exc: LimiterUnavailable) -> None:
        self._next_probe = self._clock() + self._probe_interval_s
        if self._degraded:
            return
        self._degraded = True
        _log.warning(
            "rate limit store unavailable (%s); %s",
            exc.cause or "error",
            "limiting in this process" if self._fail_mode == "open" else "refusing requests",
        )
        if self._on_degraded is not None:
            self._on_degraded(True)

    def _came_back(self) -> None:
        if not self._degraded:
            return
        self._degraded = False
        _log.warning("rate limit store is back; limits are shared again")
        if self._on_degraded is not None:
            self._on_degraded(False)
