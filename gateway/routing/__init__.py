"""Routing: which deployment of a model serves a request (by class, health and load).

`decide.route` is the pure decision; `breaker` the circuit per deployment; `queue` the gateway's
fair wait queue; `router.Router` puts them together for the request pipeline.
"""

from .breaker import CircuitBreaker, CircuitState
from .decide import Candidate, Route, RouteReason, predicted_wait, route
from .metrics import RouterMetrics
from .queue import GatewayQueue, QueueRefused, Ticket
from .router import Lease, Router

__all__ = [
    "Candidate",
    "CircuitBreaker",
    "CircuitState",
    "GatewayQueue",
    "Lease",
    "QueueRefused",
    "Route",
    "RouteReason",
    "Router",
    "RouterMetrics",
    "Ticket",
    "predicted_wait",
    "route",
]
