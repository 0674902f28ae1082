"""`LocalLimiter`: the limits kept in this process, for deployments without Redis (laptops,
one replica) and as the fail-open fallback of `FailoverLimiter`.

Same GCRA rules as the Redis script (see `gcra`), on an injectable monotonic clock.  Each call
runs to completion without awaiting, so on one event loop an admission is atomic: no lock is
needed and no other task can see half of one.  State is one TAT per key and dimension plus the
open stream slots; entries that have run back to "idle" are swept as admissions go by.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

from .admission import Admission, Outcome, Ticket, to_admission
from .errors import LimitArgumentError
from .gcra import (
    BurstRule,
    Plan,
    check_key,
    default_request_burst,
    default_token_burst,
    make_plan,
)

__all__ = ["LocalLimiter"]

_SWEEP_EVERY = 1024  # admissions between sweeps of idle keys


class LocalLimiter:
    """In-process limits.  `stream_ttl_s`: a slot never finished (a lost task) frees itself
    after this long, as the Redis slots of a crashed replica do."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        *,
        stream_ttl_s: float = 600.0,
        request_burst: BurstRule = default_request_burst,
        token_burst: BurstRule = default_token_burst,
    ) -> None:
        if stream_ttl_s <= 0:
            raise LimitArgumentError("stream_ttl_s must be positive")
        self._clock = clock
        self._stream_ttl_s = stream_ttl_s
        self._request_burst = request_burst
        self._token_burst = token_burst
        self._requests: dict[str, float] = {}  # key -> TAT
        self._tokens: dict[str, float] = {}  # key -> TAT
        self._streams: dict[str, dict[str, float]] = {}  # key -> slot id -> expiry
        self._slot_ids = itertools.count(1)
        self._since_sweep = 0

    async def admit(
        self, key: str, *, rpm: int | None, tpm: int | None, streams: int | None, tokens: int
    ) -> Admission:
        """See `Limiter.admit`."""
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
        return self._admit(key, plan)

    async def finish(self, admission: Admission, *, used_tokens: int) -> None:
        """See `Limiter.finish`.  Tokens used beyond the reservation are charged (the prompt
        estimate was low); tokens reserved but unused go back, never below now."""
        if used_tokens < 0:
            raise LimitArgumentError("used_tokens must not be negative")
        ticket = admission.ticket
        if ticket is None:
            return
        if ticket.origin != "local":
            raise LimitArgumentError("this admission was not made by a LocalLimiter")
        if not ticket.claim():
            return
        now = self._clock()
        delta = used_tokens - ticket.reserved
        if ticket.token_interval_s and delta:
            tat = max(self._tokens.get(ticket.key, now), now) + delta * ticket.token_interval_s
            if tat > now:
                self._tokens[ticket.key] = tat
            else:
                self._tokens.pop(ticket.key, None)
        if ticket.stream is not None:
            slots = self._streams.get(ticket.key)
            if slots is not None:
                slots.pop(ticket.stream, None)

    def _admit(self, key: str, plan: Plan) -> Admission:
        now = self._clock()
        self._sweep(now)
        req_ahead = req_wait = tok_ahead = tok_wait = 0.0
        if plan.requests is not None:
            req_ahead = max(self._requests.get(key, now) - now, 0.0)
            req_wait = plan.requests.wait(req_ahead, 1)
        if plan.tokens is not None:
            tok_ahead = max(self._tokens.get(key, now) - now, 0.0)
            tok_wait = plan.tokens.wait(tok_ahead, plan.cost)
        full = False
        slots = self._streams.get(key, {})
        if plan.streams is not None:
            for slot, expiry in list(slots.items()):
                if expiry <= now:
                    del slots[slot]
            full = len(slots) >= plan.streams
        allowed = not (req_wait or tok_wait or full)
        ticket = None
        if allowed:
            if plan.requests is not None:
                req_ahead += plan.requests.interval_s
                self._requests[key] = now + req_ahead
            stream = None
            if plan.streams is not None:
                stream = str(next(self._slot_ids))
                slots[stream] = now + self._stream_ttl_s
                self._streams[key] = slots
            token_interval_s = 0.0
            if plan.tokens is not None:
                token_interval_s = plan.tokens.interval_s
                tok_ahead += plan.cost * token_interval_s
                if tok_ahead > 0:
                    self._tokens[key] = now + tok_ahead
            if plan.tokens is not None or stream is not None:
                ticket = Ticket(
                    origin="local",
                    key=key,
                    reserved=plan.cost if plan.tokens is not None else 0,
                    token_interval_s=token_interval_s,
                    stream=stream,
                )
        outcome = Outcome(allowed, req_ahead, req_wait, tok_ahead, tok_wait, full)
        return to_admission(plan, outcome, ticket)

    def _sweep(self, now: float) -> None:
        """Forget keys whose TATs have run out and whose slots have all expired."""
        self._since_sweep += 1
        if self._since_sweep < _SWEEP_EVERY:
            return
        self._since_sweep = 0
        for tats in (self._requests, self._tokens):
            for key in [k for k, tat in tats.items() if tat <= now]:
                del tats[key]
        for key in [k for k, s in self._streams.items() if all(e <= now for e in s.values())]:
            del self._streams[key]
