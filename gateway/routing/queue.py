"""The gateway's wait queue: bounded, with a timeout, fair between teams.

When every deployment of a model is full, a request waits here instead of failing at once.
Order is round-robin over teams, first-come within a team: a team that sends a burst waits
behind its own requests, not in front of everyone else's.  A team may hold at most `team_share`
of the places (at least one), so one tenant cannot fill the queue.

Only the head (the next ticket in that order) may take a deployment: the router wakes it when
capacity frees up (`notify`), and a request that arrives while others wait queues behind them.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import OrderedDict, deque
from typing import Literal

__all__ = ["GatewayQueue", "QueueRefused", "Ticket"]


class QueueRefused(Exception):
    """No place in the queue: `reason` is "queue_full" or "fair_share"."""

    def __init__(self, reason: Literal["queue_full", "fair_share"]) -> None:
        super().__init__(reason)
        self.reason = reason


class Ticket:
    __slots__ = ("_event", "team")

    def __init__(self, team: str) -> None:
        self.team = team
        self._event = asyncio.Event()

    async def wait(self, seconds: float) -> None:
        """Until notified or `seconds` passed (the caller re-checks either way)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), seconds)
        self._event.clear()


class GatewayQueue:
    def __init__(self, max_size: int, *, team_share: float = 0.5) -> None:
        if max_size < 0 or not 0 < team_share <= 1:
            raise ValueError("max_size must be >= 0 and team_share in (0, 1]")
        self.max_size = max_size
        self.per_team = max(1, math.floor(max_size * team_share))
        self._teams: OrderedDict[str, deque[Ticket]] = OrderedDict()
        self._size = 0

    @property
    def depth(self) -> int:
        return self._size

    def __len__(self) -> int:
        return self._size

    def enter(self, team: str) -> Ticket:
        """A place at the back of `team`'s line; raises QueueRefused when there is none."""
        if self._size >= self.max_size:
            raise QueueRefused("queue_full")
        line = self._teams.get(team)
        if line is not None and len(line) >= self.per_team:
            raise QueueRefused("fair_share")
        ticket = Ticket(team)
        if line is None:
            line = self._teams[team] = deque()
        line.append(ticket)
        self._size += 1
        return ticket

    def head(self) -> Ticket | None:
        for line in self._teams.values():
            return line[0]
        return None

    def is_head(self, ticket: Ticket) -> bool:
        return self.head() is ticket

    def leave(self, ticket: Ticket, *, served: bool) -> None:
        """Remove `ticket` (served, timed out or cancelled).  A served team goes to the back of
        the rotation; the next head is woken to look for capacity in turn."""
        line = self._teams.get(ticket.team)
        if line is None or ticket not in line:
            return
        line.remove(ticket)
        self._size -= 1
        if not line:
            del self._teams[ticket.team]
        elif served:
            self._teams.move_to_end(ticket.team)
        self.notify()

    def notify(self) -> None:
        """Capacity may have freed up: wake the head."""
        head = self.head()
        if head is not None:
            head._event.set()
