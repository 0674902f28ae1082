"""OpenAI's rate limit headers, from a GCRA state.

    x-ratelimit-limit-requests       the configured requests per minute, L
    x-ratelimit-remaining-requests   of those L, how many remain (see below)
    x-ratelimit-reset-requests       time until the limit is back to its initial state ("1s")
    (and the same three for -tokens)

What remaining means.  OpenAI's limit is a bucket of L units that refills at L per minute:
remaining is L less what is in use, and reset the time until the bucket is full again.  GCRA
keeps the same account as one number: the TAT lies `a` seconds ahead of now, and
`debt = a / I` (I = 60 / L) is the number of units taken ahead of the steady pace and not yet
refilled.  So remaining = L - ceil(debt), refilling one unit every I seconds and back to L
exactly when reset (= a) reaches 0; a fresh key's first request reads L - 1 (599 of 600), a
request reserving 600 of 6000 tokens reads 5400.  Over the next minute GCRA admits up to
B + L - debt units (the rest of the burst now, then one every I), so the L - ceil(debt)
promised are there to be had within the minute.

What differs from OpenAI's bucket is the burst: GCRA lets only B of the L be taken at once
(requests default to B = L / 10, tokens to B = L).  A reservation of `cost` units is admitted
while `debt <= B - cost`, so once not even one more unit fits now, remaining is 0 instead of
L - ceil(debt): a request sent while remaining-requests > 0 passes the request limit, and a
429 refused on requests reads remaining-requests 0.  For tokens with B = L, remaining is
exactly what may be reserved now: a reservation passes the token limit iff it is at most
remaining-tokens.
In one formula, with `now` = the units admitted right now (`Rate.admissible`, the rest of the
burst):

    remaining = 0                              when now = 0
              = min(L, now + max(0, L - B))    otherwise; = L - ceil(debt) when B <= L

(min(L, ...) keeps a burst larger than the minute from reading above the limit.)  Both
limiters feed it the same number, `a` after this request (or unchanged by a refusal), from the
local TATs or the Lua script's reply.

On a refusal `retry-after` (whole seconds, rounded up, as HTTP wants) and `retry-after-ms`
(which the OpenAI SDKs prefer) are added: the wait until the refused request fits, usually far
shorter than reset.  Durations use OpenAI's (Go's) format: "17ms", "1s", "1.5s", "6m0s",
"1h0m0s".
"""

from __future__ import annotations

import math

from .gcra import Rate

__all__ = ["duration_text", "rate_headers", "remaining", "retry_headers"]


def duration_text(seconds: float) -> str:
    """A duration as OpenAI writes reset times, rounded up to a whole millisecond."""
    ms = math.ceil(seconds * 1000 - 1e-6)
    if ms <= 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest // 1000}.{rest % 1000:03d}".rstrip("0").rstrip(".")
    head = (f"{hours}h" if hours else "") + (f"{minutes}m" if hours or minutes else "")
    return f"{head}{secs}s"


def remaining(rate: Rate, ahead_s: float) -> int:
    """Of the limit's units per minute, how many remain, given the TAT `ahead_s` ahead of now
    (after this request, or unchanged on a refusal); see the module docstring."""
    now = rate.admissible(ahead_s)
    if now == 0:
        return 0
    return min(rate.limit, now + max(0, rate.limit - rate.burst))


def rate_headers(what: str, rate: Rate, ahead_s: float) -> dict[str, str]:
    """The three headers of one dimension (`what` is "requests" or "tokens")."""
    return {
        f"x-ratelimit-limit-{what}": str(rate.limit),
        f"x-ratelimit-remaining-{what}": str(remaining(rate, ahead_s)),
        f"x-ratelimit-reset-{what}": duration_text(ahead_s),
    }


def retry_headers(retry_after_s: float) -> dict[str, str]:
    """`retry-after` (seconds, at least 1) and `retry-after-ms` for a refusal."""
    return {
        "retry-after": str(max(1, math.ceil(retry_after_s - 1e-6))),
        "retry-after-ms": str(max(1, math.ceil(retry_after_s * 1000 - 1e-6))),
    }
