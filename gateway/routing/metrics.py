"""The router's Prometheus series (`airgate_router_*`), on the app's own registry.

airgate_router_decisions_total{model_name,deployment,reason}   where requests went and why
airgate_router_overflow_total{model_name,deployment}           gpu saturated -> edge
airgate_router_rejections_total{model_name,reason}             429/503 from the router
airgate_router_retries_total{model_name}                       failures retried elsewhere
airgate_router_queue_depth                                     requests waiting now
airgate_router_circuit_state{deployment}                       0 closed, 1 half-open, 2 open
airgate_router_deployment_inflight{model_name,deployment}      the router's own count
airgate_gateway_overhead_seconds                               request arrival -> engine
                                                               submit, less any queue wait
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..telemetry.loop_metrics import LoopCounter, LoopHistogram

if TYPE_CHECKING:
    from ..engines.registry import ModelRegistry

__all__ = ["RouterMetrics"]

_STATE = {"closed": 0.0, "half_open": 1.0, "open": 2.0}
_OVERHEAD_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
)


class _StateCollector(Collector):
    def __init__(self, models: ModelRegistry, queue_depth: Callable[[], int]) -> None:
        self._models = models
        self._queue_depth = queue_depth

    def collect(self) -> Iterator[GaugeMetricFamily]:
        circuit = GaugeMetricFamily(
            "airgate_router_circuit_state",
            "Circuit breaker per deployment: 0 closed, 1 half-open, 2 open",
            labels=("deployment",),
        )
        inflight = GaugeMetricFamily(
            "airgate_router_deployment_inflight",
            "Requests the router sent to a deployment that have not finished",
            labels=("model_name", "deployment"),
        )
        for d in self._models.deployments:
            circuit.add_metric([d.name], _STATE[d.breaker.state])
            inflight.add_metric([d.model_id, d.name], d.inflight)
        yield circuit
        yield inflight
        yield GaugeMetricFamily(
            "airgate_router_queue_depth",
            "Requests waiting at the gateway for a deployment",
            value=self._queue_depth(),
        )


class RouterMetrics:
    def __init__(
        self, registry: CollectorRegistry, models: ModelRegistry, queue_depth: Callable[[], int]
    ) -> None:
        self.decisions = LoopCounter(
            "airgate_router_decisions",
            "Routing decisions by deployment and reason",
            ("model_name", "deployment", "reason"),
            registry,
        )
        self.overflow = Counter(
            "airgate_router_overflow",
            "Requests sent to an edge deployment because the gpu ones were saturated",
            ("model_name", "deployment"),
            registry=registry,
        )
        self.rejections = Counter(
            "airgate_router_rejections",
            "Requests the router refused (queue full or timed out, fair share, unavailable)",
            ("model_name", "reason"),
            registry=registry,
        )
        self.retries = Counter(
            "airgate_router_retries",
            "Requests retried on another deployment after a failure before the first token",
            ("model_name",),
            registry=registry,
        )
        self.overhead = LoopHistogram(
            "airgate_gateway_overhead_seconds",
            "Time from a request's arrival to its submission to an engine, less queue waits",
            (),
            registry,
            buckets=_OVERHEAD_BUCKETS,
        )
        registry.register(_StateCollector(models, queue_depth))

    def decided(self, model: str, deployment: str, reason: str) -> None:
        self.decisions.labels(model, deployment, reason).inc()
        if reason == "overflow":
            self.overflow.labels(model, deployment).inc()

    def rejected(self, model: str, reason: str) -> None:
        self.rejections.labels(model, reason).inc()
