"""Operational routes: liveness, readiness, Prometheus metrics."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Response, get
from litestar.di import NamedDependency

from ..access.stack import Security
from ..engines.registry import ModelRegistry
from ..errors import ServiceUnavailable
from ..telemetry.metrics import CONTENT_TYPE, Metrics
from .drain import Drain, draining_error
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


class _Ready(msgspec.Struct):
    status: str
    policy_version: str  # replicas that disagree are serving different policies
    version: str  # airgate's
    audit_chain: str  # this replica's chain of the audit log (search and verify name it)


_encode_ready = msgspec.json.Encoder().encode


@get("/ready")
async def ready(
    models: NamedDependency[ModelRegistry],
    drain: NamedDependency[Drain],
    security: NamedDependency[Security],
    airgate_version: NamedDependency[str],
) -> Response[Any]:
    """Readiness: 200 once every engine is loaded, with the policy version in force and this
    replica's audit chain; 503
    before, and from the moment the server starts draining (SIGTERM)."""
    if drain.draining:
        raise draining_error("the server is draining: it takes no new requests")
    if not models.ready:
        raise ServiceUnavailable("engines are loading", headers={"Retry-After": "2"})
    body = _Ready(
        "ready", security.policy.current.version, airgate_version, security.audit.signing.log_id
    )
    return Response(_encode_ready(body), media_type="application/json")


@get("/metrics")
async def metrics_route(metrics: NamedDependency[Metrics]) -> Response[Any]:
    """Prometheus text exposition."""
    return Response(metrics.render(), media_type=CONTENT_TYPE)
