"""`route()`: one pure function from the deployments' state to where a request goes.

    keep     deployments whose class the policy allows, that are not excluded (a retry) and
             whose circuit lets a request through
    free     a deployment with a free sequence slot: (running + waiting) < capacity
    choose   1. a free gpu deployment, least predicted wait         reason "gpu"
             2. a free edge deployment, least predicted wait        reason "overflow" when a
                                                                    healthy gpu deployment is
                                                                    saturated, else "edge"
             3. any deployment whose own queue has room             reason "engine_queue"
                ((running + waiting) < capacity + max_queue), least predicted wait
             4. nothing has room: wait at the gateway               reason "saturated"
             nothing healthy: 503                                   reason "unavailable"
             nothing allowed or left after exclusion                reason "no_deployment"

Predicted wait = (running + waiting) / (capacity * weight): the requests ahead of this one per
sequence slot, a weight above 1 making a deployment look faster than its slot count says.  Ties
go to gpu, then to the larger weight, then by name, so a decision is reproducible.

No clock, no I/O, no randomness: the router feeds it a snapshot and acts on the answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

import msgspec

from policies import EngineClass

__all__ = ["Candidate", "Route", "RouteReason", "predicted_wait", "route"]

RouteReason = Literal[
    "gpu", "edge", "overflow", "engine_queue", "saturated", "unavailable", "no_deployment"
]


class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    """One deployment as the router sees it at this instant."""

    name: str
    engine_class: EngineClass
    running: int  # sequences generating now
    waiting: int  # accepted, waiting for a slot (inside the engine or assigned by the gateway)
    capacity: int  # sequences that run at once
    max_queue: int  # requests that may wait inside the engine beyond `capacity`
    weight: float = 1.0
    healthy: bool = True  # the circuit breaker lets a request through

    @property
    def busy(self) -> int:
        return self.running + self.waiting


class Route(msgspec.Struct, frozen=True):
    """Where to send the request: `deployment` None means wait (`saturated`) or fail."""

    deployment: str | None
    reason: RouteReason


def predicted_wait(c: Candidate) -> float:
    return c.busy / (max(c.capacity, 1) * c.weight)


def _best(pool: Iterable[Candidate]) -> Candidate:
    return min(
        pool,
        key=lambda c: (predicted_wait(c), c.engine_class != "gpu", -c.weight, c.name),
    )


def route(
    candidates: Sequence[Candidate],
    allowed: frozenset[EngineClass] | set[EngineClass],
    exclude: frozenset[str] = frozenset(),
) -> Route:
    pool = [c for c in candidates if c.engine_class in allowed and c.name not in exclude]
    if not pool:
        return Route(None, "no_deployment")
    healthy = [c for c in pool if c.healthy]
    if not healthy:
        return Route(None, "unavailable")
    free = [c for c in healthy if c.busy < c.capacity]
    gpu = [c for c in free if c.engine_class == "gpu"]
    if gpu:
        return Route(_best(gpu).name, "gpu")
    if free:
        saturated_gpu = any(c.engine_class == "gpu" for c in healthy)
        return Route(_best(free).name, "overflow" if saturated_gpu else "edge")
    roomy = [c for c in healthy if c.busy < c.capacity + c.max_queue]
    if roomy:
        return Route(_best(roomy).name, "engine_queue")
    return Route(None, "saturated")
