"""The models this process serves: id and aliases -> engine."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterable

from backends.types import Engine

from .errors import ModelNotFound

__all__ = ["ModelRegistry", "ServedModel"]


class ServedModel:
    __slots__ = ("aliases", "bundle", "created", "engine", "id", "source")

    def __init__(
        self,
        model_id: str,
        engine: Engine,
        aliases: Iterable[str] = (),
        *,
        source: object = None,
    ) -> None:
        self.id = model_id
        self.source = source  # where the engine's weights come from (a bundle source)
        self.engine = engine
        self.aliases = tuple(aliases)
        self.created = int(time.time())
        # (bundle id, manifest SHA-256, signer key id) once loaded from a bundle
        self.bundle: tuple[str, str, str] | None = None


class ModelRegistry:
    def __init__(self, models: Iterable[ServedModel]) -> None:
        self.models = tuple(models)
        self._by_name = {name: m for m in self.models for name in (m.id, *m.aliases)}
        self.ready = False
        self.load_error: str | None = None  # set when an engine failed to load
        # How the app asks its server to stop (an engine failed to load); the CLI sets it.
        self.request_shutdown: Callable[[], None] = lambda: signal.raise_signal(signal.SIGTERM)
        # resources the engines needed (KMS sessions), closed after the engines stop
        self.on_close: list[Callable[[], None]] = []

    def resolve(self, name: str) -> ServedModel:
        model = self._by_name.get(name)
        if model is None:
            # The name is the client's own input but not content; still, do not repeat it.
            raise ModelNotFound(
                "the model does not exist or you do not have access to it", param="model"
            )
        return model

    def names(self) -> list[str]:
        return list(self._by_name)
