"""Operational routes: liveness, readiness, Prometheus metrics."""

from __future__ import annotations

from typing import Any

from litestar import Response, get
from litestar.di import NamedDependency

from ..engines.registry import ModelRegistry
from ..errors import ServiceUnavailable
from ..telemetry.metrics import CONTENT_TYPE, Metrics
from .openapi import Operation

__all__ = ["HEALTH", "METRICS", "READY", "health", "metrics_route", "ready"]

HEALTH = Operation("get", "Liveness", described="Alive", public=True)
READY = Operation("get", "Readiness", ("503",), described="Ready", public=True)
METRICS = Operation(
    "get", "Prometheus metrics", ("401",), response_media="text/plain", described="Metrics"
)


@get("/health")
async def health() -> Response[Any]:
    """Liveness: the process answers."""
    return Response(b'{"status":"ok"}', media_type="application/json")


@get("/ready")
async def ready(models: NamedDependency[ModelRegistry]) -> Response[Any]:
    """Readiness: 200 once every engine is loaded, 503 before."""
    if not models.ready:
        raise ServiceUnavailable("engines are loading", headers={"Retry-After": "2"})
    return Response(b'{"status":"ready"}', media_type="application/json")


@get("/metrics")
async def metrics_route(metrics: NamedDependency[Metrics]) -> Response[Any]:
    """Prometheus text exposition."""
    return Response(metrics.render(), media_type=CONTENT_TYPE)
