"""What this process serves: model ids (and aliases) -> deployments -> engines.

A deployment is one engine serving one model; a model may have several (the same weights on
vLLM and on llama.cpp, say), among which the router picks per request.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterable

from backends.types import Engine, Task
from policies import EngineClass

from ..errors import ModelNotFound
from .breaker import CircuitBreaker

__all__ = ["Deployment", "ModelRegistry", "ServedModel"]


def default_class(engine: Engine) -> EngineClass:
    return "gpu" if engine.name == "vllm" else "edge"


class Deployment:
    """One engine serving one model, with what the router needs to know about it.

    `breaker` is the deployment's circuit breaker, made with it and kept for its life: whoever
    creates deployments creates their breakers (`runtime.build_registry` from the `[routing]`
    settings; a test with one on its own clock).  The router uses the breaker it finds and never
    replaces it.  Left out, it is a `CircuitBreaker()` with its own defaults.
    """

    __slots__ = (
        "breaker",
        "bundle",
        "engine",
        "engine_class",
        "inflight",
        "max_queue",
        "model_id",
        "name",
        "size",
        "source",
        "weight",
    )

    def __init__(
        self,
        name: str,
        engine: Engine,
        *,
        engine_class: EngineClass | None = None,
        weight: float = 1.0,
        max_queue: int | None = None,
        source: object = None,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        self.name = name
        self.engine = engine
        self.engine_class: EngineClass = engine_class or default_class(engine)
        self.weight = weight
        self.max_queue = max_queue  # None: the engine's own wait bound
        self.source = source  # where the engine's weights come from (a bundle source)
        self.breaker = breaker or CircuitBreaker()
        self.inflight = 0  # requests the router sent here that have not finished
        self.model_id = ""  # set by ServedModel
        # (bundle id, manifest SHA-256, signer key id) once loaded from a bundle
        self.bundle: tuple[str, str, str] | None = None
        self.size: int | None = None  # the weights' bytes (from the bundle's manifest)


class ServedModel:
    """A model id, its aliases and the deployments that serve it (at least one)."""

    __slots__ = ("aliases", "created", "deployments", "id")

    def __init__(
        self,
        model_id: str,
        deployments: Engine | Deployment | Iterable[Deployment],
        aliases: Iterable[str] = (),
    ) -> None:
        if isinstance(deployments, Deployment):
            deployments = (deployments,)
        elif not isinstance(deployments, Iterable):  # one engine: a deployment named after it
            deployments = (Deployment(model_id, deployments),)
        self.id = model_id
        self.deployments = tuple(deployments)
        if not self.deployments:
            raise ValueError(f"model {model_id!r} has no deployment")
        for d in self.deployments:
            d.model_id = model_id
        if len({d.engine.task for d in self.deployments}) > 1:
            raise ValueError(f"model {model_id!r}: deployments that embed and that generate")
        self.aliases = tuple(aliases)
        self.created = int(time.time())

    @property
    def task(self) -> Task:
        """What the model does: generate text or embed (every deployment does the same)."""
        return self.deployments[0].engine.task

    @property
    def context_length(self) -> int:
        """What every deployment can take (a request must fit wherever it is routed)."""
        return min(d.engine.context_length for d in self.deployments)

    @property
    def engine_classes(self) -> frozenset[EngineClass]:
        return frozenset(d.engine_class for d in self.deployments)


class ModelRegistry:
    def __init__(self, models: Iterable[ServedModel]) -> None:
        self.models = tuple(models)
        self.deployments = tuple(d for m in self.models for d in m.deployments)
        names = [d.name for d in self.deployments]
        if len(set(names)) != len(names):
            raise ValueError("deployment names must be unique")
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
