"""The OpenAPI 3.1 document, built from the same msgspec types the handlers decode and encode.

Handlers decode raw bodies themselves (exact OpenAI errors, one decode pass), so the document is
assembled here rather than inferred by Litestar: request and response schemas come straight from
the wire Structs, and every operation lists the error envelope it can answer with.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..errors import ErrorEnvelope
from . import types as t

__all__ = ["openapi_document"]

_ERRORS = {
    "400": "Invalid request (or over a policy cap: max_tokens, n)",
    "401": "No valid API key, JWT or client certificate",
    "403": "Denied by policy (model, engine class) or role",
    "404": "Unknown model or route",
    "413": "Body too large",
    "429": "Rate limited or engine at capacity (see Retry-After, x-ratelimit-*)",
    "503": "Not ready, or the audit log or limits are unavailable",
}


def _json(ref: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}}


def _errors(*codes: str) -> dict[str, Any]:
    return {c: {"description": _ERRORS[c], "content": _json("ErrorEnvelope")} for c in codes}


def openapi_document(version: str) -> dict[str, Any]:
    types = (
        t.ChatCompletionRequest,
        t.ChatCompletion,
        t.CompletionRequest,
        t.Completion,
        t.ModelList,
        t.Model,
        ErrorEnvelope,
    )
    _, components = msgspec.json.schema_components(
        types, ref_template="#/components/schemas/{name}"
    )
    sse = {"text/event-stream": {"schema": {"type": "string"}}}

    def generate(summary: str, req: str, resp: str) -> dict[str, Any]:
        return {
            "post": {
                "summary": summary,
                "requestBody": {"required": True, "content": _json(req)},
                "responses": {
                    "200": {
                        "description": "The result, or an SSE stream when stream=true",
                        "content": {**_json(resp), **sse},
                    },
                    **_errors("400", "401", "403", "404", "413", "429", "503"),
                },
            }
        }

    plain = {
        "application/json": {
            "schema": {"type": "object", "properties": {"status": {"type": "string"}}}
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "airgate", "version": version},
        "paths": {
            "/v1/chat/completions": generate(
                "Create a chat completion", "ChatCompletionRequest", "ChatCompletion"
            ),
            "/v1/completions": generate(
                "Create a text completion", "CompletionRequest", "Completion"
            ),
            "/v1/models": {
                "get": {
                    "summary": "List models",
                    "responses": {
                        "200": {"description": "Models", "content": _json("ModelList")},
                        **_errors("401"),
                    },
                }
            },
            "/v1/models/{model}": {
                "get": {
                    "summary": "Retrieve a model",
                    "parameters": [
                        {
                            "name": "model",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    ],
                    "responses": {
                        "200": {"description": "The model", "content": _json("Model")},
                        **_errors("401", "404"),
                    },
                }
            },
            "/health": {
                "get": {
                    "summary": "Liveness",
                    "security": [],
                    "responses": {"200": {"description": "Alive", "content": plain}},
                }
            },
            "/ready": {
                "get": {
                    "summary": "Readiness",
                    "security": [],
                    "responses": {
                        "200": {"description": "Ready", "content": plain},
                        **_errors("503"),
                    },
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics",
                    "responses": {
                        "200": {
                            "description": "Metrics",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        },
                        **_errors("401"),
                    },
                }
            },
        },
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
