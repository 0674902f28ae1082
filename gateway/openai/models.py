"""GET /v1/models and /v1/models/{model}."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Response, get
from litestar.di import NamedDependency
from litestar.params import FromPath

from ..registry import ModelRegistry, ServedModel
from . import types as t

__all__ = ["get_model", "list_models"]

_encode = msgspec.json.Encoder().encode


def _card(name: str, model: ServedModel) -> t.Model:
    return t.Model(
        id=name,
        created=model.created,
        owned_by="airgate",
        max_model_len=model.engine.context_length,
    )


@get("/v1/models")
async def list_models(models: NamedDependency[ModelRegistry]) -> Response[Any]:
    """The models (and aliases) this server serves."""
    data = [_card(name, m) for m in models.models for name in (m.id, *m.aliases)]
    return Response(_encode(t.ModelList(data)), media_type="application/json")


@get("/v1/models/{model_id:path}")
async def get_model(
    model_id: FromPath[str], models: NamedDependency[ModelRegistry]
) -> Response[Any]:
    """One model by id or alias."""
    name = model_id.lstrip("/")
    return Response(_encode(_card(name, models.resolve(name))), media_type="application/json")
