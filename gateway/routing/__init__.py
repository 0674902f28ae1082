"""Routing: which deployment of a model serves a request (by class, health and load).

`decide.route` is the pure decision; `queue` the gateway's fair wait queue; `router.Router` puts
them together for the request pipeline, reading each deployment's load and circuit
(`gateway.engines.breaker`, owned by the deployment).
"""

from .decide import Candidate, Route, RouteReason, predicted_wait, route
from .metrics import RouterMetrics
from .queue import GatewayQueue, QueueRefused, Ticket
from .router import Lease, Router

__all__ = [
    "Candidate",
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
