"""The router: per request, a deployment of the model (or a wait at the gateway, or an error).

    acquire()  snapshot every deployment (engine load, the router's own in-flight count,
               circuit) -> decide.route() -> a Lease on the chosen deployment
               saturated -> wait in the model's GatewayQueue (fair, bounded, timed) -> 429
               nothing healthy -> 503 with Retry-After (when the next probe may go)
    Lease      ok() / failed() report the deployment's health to its breaker; release() frees
               the place and wakes the queue (exactly once, whatever happened)

The engine's own counters lag (vLLM reports scheduler stats once per step), so a deployment's
load is the larger of what the engine reports and what the router has sent it and not yet seen
finish: two requests arriving together never both see the same free slot.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from policies import EngineClass

from ..config import RoutingSettings
from ..errors import Overloaded, PolicyDenied, ServiceUnavailable
from .decide import Candidate, Route, RouteReason, route
from .metrics import RouterMetrics
from .queue import GatewayQueue, QueueRefused

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from ..engines.registry import Deployment, ModelRegistry, ServedModel

__all__ = ["Lease", "Router"]

_RECHECK_S = 0.25  # a waiting head also looks again this often (a breaker's timer may lapse)


class Lease:
    """One request's claim on a deployment."""

    __slots__ = ("_router", "_state", "deployment", "queued_s", "reason")

    def __init__(
        self, router: Router, deployment: Deployment, reason: RouteReason, queued_s: float
    ) -> None:
        self._router = router
        self.deployment = deployment
        self.reason = reason
        self.queued_s = queued_s
        self._state = 0  # 0: open, 1: health reported, 2: released

    def ok(self) -> None:
        """The deployment answered (first token or a clean finish): it is healthy."""
        if self._state == 0:
            self._state = 1
            self.deployment.breaker.success()

    def failed(self) -> None:
        """The deployment failed this request (its fault, not the client's)."""
        if self._state == 0:
            self._state = 1
            self.deployment.breaker.failure()

    def release(self) -> None:
        if self._state == 2:
            return
        if self._state == 0:  # ended without telling anything about health (client, cancel)
            self.deployment.breaker.release_probe()
        self._state = 2
        self.deployment.inflight -= 1
        self._router.notify(self.deployment)


class Router:
    """Routes requests to the deployments of `models`: a gateway queue per model; each
    deployment's own circuit breaker (made with the deployment, see `Deployment`).

    With a Prometheus `registry` the router registers its `airgate_router_*` series there;
    without one (tests) it keeps no metrics.
    """

    def __init__(
        self,
        models: ModelRegistry,
        settings: RoutingSettings,
        *,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.settings = settings
        self._queues = {
            m.id: GatewayQueue(settings.queue_size, team_share=settings.team_share)
            for m in models.models
        }
        self._model_of = {d.name: d.model_id for d in models.deployments}
        self.metrics = (
            RouterMetrics(registry, models, self.queue_depth) if registry is not None else None
        )

    def observe_overhead(self, started: float, lease: Lease) -> None:
        """The gateway's own time on a request that has just reached its engine (`started`:
        its arrival, perf_counter)."""
        if self.metrics is not None:
            spent = time.perf_counter() - started - lease.queued_s
            self.metrics.overhead.observe(max(0.0, spent))

    def retried(self, model: str) -> None:
        if self.metrics is not None:
            self.metrics.retries.labels(model).inc()

    def queue_depth(self) -> int:
        return sum(q.depth for q in self._queues.values())

    def notify(self, deployment: Deployment) -> None:
        queue = self._queues.get(self._model_of.get(deployment.name, ""))
        if queue is not None:
            queue.notify()

    @staticmethod
    def candidate(d: Deployment) -> Candidate:
        load = d.engine.load()
        busy = max(load.running + load.waiting, d.inflight)
        running = min(busy, load.capacity)
        return Candidate(
            name=d.name,
            engine_class=d.engine_class,
            running=running,
            waiting=busy - running,
            capacity=load.capacity,
            max_queue=load.max_waiting if d.max_queue is None else d.max_queue,
            weight=d.weight,
            healthy=d.breaker.available(),
        )

    def decide(
        self, model: ServedModel, allowed: frozenset[EngineClass], exclude: frozenset[str]
    ) -> Route:
        return route([self.candidate(d) for d in model.deployments], allowed, exclude)

    async def acquire(
        self,
        model: ServedModel,
        *,
        allowed: frozenset[EngineClass],
        team: str,
        exclude: frozenset[str] = frozenset(),
    ) -> Lease:
        """A lease on a deployment of `model`; raises the GatewayError its client gets."""
        queue = self._queues[model.id]
        if not queue.depth:  # nobody waits: take a place directly if there is one
            lease = self._try(model, allowed, exclude, 0.0)
            if lease is not None:
                return lease
        try:
            ticket = queue.enter(team)
        except QueueRefused as exc:
            self._reject(model, exc.reason)
            raise Overloaded(
                "every deployment of this model is busy and the wait queue is full; retry later"
                if exc.reason == "queue_full"
                else "your team already holds its share of the wait queue; retry later",
                headers={"Retry-After": "1"},
            ) from None
        start = time.monotonic()
        deadline = start + self.settings.queue_timeout_s
        served = False
        try:
            while True:
                if queue.is_head(ticket):
                    lease = self._try(model, allowed, exclude, time.monotonic() - start)
                    if lease is not None:
                        served = True
                        return lease
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._reject(model, "queue_timeout")
                    raise Overloaded(
                        "every deployment of this model stayed busy; retry later",
                        headers={"Retry-After": "1"},
                    )
                await ticket.wait(min(remaining, _RECHECK_S))
        finally:
            queue.leave(ticket, served=served)

    def _try(
        self,
        model: ServedModel,
        allowed: frozenset[EngineClass],
        exclude: frozenset[str],
        queued_s: float,
    ) -> Lease | None:
        """A lease when a deployment has room; None when all are saturated; raises otherwise."""
        decision = self.decide(model, allowed, exclude)
        if decision.deployment is None:
            if decision.reason == "saturated":
                return None
            self._reject(model, decision.reason)
            if decision.reason == "unavailable":
                wait = min(
                    (
                        d.breaker.retry_after_s()
                        for d in model.deployments
                        if d.engine_class in allowed
                    ),
                    default=1.0,
                )
                raise ServiceUnavailable(
                    "no healthy deployment can serve this model right now",
                    headers={"Retry-After": str(max(1, math.ceil(wait)))},
                )
            if exclude:  # a retry found no other deployment
                raise ServiceUnavailable(
                    "the deployment failed and no other can serve this model",
                    headers={"Retry-After": "1"},
                )
            raise PolicyDenied(
                "this API key may not be served by the engines that serve this model",
                decision_code="engine_class_not_allowed",
            )
        deployment = next(d for d in model.deployments if d.name == decision.deployment)
        if not deployment.breaker.acquire():  # pragma: no cover - route() saw it available
            return None
        deployment.inflight += 1
        if self.metrics is not None:
            self.metrics.decided(model.id, deployment.name, decision.reason)
        return Lease(self, deployment, decision.reason, queued_s)

    def _reject(self, model: ServedModel, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.rejected(model.id, reason)
