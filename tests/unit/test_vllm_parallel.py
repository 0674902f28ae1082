"""vLLM beyond one GPU: the `[models.vllm]` parallelism settings, their way into vLLM's engine
arguments, and the executors refused before anything loads (pure: vLLM is not started)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Any, Literal

import pytest

from backends.vllm import VllmEngine, VllmOptions
from backends.vllm._start import engine_arguments
from gateway.config import ConfigError, ModelSettings, Settings, VllmSettings, load_settings
from gateway.engines import runtime
from gateway.engines.runtime import build_registry


def _settings(tmp_path: Path, vllm: str) -> Settings:
    """A plain-path vLLM model (served only with --insecure-plaintext-model) with `vllm` as
    its [models.vllm] section."""
    config = tmp_path / "airgate.toml"
    config.write_text(
        '[[models]]\nid = "llama"\nengine = "vllm"\npath = "/models/llama"\n\n'
        f"[models.vllm]\n{vllm}\n"
    )
    return load_settings(config, environ={}, overrides={"data_dir": str(tmp_path / "data")})


def test_defaults_are_one_gpu_and_vllms_choice(tmp_path: Path) -> None:
    vllm = _settings(tmp_path, "").models[0].vllm
    assert vllm is not None
    assert (vllm.tensor_parallel_size, vllm.pipeline_parallel_size) == (1, 1)
    assert vllm.distributed_executor_backend is None


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("tensor_parallel_size = 8\npipeline_parallel_size = 8", id="64-workers"),
        pytest.param('pipeline_parallel_size = 4\ndistributed_executor_backend = "mp"', id="mp"),
        pytest.param('distributed_executor_backend = "ray"', id="ray-on-one-gpu"),
    ],
)
def test_accepted(tmp_path: Path, text: str) -> None:
    _settings(tmp_path, text)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        pytest.param(
            "tensor_parallel_size = 8\npipeline_parallel_size = 16",
            "tensor_parallel_size * pipeline_parallel_size is 128",
            id="more-than-64-workers",
        ),
        pytest.param("pipeline_parallel_size = 0", "models[0].vllm.pipeline_parallel_size", id="0"),
        pytest.param(
            "pipeline_parallel_size = 65", "models[0].vllm.pipeline_parallel_size", id="65"
        ),
        pytest.param(
            'distributed_executor_backend = "uni"',
            "models[0].vllm.distributed_executor_backend",
            id="unknown-backend",
        ),
    ],
)
def test_refused_naming_the_key(tmp_path: Path, text: str, names: str) -> None:
    with pytest.raises(ConfigError, match=r"models\[0\]\.vllm") as info:
        _settings(tmp_path, text)
    assert names in str(info.value)


def test_settings_reach_the_engine_arguments(tmp_path: Path) -> None:
    text = (
        'tensor_parallel_size = 4\npipeline_parallel_size = 2\ndistributed_executor_backend = "mp"'
    )
    registry = build_registry(_settings(tmp_path, text), allow_plaintext=True)
    (deployment,) = registry.deployments
    assert isinstance(deployment.engine, VllmEngine)
    args = engine_arguments("/models/llama", deployment.engine.options)
    assert args["tensor_parallel_size"] == 4
    assert args["pipeline_parallel_size"] == 2
    assert args["distributed_executor_backend"] == "mp"


def test_vllm_chooses_the_executor_by_default() -> None:
    args = engine_arguments("/models/llama", VllmOptions())
    assert args["distributed_executor_backend"] is None  # vLLM's own default: it decides
    assert (args["tensor_parallel_size"], args["pipeline_parallel_size"]) == (1, 1)


def _engine_args_fields() -> set[str]:
    """AsyncEngineArgs' field names (its own and EngineArgs'), read from the installed vLLM's
    source: importing vLLM takes seconds, and a renamed argument must fail here, not at a GPU
    host's start."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed")
    source = Path(next(iter(spec.submodule_search_locations))) / "engine" / "arg_utils.py"
    tree = ast.parse(source.read_text(encoding="utf-8"))
    classes = [
        n
        for n in tree.body
        if isinstance(n, ast.ClassDef) and n.name in ("EngineArgs", "AsyncEngineArgs")
    ]
    assert len(classes) == 2
    return {
        n.target.id
        for cls in classes
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }


def test_every_engine_argument_is_one_vllm_knows() -> None:
    options = VllmOptions(
        tensor_parallel_size=2, pipeline_parallel_size=2, distributed_executor_backend="mp"
    )
    assert set(engine_arguments("/models/llama", options)) <= _engine_args_fields()


class _Bundle:
    """A decrypted bundle as the engine sees it (never opened here)."""

    def open(self) -> str:
        raise AssertionError("nothing may load")

    def release(self) -> None:
        pass


def _bundle_model(backend: Literal["mp", "ray"] | None) -> ModelSettings:
    return ModelSettings(
        id="llama",
        engine="vllm",
        bundle="/bundles/llama.tar",
        vllm=VllmSettings(tensor_parallel_size=2, distributed_executor_backend=backend),
    )


@pytest.mark.parametrize("backend", [None, "mp"])
def test_a_bundle_loads_on_this_nodes_workers(backend: Literal["mp"] | None) -> None:
    engine = runtime._new_engine(Settings(), _bundle_model(backend), _Bundle(), None)
    assert isinstance(engine, VllmEngine)
    assert engine.options.tensor_parallel_size == 2
    assert engine.options.distributed_executor_backend == backend


def test_ray_cannot_load_a_bundle() -> None:
    # its workers may run on other nodes, where the decrypted weights are not
    with pytest.raises(ConfigError) as info:
        runtime._new_engine(Settings(), _bundle_model("ray"), _Bundle(), None)
    message = str(info.value)
    assert 'distributed_executor_backend = "ray" cannot load a bundle' in message
    assert '"mp"' in message


@pytest.mark.parametrize("installed", [False, True])
def test_ray_must_be_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, installed: bool
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        if name == "ray":
            return object() if installed else None
        return real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    settings = _settings(tmp_path, 'distributed_executor_backend = "ray"')
    if installed:
        (deployment,) = build_registry(settings, allow_plaintext=True).deployments
        assert isinstance(deployment.engine, VllmEngine)
        assert deployment.engine.options.distributed_executor_backend == "ray"
        return
    with pytest.raises(ConfigError, match='distributed_executor_backend = "ray" needs Ray'):
        build_registry(settings, allow_plaintext=True)
