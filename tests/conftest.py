"""Fixtures shared by every test layer."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.default_model import ensure_default_model


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir holding the real Gemma 3 270M GGUF, assembled once per session."""
    data = tmp_path_factory.mktemp("model-data")
    ensure_default_model(data)
    return data


@pytest.fixture(scope="session")
def gguf_path(model_dir: Path) -> Path:
    path = ensure_default_model(model_dir)
    assert path.stat().st_size == 253_113_024
    return path


@pytest.fixture
def seeded_data_dir(tmp_path: Path, model_dir: Path) -> Path:
    """A fresh data dir that already holds the verified model (hard links: no 253 MB copy)."""
    data = tmp_path / "data"
    (data / "models").mkdir(parents=True)
    for item in (model_dir / "models").iterdir():
        (data / "models" / item.name).hardlink_to(item)
    return data
