"""`airgate ls` and `ps` columns: sizes in Ollama's decimal units, the processor from
`size_vram` against `size`, and `-` for whatever the server did not say."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.cli.run import _processor, _size


@pytest.mark.parametrize(
    ("model", "shown"),
    [
        ({"size": 291_545_216}, "291 MB"),
        ({"size": 4_920_000_000}, "4.9 GB"),
        ({"size": 22_700_000}, "22 MB"),
        ({"size": 1_500}, "1.5 KB"),
        ({"size": 12}, "12 B"),
        ({}, "-"),
        ({"size": None}, "-"),
        ({"size": "big"}, "-"),
    ],
)
def test_size(model: dict[str, Any], shown: str) -> None:
    assert _size(model) == shown


@pytest.mark.parametrize(
    ("model", "shown"),
    [
        ({"size": 100, "size_vram": 0}, "100% CPU"),
        ({"size": 100, "size_vram": 100}, "100% GPU"),
        ({"size": 100, "size_vram": 25}, "75%/25% CPU/GPU"),
        ({"size": 100}, "-"),  # vLLM: its share in GPU memory is not known
        ({"size_vram": 0}, "-"),
        ({"size": 0, "size_vram": 0}, "-"),
    ],
)
def test_processor(model: dict[str, Any], shown: str) -> None:
    assert _processor(model) == shown
