"""What a limiter answers (`Admission`) and the interface the gateway calls (`Limiter`).

The gateway calls `admit` once per request, before routing, keyed by the principal (API key
id or JWT subject, never content), and `finish` once the request is over (in a `finally:`),
with the tokens really used, so unused reserved tokens go back and the stream slot is freed.
"""

from __future__ import annotations

from typing import Literal, Protocol

import msgspec

from .gcra import Plan
from .headers import rate_headers, retry_headers

__all__ = ["STREAMS_RETRY_S", "Admission", "Limiter", "Outcome", "Reason", "Ticket", "to_admission"]

Reason = Literal["requests", "tokens", "streams"]

# A stream slot frees when another stream of the key ends; nobody knows when, so a refused
# client is told to come back soon rather than after the slot's TTL.
STREAMS_RETRY_S = 1.0


class Ticket:
    """What `finish` needs to undo an admission: opaque to the gateway.

    Mutable on purpose (the `Admission` holding it is frozen): `claim` flips once, which makes
    `finish` idempotent even when two `finally:` blocks race.
    """

    __slots__ = ("_claimed", "key", "origin", "reserved", "stream", "token_interval_s")

    def __init__(
        self,
        *,
        origin: Literal["redis", "local"],
        key: str,
        reserved: int,
        token_interval_s: float,
        stream: str | None,
    ) -> None:
        self.origin = origin
        self.key = key
        self.reserved = reserved  # tokens reserved (0 when tokens are unlimited)
        self.token_interval_s = token_interval_s  # 0.0 when tokens are unlimited
        self.stream = stream  # the stream slot's id, None when streams are unlimited
        self._claimed = False

    def claim(self) -> bool:
        """True the first time only."""
        first = not self._claimed
        self._claimed = True
        return first


class Admission(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to one `admit`.

    `reason` names the first refused dimension; `retry_after_s` is the wait until every
    refused dimension would admit; `headers` are OpenAI's `x-ratelimit-*` (plus `retry-after`
    and `retry-after-ms` on a refusal) for the limited dimensions; `degraded` is True when a
    fail-open limiter decided locally because Redis did not answer.
    """

    allowed: bool
    reason: Reason | None = None
    retry_after_s: float = 0.0
    headers: dict[str, str] = {}
    degraded: bool = False
    ticket: Ticket | None = None  # None when nothing was reserved


class Limiter(Protocol):
    """Rate and concurrency limits per principal key."""

    async def admit(
        self, key: str, *, rpm: int | None, tpm: int | None, streams: int | None, tokens: int
    ) -> Admission:
        """Reserve one request, `tokens` tokens and (when `streams` is set) one stream slot,
        all or nothing.  `None` means unlimited; `tokens` is max_tokens + the prompt estimate.
        """
        ...

    async def finish(self, admission: Admission, *, used_tokens: int) -> None:
        """Give back reserved-but-unused tokens and the stream slot.  Idempotent."""
        ...


class Outcome(msgspec.Struct, frozen=True):
    """A limiter's raw decision: how far each TAT lies ahead of now after it, the waits of
    refused dimensions, and whether the stream slots were full."""

    allowed: bool
    requests_ahead_s: float = 0.0
    requests_wait_s: float = 0.0
    tokens_ahead_s: float = 0.0
    tokens_wait_s: float = 0.0
    streams_full: bool = False


def to_admission(plan: Plan, outcome: Outcome, ticket: Ticket | None) -> Admission:
    """The `Admission` for a plan and a raw outcome (shared by both limiters)."""
    headers: dict[str, str] = {}
    if plan.requests is not None:
        headers |= rate_headers("requests", plan.requests, outcome.requests_ahead_s)
    if plan.tokens is not None:
        headers |= rate_headers("tokens", plan.tokens, outcome.tokens_ahead_s)
    if outcome.allowed:
        return Admission(allowed=True, headers=headers, ticket=ticket)
    refused: list[tuple[Reason, float]] = []
    if outcome.requests_wait_s > 0:
        refused.append(("requests", outcome.requests_wait_s))
    if outcome.tokens_wait_s > 0:
        refused.append(("tokens", outcome.tokens_wait_s))
    if outcome.streams_full:
        refused.append(("streams", STREAMS_RETRY_S))
    reason = refused[0][0] if refused else "requests"
    retry_after_s = max((wait for _, wait in refused), default=STREAMS_RETRY_S)
    return Admission(
        allowed=False,
        reason=reason,
        retry_after_s=retry_after_s,
        headers=headers | retry_headers(retry_after_s),
    )
