"""Operational routes: liveness, readiness, Prometheus metrics."""

from __future__ import annotations

from typing import Any

from litestar import Response, get
from litestar.di import NamedDependency

from .errors import ServiceUnavailable
from .metrics import CONTENT_TYPE, Metrics
from .registry import ModelRegistry

__all__ = ["health", "metrics_route", "ready"]


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
