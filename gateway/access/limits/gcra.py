"""GCRA (the generic cell rate algorithm): the rate rules both limiters share.

A limit of `L` units per minute with burst `B` is kept as one number per key, the theoretical
arrival time (TAT).  Each unit moves the TAT on by the emission interval `I = 60 / L` seconds;
an admission is allowed while the new TAT lies at most `B * I` ahead of now.  So from idle `B`
units pass at once, then one every `I`, and in ANY window of length T at most `B + L/60 * T`
units pass - there is no window boundary to burst across (a fixed window let 19 requests
through in 0.2 s against 10/s).  A refund moves the TAT back, never below now.

Bursts: requests default to `max(1, rpm // 10)`, so a key may send a tenth of its minute at
once; tokens default to the whole minute (`tpm`), because a single request may reserve
`max_tokens` plus its prompt, and a token burst smaller than one request would refuse it
forever.  Both are constructor arguments of the limiters (`request_burst`, `token_burst`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import msgspec

from .errors import LimitArgumentError, TokensExceedLimit

__all__ = [
    "TOLERANCE_S",
    "BurstRule",
    "Plan",
    "Rate",
    "check_key",
    "default_request_burst",
    "default_token_burst",
    "make_plan",
]

# Float rounding over a burst of back-to-back admissions can leave a wait of a few
# nanoseconds; waits up to this are treated as none (the Lua script uses the same value).
TOLERANCE_S = 1e-6
MAX_KEY_LENGTH = 256

BurstRule = Callable[[int], int]


def default_request_burst(rpm: int) -> int:
    """A tenth of the minute at once (at least one request)."""
    return max(1, rpm // 10)


def default_token_burst(tpm: int) -> int:
    """The whole minute at once: one request may reserve up to `tpm` tokens."""
    return tpm


class Rate(msgspec.Struct, frozen=True):
    """One GCRA limit: `limit` units per minute, at most `burst` units at once."""

    limit: int
    burst: int

    @property
    def interval_s(self) -> float:
        """Seconds one unit moves the TAT on."""
        return 60.0 / self.limit

    @property
    def capacity_s(self) -> float:
        """How far ahead of now the TAT may run."""
        return self.burst * self.interval_s

    def wait(self, ahead_s: float, cost: int) -> float:
        """Seconds until `cost` more units fit, given the TAT `ahead_s` ahead of now; 0: now."""
        wait = ahead_s + cost * self.interval_s - self.capacity_s
        return wait if wait > TOLERANCE_S else 0.0

    def admissible(self, ahead_s: float) -> int:
        """Units that would be admitted right now: the largest cost `wait` lets through."""
        return max(0, math.floor((self.capacity_s - ahead_s + TOLERANCE_S) / self.interval_s))


class Plan(msgspec.Struct, frozen=True):
    """What one admission asks for; `None` dimensions are unlimited."""

    requests: Rate | None
    tokens: Rate | None
    streams: int | None
    cost: int

    @property
    def unlimited(self) -> bool:
        return self.requests is None and self.tokens is None and self.streams is None


def check_key(key: str) -> None:
    """A principal key is an id (API key id, JWT subject): short, printable, no braces
    (Redis keys wrap it in a `{...}` hash tag so one script's keys share a cluster slot)."""
    if not key or len(key) > MAX_KEY_LENGTH:
        raise LimitArgumentError(f"a limit key must have 1 to {MAX_KEY_LENGTH} characters")
    if not key.isprintable() or "{" in key or "}" in key:
        raise LimitArgumentError("a limit key must be printable and hold no braces")


def make_plan(
    *,
    rpm: int | None,
    tpm: int | None,
    streams: int | None,
    tokens: int,
    request_burst: BurstRule,
    token_burst: BurstRule,
) -> Plan:
    """Validate one admission's limits and turn them into rates."""
    for name, value in (("rpm", rpm), ("tpm", tpm), ("streams", streams)):
        if value is not None and value < 1:
            raise LimitArgumentError(f"{name} must be at least 1 (None means unlimited)")
    if tokens < 0:
        raise LimitArgumentError("tokens must not be negative")
    requests = None if rpm is None else Rate(rpm, _burst(request_burst, rpm, "request"))
    token_rate = None if tpm is None else Rate(tpm, _burst(token_burst, tpm, "token"))
    if token_rate is not None and tokens > token_rate.burst:
        raise TokensExceedLimit(requested=tokens, limit=token_rate.burst)
    return Plan(requests, token_rate, streams, tokens)


def _burst(rule: BurstRule, limit: int, what: str) -> int:
    burst = rule(limit)
    if burst < 1:
        raise LimitArgumentError(f"the {what} burst rule gave {burst}; it must be at least 1")
    return burst
