"""GET /api/tags, GET /api/ps, POST /api/show, GET /api/version: what airgate knows of its
models, in Ollama's shapes.

Filled from the registry only: names (ids and aliases), when the model was loaded, the signed
bundle's manifest digest and the weights' size when it came from one, the weights' format (from
the engine: GGUF for llama.cpp, safetensors for vLLM), the context length, the task, and
`size_vram` 0 for llama.cpp (built for the CPU: no layer is offloaded).  What Ollama shows and
airgate does not know (vLLM's share in GPU memory, parameter count, quantisation, family,
Modelfile, template, license) is left out, never invented; `expires_at` is left out because
models stay loaded for the server's life (`keep_alive` changes nothing).  A caller sees only the
models its policy allows, as with /v1/models.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec
from litestar import Request, Response, get, post
from litestar.di import NamedDependency

import policies

from ..access.auth import Principal
from ..access.stack import Security
from ..engines.registry import ModelRegistry, ServedModel
from ..errors import InvalidRequest, ModelNotFound
from ..http.decode import decode
from . import types as t

__all__ = ["list_running", "list_tags", "show_model", "version", "visible"]

_encode = msgspec.json.Encoder().encode
_show = msgspec.json.Decoder(t.ShowRequest)
_FORMATS = {"llama.cpp": "gguf", "vllm": "safetensors"}


def visible(security: Security, principal: Principal, model: ServedModel) -> None:
    """A model the caller's policy does not allow is answered as one that does not exist."""
    who = policies.Principal(
        key_id=principal.key_id, team=principal.team, roles=principal.roles, subject=None
    )
    if not policies.can_use_model(security.policy.current, who, model.id):
        raise ModelNotFound(
            "the model does not exist or you do not have access to it", param="model"
        )


def _allowed(security: Security, principal: Principal, model: ServedModel) -> bool:
    try:
        visible(security, principal, model)
    except ModelNotFound:
        return False
    return True


def _details(model: ServedModel) -> t.Details:
    return t.Details(format=_FORMATS.get(model.deployments[0].engine.name))


def _digest(model: ServedModel) -> str | None:
    bundle = model.deployments[0].bundle
    return None if bundle is None else bundle[1]


def _size(model: ServedModel) -> int | None:
    return model.deployments[0].size


def _size_vram(model: ServedModel) -> int | None:
    engine = model.deployments[0].engine.name
    return 0 if engine == "llama.cpp" and _size(model) is not None else None


def _when(model: ServedModel) -> str:
    return datetime.fromtimestamp(model.created, UTC).isoformat().replace("+00:00", "Z")


@get("/api/tags")
async def list_tags(
    models: NamedDependency[ModelRegistry],
    security: NamedDependency[Security],
    principal: NamedDependency[Principal],
) -> Response[Any]:
    """The models (ids and aliases) the caller's policy allows."""
    tagged = [
        t.TaggedModel(name, name, _when(m), _details(m), _digest(m), _size(m))
        for m in models.models
        if _allowed(security, principal, m)
        for name in (m.id, *m.aliases)
    ]
    return Response(_encode(t.TagList(tagged)), media_type="application/json")


@get("/api/ps")
async def list_running(
    models: NamedDependency[ModelRegistry],
    security: NamedDependency[Security],
    principal: NamedDependency[Principal],
) -> Response[Any]:
    """The models loaded now: all of them once the engines are up, none before."""
    running = [
        t.RunningModel(
            m.id, m.id, _details(m), m.context_length, _digest(m), _size(m), _size_vram(m)
        )
        for m in (models.models if models.ready else ())
        if _allowed(security, principal, m)
    ]
    return Response(_encode(t.RunningList(running)), media_type="application/json")


@post("/api/show", status_code=200)
async def show_model(
    request: Request[Any, Any, Any],
    models: NamedDependency[ModelRegistry],
    security: NamedDependency[Security],
    principal: NamedDependency[Principal],
) -> Response[Any]:
    """One model: its details, what airgate knows of it (`model_info`, airgate's own keys),
    and what it can do ("completion" and "tools", or "embedding")."""
    body = decode(_show, await request.body())
    name = body.model or body.name
    if not name:
        raise InvalidRequest("Missing required parameter: 'model'.", param="model")
    served = models.resolve(name)
    visible(security, principal, served)
    engine = served.deployments[0].engine
    info: dict[str, Any] = {
        "airgate.engine": engine.name,
        "airgate.context_length": served.context_length,
    }
    digest = _digest(served)
    if digest is not None:
        info["airgate.bundle_digest"] = digest
    if served.task == "embed":
        capabilities = ["embedding"]
        if engine.embedding_size:
            info["airgate.embedding_length"] = engine.embedding_size
    else:
        capabilities = ["completion", "tools"]
    reply = t.ShowReply(_details(served), info, capabilities, _when(served))
    return Response(_encode(reply), media_type="application/json")


@get("/api/version")
async def version(airgate_version: NamedDependency[str]) -> Response[Any]:
    """airgate's own version (not an Ollama version: this is not Ollama)."""
    return Response(_encode(t.Version(airgate_version)), media_type="application/json")
