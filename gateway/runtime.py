"""Wiring: settings -> engines and served models.  The only place that picks concrete engines."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from backends.echo import EchoEngine
from backends.llamacpp import LlamaCppEngine, LlamaCppOptions
from backends.types import Engine

from .config import ModelSettings, Settings
from .default_model import DEFAULT_MODEL_ID, ensure_default_model
from .registry import ModelRegistry, ServedModel

__all__ = ["build_registry", "start_engines", "stop_engines"]

_log = logging.getLogger("airgate.runtime")


def _llamacpp_options(settings: Settings, model: ModelSettings) -> LlamaCppOptions:
    e = settings.engine

    def pick(own: int | None, default: int) -> int:
        return default if own is None else own

    return LlamaCppOptions(
        slots=pick(model.slots, e.slots),
        context_length=pick(model.context_length, e.context_length),
        batch_size=pick(model.batch_size, e.batch_size),
        max_waiting=pick(model.max_waiting, e.max_waiting),
        n_threads=model.n_threads if model.n_threads is not None else e.n_threads,
        chat_template=model.chat_template,
        batch_invariant=(
            e.batch_invariant if model.batch_invariant is None else model.batch_invariant
        ),
    )


def _engine(settings: Settings, model: ModelSettings, data_dir: Path) -> Engine:
    if model.engine == "echo":
        _log.warning("model %s is served by the echo engine (for HTTP benchmarks only)", model.id)
        return EchoEngine(context_length=model.context_length or settings.engine.context_length)
    # only the embedded default has no path
    path = model.path or str(ensure_default_model(data_dir))
    return LlamaCppEngine(path, _llamacpp_options(settings, model))


def build_registry(settings: Settings) -> ModelRegistry:
    """Engines for every configured model (none started yet); the default when none is."""
    data_dir = Path(settings.data_dir)
    models = settings.models or [ModelSettings(id=DEFAULT_MODEL_ID, engine="llama.cpp")]
    return ModelRegistry(
        ServedModel(m.id, _engine(settings, m, data_dir), m.aliases) for m in models
    )


async def start_engines(registry: ModelRegistry) -> None:
    await asyncio.gather(*(m.engine.start() for m in registry.models))
    registry.ready = True
    _log.info("ready: serving %s", ", ".join(registry.names()))


async def stop_engines(registry: ModelRegistry) -> None:
    registry.ready = False
    await asyncio.gather(*(m.engine.stop() for m in registry.models), return_exceptions=True)
