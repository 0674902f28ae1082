"""Limiter errors.  One tree; the gateway renders it, nothing else does.

    LimiterError                 anything that stops the limiter deciding
    ├── LimiterUnavailable       the shared store (Redis) did not answer; fail-closed -> 503
    ├── LimitArgumentError       a key or limit the limiter cannot use (our bug -> 500)
    └── TokensExceedLimit        one request reserves more tokens than the token limit ever
                                 admits at once; retrying never helps -> 429 without Retry-After

A refusal by rate (too many requests, tokens or streams *now*) is not an error: `admit`
answers it with `Admission(allowed=False, ...)`.  Messages never contain the principal key,
prompt content or a Redis address.
"""

from __future__ import annotations

__all__ = ["LimitArgumentError", "LimiterError", "LimiterUnavailable", "TokensExceedLimit"]


class LimiterError(Exception):
    """Base of every limiter failure."""


class LimiterUnavailable(LimiterError):
    """The limit store did not answer (refused, timed out, read-only, loading).

    `cause` names the foreign error class for the log; the message stays generic.
    """

    def __init__(self, cause: str = "") -> None:
        super().__init__("the rate limit store is unavailable")
        self.cause = cause


class LimitArgumentError(LimiterError):
    """The gateway passed a key or a limit the limiter cannot use (empty key, rpm <= 0)."""


class TokensExceedLimit(LimiterError):
    """One request needs more tokens than the token limit admits in one burst.

    OpenAI answers this 429 "Request too large ... on tokens per min"; no wait makes it fit.
    """

    def __init__(self, *, requested: int, limit: int) -> None:
        super().__init__(
            f"the request needs {requested} tokens; at most {limit} can be reserved at once"
        )
        self.requested = requested
        self.limit = limit
