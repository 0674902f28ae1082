"""A circuit breaker per deployment.

    closed     requests flow; `failure_threshold` consecutive failures open it
    open       no request for `open_s` seconds
    half_open  after `open_s`, exactly one request (the probe) goes through: its success closes
               the circuit, its failure opens it for another `open_s`

A failure is the deployment's fault (the engine failed or died), never the client's (a bad
parameter, a context-length error) nor plain load (a full queue): the router decides which.
The clock is passed in, so tests drive time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

__all__ = ["CircuitBreaker", "CircuitState"]

CircuitState = Literal["closed", "open", "half_open"]


class CircuitBreaker:
    __slots__ = ("_clock", "_failures", "_opened_at", "_probing", "failure_threshold", "open_s")

    def __init__(
        self,
        *,
        failure_threshold: int = 5,
        open_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failure_threshold < 1 or open_s < 0:
            raise ValueError("failure_threshold must be >= 1 and open_s >= 0")
        self.failure_threshold = failure_threshold
        self.open_s = open_s
        self._clock = clock
        self._failures = 0
        self._opened_at: float | None = None
        self._probing = False

    @property
    def state(self) -> CircuitState:
        if self._opened_at is None:
            return "closed"
        if self._probing or self._clock() - self._opened_at >= self.open_s:
            return "half_open"
        return "open"

    def available(self) -> bool:
        """Whether a request may be sent now (without taking the half-open probe)."""
        state = self.state
        return state == "closed" or (state == "half_open" and not self._probing)

    def acquire(self) -> bool:
        """Take the right to send one request: always when closed; when half-open, only the
        first caller (the probe) until it reports."""
        state = self.state
        if state == "closed":
            return True
        if state == "half_open" and not self._probing:
            self._probing = True
            return True
        return False

    def retry_after_s(self) -> float:
        """Seconds until the circuit lets a probe through (0 when it does now)."""
        if self._opened_at is None or self._probing:
            return 0.0
        return max(0.0, self.open_s - (self._clock() - self._opened_at))

    def success(self) -> None:
        self._failures = 0
        self._opened_at = None
        self._probing = False

    def failure(self) -> None:
        if self._probing or self._opened_at is not None:
            self._opened_at = self._clock()  # the probe failed: open again for open_s
            self._probing = False
            return
        self._failures += 1
        if self._failures >= self.failure_threshold:
            self._opened_at = self._clock()

    def release_probe(self) -> None:
        """The probe ended without telling anything about health (client error, cancel)."""
        self._probing = False
