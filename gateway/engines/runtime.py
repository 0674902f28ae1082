"""Wiring: settings -> engines and served models.  The only place that picks concrete engines.

Weights only come from signed bundles (the manifest's signature is checked here, before any
engine exists; decryption happens when the engine loads).  A plain GGUF path is served only when
the operator passed `--insecure-plaintext-model`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from datetime import UTC, datetime
from pathlib import Path

from backends.echo import EchoEngine
from backends.llamacpp import (
    LlamaCppEmbedder,
    LlamaCppEmbedderOptions,
    LlamaCppEngine,
    LlamaCppOptions,
)
from backends.types import Engine, ModelSource, Task
from backends.vllm import VllmEmbedder, VllmEngine, VllmOptions
from bundles import BundlePolicyError, Manifest, TrustedKeys, check_bundle

from ..config import ConfigError, ModelSettings, Settings, VllmSettings
from .breaker import CircuitBreaker
from .imported import load_imported
from .key_providers import KeyProviders
from .registry import Deployment, ModelRegistry, ServedModel
from .sources import (
    DEFAULT_EMBEDDING_ALIASES,
    DEFAULT_EMBEDDING_MODEL_ID,
    DEFAULT_MODEL_ID,
    BundleSource,
    ensure_default_bundle,
    ensure_default_embedding_bundle,
    trusted_keys,
)

__all__ = ["build_registry", "start_engines", "stop_engines"]

_log = logging.getLogger("airgate.runtime")
_EMBEDDER = LlamaCppEmbedderOptions()  # the llama.cpp embedder's defaults


def _llamacpp_options(
    settings: Settings, model: ModelSettings, manifest: Manifest | None = None
) -> LlamaCppOptions:
    e = settings.engine
    hints = manifest.model.engine_hints if manifest is not None else {}

    def pick(own: int | None, name: str, default: int) -> int:
        if own is not None:
            return own
        hint = hints.get(name)
        return hint if isinstance(hint, int) and not isinstance(hint, bool) else default

    template = model.chat_template or (manifest.model.chat_template if manifest else None)
    return LlamaCppOptions(
        slots=pick(model.slots, "slots", e.slots),
        context_length=pick(model.context_length, "context_length", e.context_length),
        batch_size=pick(model.batch_size, "batch_size", e.batch_size),
        max_waiting=pick(model.max_waiting, "max_waiting", e.max_waiting),
        n_threads=model.n_threads if model.n_threads is not None else e.n_threads,
        chat_template=template or "gemma",
        batch_invariant=(
            e.batch_invariant if model.batch_invariant is None else model.batch_invariant
        ),
    )


def _vllm_options(model: ModelSettings, manifest: Manifest | None = None) -> VllmOptions:
    v = model.vllm or VllmSettings()
    hints = manifest.model.engine_hints if manifest is not None else {}
    max_len = v.max_model_len or model.context_length
    if max_len is None and isinstance(hints.get("context_length"), int):
        max_len = int(hints["context_length"])
    return VllmOptions(
        dtype=v.dtype,
        max_model_len=max_len,
        gpu_memory_utilization=v.gpu_memory_utilization,
        tensor_parallel_size=v.tensor_parallel_size,
        pipeline_parallel_size=v.pipeline_parallel_size,
        distributed_executor_backend=v.distributed_executor_backend,
        enforce_eager=v.enforce_eager,
        kv_cache_space_gib=v.kv_cache_space_gib,
        max_num_seqs=v.max_num_seqs,
        max_waiting=model.max_waiting if model.max_waiting is not None else 64,
        chat_template=model.chat_template or (manifest.model.chat_template if manifest else None),
        seed=v.seed,
        enable_prefix_caching=v.enable_prefix_caching,
    )


def _embedder_options(
    settings: Settings, model: ModelSettings, manifest: Manifest | None
) -> LlamaCppEmbedderOptions:
    e = settings.engine
    hint = manifest.model.engine_hints.get("context_length") if manifest is not None else None
    context = model.context_length
    if context is None and isinstance(hint, int) and not isinstance(hint, bool):
        context = hint
    most = _EMBEDDER.sequences
    batch = model.batch_size or _EMBEDDER.batch_size
    if context is not None and context > batch:  # an input is never split across decodes
        batch = -(-context // most) * most
    # inputs per decode (a model's `slots`, at most the default): a power of two that divides
    # the batch (else llama.cpp aborts)
    sequences = min(most, model.slots or most)
    sequences = 1 << (sequences.bit_length() - 1)
    while batch % sequences:
        sequences //= 2
    return LlamaCppEmbedderOptions(
        context_length=context,
        batch_size=batch,
        sequences=sequences,
        max_waiting=model.max_waiting if model.max_waiting is not None else e.max_waiting,
        n_threads=model.n_threads if model.n_threads is not None else e.n_threads,
    )


def _task(model: ModelSettings, manifest: Manifest | None) -> Task:
    """The config's task, else the bundle's hint, else generate."""
    if model.task is not None:
        return model.task
    hint = manifest.model.engine_hints.get("task") if manifest is not None else None
    return "embed" if hint == "embed" else "generate"


def _check_executor(model: ModelSettings, weights: str | ModelSource) -> None:
    """Refuse, before anything loads, a Ray executor that cannot work.

    A bundle is decrypted into this node's memory only (a private tmpfs directory, removed once
    loaded): vLLM's "mp" workers, processes on this node, read it; Ray may place workers on
    other nodes, which cannot.  A plain model directory (on storage every node mounts) may use
    Ray, once it is installed.
    """
    if model.vllm is None or model.vllm.distributed_executor_backend != "ray":
        return
    setting = f'deployment {model.deployment!r}: distributed_executor_backend = "ray"'
    if not isinstance(weights, str):
        raise ConfigError(
            f"{setting} cannot load a bundle: its decrypted weights exist only in this node's "
            'memory, out of reach of Ray workers on other nodes; use "mp" (every worker on '
            "this node)"
        )
    if importlib.util.find_spec("ray") is None:
        raise ConfigError(f"{setting} needs Ray, which is not installed")


def _new_engine(
    settings: Settings, model: ModelSettings, weights: str | ModelSource, manifest: Manifest | None
) -> Engine:
    embed = _task(model, manifest) == "embed"
    if model.engine == "vllm":
        _check_executor(model, weights)
        options = _vllm_options(model, manifest)
        return VllmEmbedder(weights, options) if embed else VllmEngine(weights, options)
    if embed:
        return LlamaCppEmbedder(weights, _embedder_options(settings, model, manifest))
    return LlamaCppEngine(weights, _llamacpp_options(settings, model, manifest))


_FORMAT = {"llama.cpp": "gguf", "vllm": "safetensors"}


def _bundle_engine(
    settings: Settings,
    model: ModelSettings,
    bundle: Path,
    trusted: TrustedKeys,
    providers: KeyProviders,
) -> tuple[Engine, BundleSource]:
    # signature first (nothing unsigned is believed), then validity, policy and sizes: a bundle
    # that cannot be served stops start-up here, before the port is bound
    verified = check_bundle(bundle, trusted, now=datetime.now(UTC))
    manifest = verified.manifest
    engine = model.engine
    if manifest.model.weight_format != _FORMAT[engine]:
        raise ConfigError(
            f"deployment {model.deployment!r}: the bundle holds {manifest.model.weight_format} "
            f"weights, which the {engine} engine does not load (llama.cpp: gguf; vllm: "
            "safetensors)"
        )
    if engine not in manifest.policy.allowed_engines:
        raise BundlePolicyError(
            f"deployment {model.deployment!r}: the bundle may not be loaded by {engine}"
        )
    _log.info(
        "model %s: bundle %s (digest %s, signed by %s)",
        model.id,
        manifest.bundle_id,
        verified.digest,
        verified.signer,
    )
    source = BundleSource(
        bundle,
        trusted=trusted,
        providers=providers,
        engine=engine,
        allowed_providers=settings.bundles.allowed_providers,
    )
    return _new_engine(settings, model, source, manifest), source


def _engine(
    settings: Settings,
    model: ModelSettings,
    trusted: TrustedKeys,
    providers: KeyProviders,
    allow_plaintext: bool,
) -> tuple[Engine, BundleSource | None]:
    if model.engine == "echo":
        _log.warning("model %s is served by the echo engine (for HTTP benchmarks only)", model.id)
        context = model.context_length or settings.engine.context_length
        return EchoEngine(context_length=context, task=model.task or "generate"), None
    if model.bundle:
        return _bundle_engine(settings, model, Path(model.bundle), trusted, providers)
    assert model.path is not None  # config validation: exactly one of bundle / path
    if not allow_plaintext:
        raise ConfigError(
            f"model {model.id!r} is a plain model file; seal it into a bundle "
            "(`airgate bundle create`) or start with --insecure-plaintext-model"
        )
    _log.warning(
        "INSECURE: model %s is served from the plain file %s: its weights are unencrypted "
        "and unsigned on disk (--insecure-plaintext-model)",
        model.id,
        model.path,
    )
    return _new_engine(settings, model, model.path, None), None


def build_registry(settings: Settings, *, allow_plaintext: bool = False) -> ModelRegistry:
    """Engines for every configured model (none loaded yet); the default when none is; and
    every imported bundle (`airgate bundle import`).

    Each deployment gets its circuit breaker here, from the `[routing]` settings.

    Seals the embedded defaults on first run (Gemma for chat and completions, MiniLM for
    embeddings) and checks every bundle's signature; raises ConfigError or a bundles error when
    a model cannot be served.
    """
    providers = KeyProviders(settings)
    models = settings.models
    if not models:
        bundle = ensure_default_bundle(settings, providers)
        models = [ModelSettings(id=DEFAULT_MODEL_ID, bundle=str(bundle))]
        embedder = ensure_default_embedding_bundle(settings, providers)
        if embedder is not None:
            models.append(
                ModelSettings(
                    id=DEFAULT_EMBEDDING_MODEL_ID,
                    bundle=str(embedder),
                    aliases=list(DEFAULT_EMBEDDING_ALIASES),
                )
            )
    trusted = trusted_keys(settings)
    routing = settings.routing
    deployments: dict[str, list[Deployment]] = {}
    aliases: dict[str, list[str]] = {}
    built = [(m, *_engine(settings, m, trusted, providers, allow_plaintext)) for m in models]
    # imported bundles (`airgate bundle import`), after the configured models or the defaults:
    # verified against the pinned keys only; an id that is served already stops the start
    taken = {name for m in models for name in (m.id, m.deployment, *m.aliases)}
    for m, imported, manifest in load_imported(settings, providers, taken, datetime.now(UTC)):
        built.append((m, _new_engine(settings, m, imported, manifest), imported))
    for m, engine, source in built:
        deployment = Deployment(
            m.deployment,
            engine,
            engine_class=m.resolved_class,
            weight=m.weight,
            max_queue=m.max_queue,
            source=source,
            breaker=CircuitBreaker(
                failure_threshold=routing.breaker_failures, open_s=routing.breaker_open_s
            ),
        )
        deployments.setdefault(m.id, []).append(deployment)
        names = aliases.setdefault(m.id, [])
        names.extend(a for a in m.aliases if a not in names)
    registry = ModelRegistry(
        ServedModel(model_id, ds, aliases[model_id]) for model_id, ds in deployments.items()
    )
    registry.on_close.append(providers.close)
    return registry


async def start_engines(registry: ModelRegistry) -> None:
    await asyncio.gather(*(d.engine.start() for d in registry.deployments))
    for d in registry.deployments:
        if isinstance(d.source, BundleSource):
            d.bundle = d.source.loaded
            d.size = d.source.size
    registry.ready = True
    _log.info("ready: serving %s", ", ".join(registry.names()))


async def stop_engines(registry: ModelRegistry) -> None:
    registry.ready = False
    await asyncio.gather(*(d.engine.stop() for d in registry.deployments), return_exceptions=True)
    for close in registry.on_close:
        close()
