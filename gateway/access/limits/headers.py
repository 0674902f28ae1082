"""OpenAI's rate limit headers, from a GCRA state.

    x-ratelimit-limit-requests       the configured requests per minute
    x-ratelimit-remaining-requests   requests that would be admitted right now (<= the burst)
    x-ratelimit-reset-requests       time until the limit is back to its initial state ("1s")
    (and the same three for -tokens)

On a refusal `retry-after` (whole seconds, rounded up, as HTTP wants) and `retry-after-ms`
(which the OpenAI SDKs prefer) are added.  Durations use OpenAI's (Go's) format: "17ms",
"1s", "1.5s", "6m0s", "1h0m0s".
"""

from __future__ import annotations

import math

from .gcra import Rate

__all__ = ["duration_text", "rate_headers", "retry_headers"]


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


def rate_headers(what: str, rate: Rate, ahead_s: float) -> dict[str, str]:
    """The three headers of one dimension (`what` is "requests" or "tokens")."""
    return {
        f"x-ratelimit-limit-{what}": str(rate.limit),
        f"x-ratelimit-remaining-{what}": str(rate.remaining(ahead_s)),
        f"x-ratelimit-reset-{what}": duration_text(ahead_s),
    }


def retry_headers(retry_after_s: float) -> dict[str, str]:
    """`retry-after` (seconds, at least 1) and `retry-after-ms` for a refusal."""
    return {
        "retry-after": str(max(1, math.ceil(retry_after_s - 1e-6))),
        "retry-after-ms": str(max(1, math.ceil(retry_after_s * 1000 - 1e-6))),
    }
