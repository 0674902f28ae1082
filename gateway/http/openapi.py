"""The OpenAPI 3.1 document, assembled from the route table.

Handlers decode raw bodies themselves (exact OpenAI errors, one decode pass), so the document is
not inferred by Litestar: each route of the table carries its `Operation`, whose request and
response schemas come straight from the wire Structs, and which lists the error envelope it can
answer with (OpenAI's envelope, or Ollama's `{"error": ...}` on Ollama's routes).  Routes
without an operation (admin, audit) are not in the document.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from ..errors import ErrorEnvelope

__all__ = ["GENERATION_ERRORS", "Operation", "openapi_document"]

_ERRORS = {
    "400": "Invalid request (or over a policy cap: max_tokens, n)",
    "401": "No valid API key, JWT or client certificate",
    "403": "Denied by policy (model, engine class) or role",
    "404": "Unknown model or route",
    "413": "Body too large",
    "429": "Rate limited, engine at capacity, or too many failed authentications from this "
    "address (see Retry-After, x-ratelimit-*)",
    "503": "Not ready, or the audit log or limits are unavailable",
}
# what a route that generates or embeds may answer besides 200 (OpenAI's and Ollama's alike)
GENERATION_ERRORS = ("400", "401", "403", "404", "413", "429", "503")
_STATUS = {
    "application/json": {"schema": {"type": "object", "properties": {"status": {"type": "string"}}}}
}


@dataclass(frozen=True)
class Operation:
    """One route's entry in the document."""

    method: Literal["get", "post"]
    summary: str
    errors: tuple[str, ...] = ()
    request: type[msgspec.Struct] | None = None  # the JSON body
    response: type[msgspec.Struct] | None = None  # the JSON answer (200)
    response_media: str | None = None  # a non-JSON answer ("text/plain")
    described: str = "OK"  # the 200 answer's description
    streams: bool = False  # also answers with a stream (stream=true; Ollama: by default)
    stream_media: str = "text/event-stream"  # Ollama's: "application/x-ndjson"
    error: type[msgspec.Struct] = ErrorEnvelope  # the error body's shape
    path_params: tuple[str, ...] = ()
    public: bool = False  # needs no credential
    types: tuple[type[msgspec.Struct], ...] = field(default=())

    def item(self, ref: Mapping[type[msgspec.Struct], str]) -> dict[str, Any]:
        """The path item; `ref` names each type's schema in the components."""
        content: dict[str, Any] = {}
        if self.response is not None:
            content.update(_json(ref[self.response]))
        elif self.response_media is not None:
            content[self.response_media] = {"schema": {"type": "string"}}
        else:
            content.update(_STATUS)
        if self.streams:
            content[self.stream_media] = {"schema": {"type": "string"}}
        op: dict[str, Any] = {"summary": self.summary}
        if self.public:
            op["security"] = []
        if self.path_params:
            op["parameters"] = [
                {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                for name in self.path_params
            ]
        if self.request is not None:
            op["requestBody"] = {"required": True, "content": _json(ref[self.request])}
        # a route that takes a credential can answer 429 before reading it (an address over
        # its failed-authentication budget)
        codes = sorted({*self.errors, *(() if self.public else ("429",))})
        op["responses"] = {
            "200": {"description": self.described, "content": content},
            **{c: {"description": _ERRORS[c], "content": _json(ref[self.error])} for c in codes},
        }
        return {self.method: op}


def _json(ref: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": ref}}}


def openapi_document(version: str, paths: Iterable[tuple[str, Operation]]) -> dict[str, Any]:
    """The document for `(path, operation)` pairs (in the route table's order).

    Schemas are named by msgspec, which qualifies a name two types share (OpenAI's and Ollama's
    `ModelList`) with its module; each operation refers to the name its type got."""
    pairs = list(paths)
    types: list[type[msgspec.Struct]] = []
    for _, op in pairs:
        for t in (op.request, op.response, op.error):
            if t is not None and t not in types:
                types.append(t)
    refs, components = msgspec.json.schema_components(
        types, ref_template="#/components/schemas/{name}"
    )
    ref = {t: r["$ref"] for t, r in zip(types, refs, strict=True)}
    items: dict[str, Any] = {}
    for path, op in pairs:
        items.setdefault(path, {}).update(op.item(ref))
    return {
        "openapi": "3.1.0",
        "info": {"title": "airgate", "version": version},
        "paths": items,
        # every route needs an API key (or a JWT) unless it says `security: []`
        "security": [{"bearer": []}],
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An airgate API key (ag_...) or a JWT from the configured "
                    "issuer",
                }
            },
        },
    }
