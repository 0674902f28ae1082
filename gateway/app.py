"""The composition root: `create_app(settings)` builds the Litestar app and owns its resources."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version

from litestar import Litestar
from litestar.datastructures import State
from litestar.di import Provide

from .access.stack import Security, SecurityHolder, open_security
from .audit import AuditEvent, new_event_id
from .config import Settings
from .console import Console, SessionStore
from .egress import installed as egress_guard
from .egress.denials import DENIALS
from .engines.registry import ModelRegistry
from .engines.runtime import build_registry, start_engines, stop_engines
from .errors import exception_handlers
from .http.authn import AuthMiddleware, caller
from .http.drain import Drain, DrainMiddleware
from .http.failure_audit import FailureAudit
from .http.flood import FloodGuard
from .http.request_log import RequestLogMiddleware, RouteTemplates
from .openai.sse import sse_error
from .pipeline import Pipeline
from .routes import ROUTES, openapi_route, paths, public_paths, session_prefixes
from .routing import Router
from .telemetry.metrics import Metrics
from .telemetry.traces import Telemetry

__all__ = ["create_app"]

_log = logging.getLogger("airgate.app")


def _version() -> str:
    try:
        return version("airgate")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0.0.0"


def create_app(
    settings: Settings,
    *,
    registry: ModelRegistry | None = None,
    security: Security | None = None,
    drain: Drain | None = None,
) -> Litestar:
    """Build the app.  At start-up the access stack (keys, policy, limits, audit log) opens;
    engines then load in the background and /ready says when.  Tests may pass an open
    `security` (they own its lifetime); `serve` passes the `drain` its signals start."""
    models = registry if registry is not None else build_registry(settings)
    drain = drain if drain is not None else Drain.of(settings.server)
    return _build(settings, models, security, drain)


def _build(
    settings: Settings, models: ModelRegistry, given: Security | None, drain: Drain
) -> Litestar:
    metrics = Metrics(models)
    router = Router(models, settings.routing, registry=metrics.registry)
    telemetry = Telemetry.start(settings.telemetry)  # a no-op unless an endpoint is set
    holder = SecurityHolder()
    metrics.watch(lambda: _access_gauges(holder))
    metrics.watch(drain.gauges)
    metrics.watch(_egress_gauge)
    metrics.count(
        "airgate_egress_denied",
        "Connections and name lookups the egress guard refused, by process (this one or a "
        "child: vLLM's engine core)",
        "process",
        DENIALS.counts,
    )
    metrics.info("airgate_policy", "The policy version in force", lambda: _policy_info(holder))
    inference = Pipeline(models, metrics, router, telemetry, holder)
    routes = (*ROUTES, openapi_route(_version()))
    failures = FailureAudit(settings.auth.failure_audit_window_s)  # auth failures, aggregated
    limits = settings.auth  # failed authentications per client address, checked first
    guard = FloodGuard(burst=limits.failure_burst, rate_per_s=limits.failure_rate_per_s)
    console = Console(SessionStore(settings.console), guard)  # its sign-in shares the budget

    @contextlib.asynccontextmanager
    async def access(_: Litestar) -> AsyncIterator[None]:
        opened = contextlib.nullcontext(given) if given is not None else open_security(settings)
        async with opened as security:
            holder.security = security
            loop = asyncio.get_running_loop()
            # `airgate policy reload` (or kill -HUP): a broken policy never replaces one; off
            # the main thread (tests) there are no signals
            with contextlib.suppress(RuntimeError, ValueError):
                loop.add_signal_handler(signal.SIGHUP, security.policy.reload)
            try:
                # the last totals on the way out; egress refusals audited while the log is open
                async with failures.flushing(security.record):
                    with DENIALS.auditing(security.audit.append_nowait):
                        yield
            finally:
                holder.security = None
                with contextlib.suppress(RuntimeError, ValueError):
                    loop.remove_signal_handler(signal.SIGHUP)

    @contextlib.asynccontextmanager
    async def engines(_: Litestar) -> AsyncIterator[None]:
        async def load() -> None:
            await start_engines(models)
            await _audit_bundles(holder, models)

        loading = asyncio.ensure_future(load())
        loading.add_done_callback(functools.partial(_on_loaded, models))
        try:
            yield
        finally:
            loading.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await loading
            await stop_engines(models)
            telemetry.shutdown()  # flushes the last spans

    app = Litestar(
        route_handlers=[route.handler for route in routes],
        dependencies={
            "models": Provide(lambda: models, use_cache=True, sync_to_thread=False),
            "metrics": Provide(lambda: metrics, use_cache=True, sync_to_thread=False),
            "router": Provide(lambda: router, use_cache=True, sync_to_thread=False),
            "telemetry": Provide(lambda: telemetry, use_cache=True, sync_to_thread=False),
            "security": Provide(holder.get, sync_to_thread=False),
            "principal": Provide(caller, sync_to_thread=False),
            "inference": Provide(lambda: inference, use_cache=True, sync_to_thread=False),
            "drain": Provide(lambda: drain, use_cache=True, sync_to_thread=False),
            "airgate_version": Provide(_version, use_cache=True, sync_to_thread=False),
            "console": Provide(lambda: console, use_cache=True, sync_to_thread=False),
        },
        exception_handlers=exception_handlers,
        lifespan=[access, engines],
        # for in-process inspection (tests, embedding); nothing on the request path reads it
        state=State({"security_holder": holder, "console": console}),
        request_max_body_size=settings.server.max_request_bytes,
        openapi_config=None,
        debug=False,
        logging_config=None,
    )
    # Outside Litestar's router (not as route middleware): unrouted requests (404, 405) get a
    # request id and a log line too.
    authenticated = AuthMiddleware(
        app.asgi_handler,
        holder,
        public_paths(routes),
        guard,
        failures,
        sessions=session_prefixes(routes),
    )
    drained = DrainMiddleware(authenticated, drain, sse_error)  # counted, refused while draining
    app.asgi_handler = RequestLogMiddleware(drained, metrics, RouteTemplates(paths(routes)))
    return app


def _access_gauges(holder: SecurityHolder) -> dict[str, tuple[str, float]]:
    security = holder.security
    if security is None:
        return {}
    stats = security.audit.stats
    return {
        "airgate_limits_degraded": (
            "1 while Redis is unreachable and limits are kept in this process",
            float(getattr(security.limiter, "degraded", False)),
        ),
        "airgate_audit_events_committed": ("Audit events committed", float(stats.appended)),
        "airgate_audit_events_dropped": (
            "Best-effort audit events dropped (writer stopped or queue full)",
            float(stats.dropped),
        ),
        "airgate_audit_commit_failures": ("Audit transactions that failed", float(stats.failures)),
        "airgate_audit_checkpoints_published": (
            "Signed checkpoints handed to the witnesses",
            float(security.audit.publisher.published),
        ),
        "airgate_audit_witness_failures": (
            "Checkpoint publications a witness refused (see the log for which)",
            float(security.audit.publisher.failures),
        ),
    }


def _egress_gauge() -> dict[str, tuple[str, float]]:
    return {
        "airgate_egress_guard": (
            "1 when the egress guard is installed in this process",
            float(egress_guard() is not None),
        )
    }


def _policy_info(holder: SecurityHolder) -> dict[str, str] | None:
    security = holder.security
    return None if security is None else {"version": security.policy.current.version}


async def _audit_bundles(holder: SecurityHolder, models: ModelRegistry) -> None:
    """One `bundle.loaded` event per deployment served from a bundle (signed, digest-checked)."""
    security = holder.security
    if security is None:
        return
    for d in models.deployments:
        if d.bundle is None:
            continue
        bundle_id, digest, signer = d.bundle
        security.audit.append_nowait(
            AuditEvent(
                event_id=new_event_id(),
                ts=datetime.now(UTC),
                kind="bundle.loaded",
                outcome="success",
                model=d.model_id,
                deployment=d.name,
                bundle_digest=digest,
                detail={"bundle_id": bundle_id, "signer": signer},
            )
        )


def _on_loaded(models: ModelRegistry, task: asyncio.Future[None]) -> None:
    """An engine that cannot load makes the process useless: say why and shut down."""
    if task.cancelled() or task.exception() is None:
        return
    exc = task.exception()
    models.load_error = f"{type(exc).__name__}: {exc}"
    _log.error("engines failed to load (%s); shutting down", models.load_error)
    models.request_shutdown()
