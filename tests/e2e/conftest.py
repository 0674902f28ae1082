"""End-to-end fixtures: one `airgate serve` per test module (8 slots x 2,048 tokens)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from server_process import Server, seed_data_dir, start_server, stop_and_check


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Server]:
    """The module's server: 8 slots x 2,048 tokens, ready; stopped (and checked) at the end."""
    root = tmp_path_factory.mktemp("e2e-server")
    srv = start_server(seed_data_dir(root / "data", model_dir), root / "server.log")
    yield srv
    stop_and_check(srv)
