"""The one route table: every route the app serves, whether it needs a credential, and its
OpenAPI operation.  The app's handlers, the request log's route templates, the authentication
middleware's public paths and the OpenAPI document are all derived from it.

A new protocol is one adapter package plus its rows here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from litestar import Response, Router, get
from litestar.handlers import HTTPRouteHandler

from .admin.keys import admin_router
from .compliance.audit_api import compliance_router
from .console import console_router
from .http import health
from .http.openapi import Operation, openapi_document
from .ollama import schema as ollama_docs
from .ollama.chat import chat as ollama_chat
from .ollama.embed import embed as ollama_embed
from .ollama.embed import embeddings as ollama_embeddings
from .ollama.generate import generate as ollama_generate
from .ollama.models import list_running, list_tags, show_model, version
from .ollama.refused import REFUSED as OLLAMA_REFUSED
from .openai import schema as openai_docs
from .openai.chat import chat_completions
from .openai.completions import completions
from .openai.embeddings import embeddings
from .openai.models import get_model, list_models
from .openai.responses import (
    cancel_response,
    create_response,
    delete_response,
    get_response,
    list_input_items,
)

__all__ = [
    "ROUTES",
    "Route",
    "document",
    "openapi_route",
    "paths",
    "public_paths",
    "session_prefixes",
]

_PARAM = re.compile(r"\{(\w+)(?::\w+)?\}")


@dataclass(frozen=True)
class Route:
    """A handler (or a router of handlers sharing guards), with what the table knows of it."""

    handler: HTTPRouteHandler | Router
    operation: Operation | None = None  # None: not in the OpenAPI document
    public: bool = False  # served without a credential
    # a router that authenticates its own requests (the console's session cookie): the bearer
    # middleware leaves every path under it alone
    session: bool = False

    def paths(self) -> list[str]:
        """The paths as clients see them: `{name}` for a path parameter."""
        if isinstance(self.handler, Router):
            raw = [route.path for route in self.handler.routes]
        else:
            raw = sorted(self.handler.paths)
        return list(dict.fromkeys(_PARAM.sub(r"{\1}", p) for p in raw))


def document(version: str) -> dict[str, Any]:
    """The OpenAPI document of this table."""
    return openapi_document(
        version,
        ((path, r.operation) for r in ROUTES for path in r.paths() if r.operation is not None),
    )


def openapi_route(version: str) -> Route:
    """GET /openapi.json, the document of this very table (public)."""
    served = document(version)

    @get("/openapi.json", include_in_schema=False)
    async def openapi() -> Response[Any]:
        return Response(served, media_type="application/json")

    return Route(openapi, public=True)


ROUTES: tuple[Route, ...] = (
    Route(chat_completions, openai_docs.CHAT),
    Route(completions, openai_docs.COMPLETIONS),
    Route(embeddings, openai_docs.EMBEDDINGS),
    Route(list_models, openai_docs.LIST_MODELS),
    Route(get_model, openai_docs.RETRIEVE_MODEL),
    Route(create_response, openai_docs.CREATE_RESPONSE),
    Route(get_response, openai_docs.RETRIEVE_RESPONSE),
    Route(delete_response),  # the document has no DELETE operations; 404 like the others
    Route(list_input_items, openai_docs.LIST_INPUT_ITEMS),
    Route(cancel_response, openai_docs.CANCEL_RESPONSE),
    # Ollama's API (its model-management routes, always 403, are left out of the document)
    Route(ollama_chat, ollama_docs.CHAT),
    Route(ollama_generate, ollama_docs.GENERATE),
    Route(ollama_embed, ollama_docs.EMBED),
    Route(ollama_embeddings, ollama_docs.EMBEDDINGS),
    Route(list_tags, ollama_docs.TAGS),
    Route(list_running, ollama_docs.PS),
    Route(show_model, ollama_docs.SHOW),
    Route(version, ollama_docs.VERSION),
    *(Route(handler) for handler in OLLAMA_REFUSED),
    Route(health.health, health.HEALTH, public=True),
    Route(health.ready, health.READY, public=True),
    Route(health.metrics_route, health.METRICS),
    Route(admin_router),
    Route(compliance_router),
    Route(console_router, session=True),
)


def paths(routes: tuple[Route, ...]) -> Iterator[str]:
    for route in routes:
        yield from route.paths()


def public_paths(routes: tuple[Route, ...]) -> frozenset[str]:
    return frozenset(path for r in routes if r.public for path in r.paths())


def session_prefixes(routes: tuple[Route, ...]) -> frozenset[str]:
    """The path prefixes of the routers that authenticate their own requests."""
    return frozenset(r.handler.path for r in routes if r.session and isinstance(r.handler, Router))
