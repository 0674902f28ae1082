"""The composition root: `create_app(settings)` builds the Litestar app and owns its resources."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from litestar import Litestar, Response, get
from litestar.di import Provide

from .config import Settings
from .errors import exception_handlers
from .health import health, metrics_route, ready
from .metrics import Metrics
from .openai.chat import chat_completions
from .openai.completions import completions
from .openai.models import get_model, list_models
from .openai.schema import openapi_document
from .registry import ModelRegistry
from .reqlog import RequestLogMiddleware
from .runtime import build_registry, start_engines, stop_engines

__all__ = ["create_app"]

_log = logging.getLogger("airgate.app")


def _version() -> str:
    try:
        return version("airgate")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0.0.0"


def create_app(settings: Settings, *, registry: ModelRegistry | None = None) -> Litestar:
    """Build the app.  Engines load in the background after start-up; /ready says when."""
    models = registry if registry is not None else build_registry(settings)
    return _build(settings, models)


def _build(settings: Settings, models: ModelRegistry) -> Litestar:
    metrics = Metrics(models)
    schema = openapi_document(_version())

    @get("/openapi.json", include_in_schema=False)
    async def openapi() -> Response[Any]:
        return Response(schema, media_type="application/json")

    @contextlib.asynccontextmanager
    async def engines(_: Litestar) -> AsyncIterator[None]:
        loading = asyncio.ensure_future(start_engines(models))
        loading.add_done_callback(functools.partial(_on_loaded, models))
        try:
            yield
        finally:
            loading.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await loading
            await stop_engines(models)

    app = Litestar(
        route_handlers=[
            chat_completions,
            completions,
            list_models,
            get_model,
            health,
            ready,
            metrics_route,
            openapi,
        ],
        dependencies={
            "models": Provide(lambda: models, use_cache=True, sync_to_thread=False),
            "metrics": Provide(lambda: metrics, use_cache=True, sync_to_thread=False),
        },
        exception_handlers=exception_handlers,
        lifespan=[engines],
        request_max_body_size=settings.server.max_request_bytes,
        openapi_config=None,
        debug=False,
        logging_config=None,
    )
    # Outside Litestar's router (not as route middleware): unrouted requests (404, 405) get a
    # request id and a log line too.
    app.asgi_handler = RequestLogMiddleware(app.asgi_handler, metrics)
    return app


def _on_loaded(models: ModelRegistry, task: asyncio.Future[None]) -> None:
    """An engine that cannot load makes the process useless: say why and shut down."""
    if task.cancelled() or task.exception() is None:
        return
    exc = task.exception()
    models.load_error = f"{type(exc).__name__}: {exc}"
    _log.error("engines failed to load (%s); shutting down", models.load_error)
    models.request_shutdown()
