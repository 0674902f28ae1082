"""GET /v1/models and /v1/models/{model}."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Response, get
from litestar.di import NamedDependency
from litestar.params import FromPath

import policies

from ..access.auth import Principal
from ..access.stack import Security
from ..engines.registry import ModelRegistry, ServedModel
from ..errors import ModelNotFound
from . import types as t

__all__ = ["get_model", "list_models"]

_encode = msgspec.json.Encoder().encode


def _card(name: str, model: ServedModel) -> t.Model:
    return t.Model(
        id=name,
        created=model.created,
        owned_by="airgate",
        max_model_len=model.context_length,
    )


def _visible(security: Security, principal: Principal, model: ServedModel) -> bool:
    who = policies.Principal(
        key_id=principal.key_id, team=principal.team, roles=principal.roles, subject=None
    )
    return policies.can_use_model(security.policy.current, who, model.id)


@get("/v1/models")
async def list_models(
    models: NamedDependency[ModelRegistry],
    security: NamedDependency[Security],
    principal: NamedDependency[Principal],
) -> Response[Any]:
    """The models (and aliases) this server serves that the caller's policy allows."""
    data = [
        _card(name, m)
        for m in models.models
        if _visible(security, principal, m)
        for name in (m.id, *m.aliases)
    ]
    return Response(_encode(t.ModelList(data)), media_type="application/json")


@get("/v1/models/{model:path}")
async def get_model(
    model: FromPath[str],
    models: NamedDependency[ModelRegistry],
    security: NamedDependency[Security],
    principal: NamedDependency[Principal],
) -> Response[Any]:
    """One model by id or alias (404 as well when the caller's policy does not allow it)."""
    name = model.lstrip("/")
    served = models.resolve(name)
    if not _visible(security, principal, served):
        raise ModelNotFound(
            "the model does not exist or you do not have access to it", param="model"
        )
    return Response(_encode(_card(name, served)), media_type="application/json")
