"""Rate and concurrency limits per principal: requests/min, tokens/min, concurrent streams.

GCRA (see `gcra`) in Redis on Redis's clock when Redis is configured (`RedisLimiter`), in this
process otherwise (`LocalLimiter`), and both behind `FailoverLimiter` when Redis may fail.
The gateway calls `admit` before routing and `finish` when the request is over; a refusal is
an `Admission(allowed=False)` carrying the 429's `Retry-After` and `x-ratelimit-*` headers.
Nothing here sees content: keys are principal ids, values are numbers.
"""

from .admission import Admission, Limiter, Reason, Ticket
from .errors import LimitArgumentError, LimiterError, LimiterUnavailable, TokensExceedLimit
from .failover import FailoverLimiter
from .gcra import BurstRule, default_request_burst, default_token_burst
from .headers import duration_text
from .local import LocalLimiter
from .remote import RedisLimiter

__all__ = [
    "Admission",
    "BurstRule",
    "FailoverLimiter",
    "LimitArgumentError",
    "Limiter",
    "LimiterError",
    "LimiterUnavailable",
    "LocalLimiter",
    "Reason",
    "RedisLimiter",
    "Ticket",
    "TokensExceedLimit",
    "default_request_burst",
    "default_token_burst",
    "duration_text",
]
