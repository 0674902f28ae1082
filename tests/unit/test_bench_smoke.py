"""The benchmarks still run: ``bundles`` and ``access`` whole in their ``--quick`` form, and
every scenario that needs a peer or a long-running server (edge, http, vllm, structured,
embeddings, choices, the soak) up to its set-up
(``--check``: configuration, keys and command lines built and validated, nothing started).

Each runs the benchmark's command line as a subprocess from the repository root, as a user
does, with a temporary ``--cache-dir`` and none of the caller's ``AIRGATE_*`` variables.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench(module: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRGATE_")}
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _figure(section: str, row: str, column: int) -> float:
    """The number in ``column`` (0: the label) of the table row starting with ``row``, with
    any ``(min–max)`` spread left out."""
    line = next(x for x in section.splitlines() if x.startswith(f"| {row} |"))
    cell = line.strip("|").split("|")[column].strip()
    return float(cell.split(" (")[0].replace(",", ""))


@pytest.mark.engine
def test_access_quick_writes_its_tables(tmp_path: Path) -> None:
    """The access stack through the gateway's own admission API (policy, limits, both audit
    events, the refund) on SQLite and PostgreSQL: a change to that API breaks this test."""
    done = _bench(
        "bench", "--quick", "--scenario", "access", "--cache-dir", str(tmp_path), timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert out.startswith("## Access stack: audit throughput and the latency access control adds")
    assert _figure(out, "SQLite (WAL, FULL sync)", 1) > 0
    assert _figure(out, "PostgreSQL 15", 1) > 0
    for row in (
        "strict, SQLite synchronous=FULL (default)",
        "strict, PostgreSQL",
        "non-strict (events queued), SQLite",
    ):
        assert 0 < _figure(out, row, 1) <= _figure(out, row, 2)


@pytest.mark.engine
def test_bundles_quick_writes_its_tables(tmp_path: Path) -> None:
    benchmarks = (ROOT / "BENCHMARKS.md").read_bytes()
    done = _bench(
        "bench", "--quick", "--scenario", "bundles", "--cache-dir", str(tmp_path), timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert out.startswith("## Bundles: sealing, loading and decrypt throughput")
    assert "1 run(s)" in out and "2 alternated rounds per run" in out
    for header in (
        "| Step | Seconds | MiB/s |",
        "| Throughput, one core | MiB/s |",
        "| Check | Figure | Target | Result |",
    ):
        assert header in out
    assert _figure(out, "seal (encrypt + digests + sign)", 1) > 0
    assert _figure(out, "copy the plain file (read, write, fsync)", 2) > 0
    for load in ("load plain GGUF -> engine started", "load bundle -> engine started"):
        assert _figure(out, load, 1) > 0
    for piece in ("decrypt (AES-256-GCM) + plaintext SHA-256", "decrypt alone", "SHA-256 alone"):
        assert _figure(out, piece, 1) > 0
    checks = re.findall(r"^\| (.+?) \| .+ \| (PASS|FAIL|\(context\)) \|$", out, re.MULTILINE)
    assert [label for label, _ in checks] == [
        "decrypt + verify, one core (MiB/s)",
        "bundle load / plain load (per-run medians)",
        "bundle load / plain load after a SHA-256 check",
    ]
    # --quick prints only: BENCHMARKS.md is left as it was
    assert (ROOT / "BENCHMARKS.md").read_bytes() == benchmarks


_CHECKED = {
    "edge": ["airgate: `", " serve --port ", "an app key created", "llama-server: `",
             "-m llama_cpp.server", "raw baseline: `", "request bodies"],
    "http": ["airgate: `", " serve --config ", "policy version", "bare route: `",
             "bench.bare_app:app", "LiteLLM: `", "wrk: `wrk -t1 -c64", "request bodies"],
    "vllm": ["ran `airgate kms init`", "ran `airgate signing-key create`",
             "parsed as `airgate bundle create`", " serve --port ", "policy version",
             "vllm serve: `", "vllm.entrypoints.openai.api_server",
             "parsed by vLLM's own parser", "request bodies"],
    "structured": ["20 application schemas", "-m bench.structured_engines", " serve --port ",
                   "an app key created", "llama-server: `", "request bodies"],
    "embeddings": ["all-minilm-l6-v2-f32.gguf converted by airgate's converter",
                   "inputs per round, each 64 tokens", " serve --port ", "an app key created",
                   "llama-server: `", "--embeddings --pooling mean", "-m bench.embeddings_st",
                   "decoded as airgate's EmbeddingsRequest"],
    "choices": [" serve --port ", "an app key created",
                "decoded as airgate's ChatCompletionRequest", "(n=4, and 4 x n=1"],
}  # fmt: skip


@pytest.mark.parametrize("scenario", sorted(_CHECKED))
def test_scenario_sets_up(scenario: str, tmp_path: Path) -> None:
    done = _bench(
        "bench", "--check", "--scenario", scenario, "--cache-dir", str(tmp_path), timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(f"## {scenario}: set-up checked, nothing started\n")
    for text in _CHECKED[scenario]:
        assert text in done.stdout
    assert not any(tmp_path.iterdir()), "--check wrote into the cache dir"


def test_soak_sets_up(tmp_path: Path) -> None:
    done = _bench("bench.soak", "--check", "--cache-dir", str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("## soak: set-up checked, nothing started\n")
    assert " serve --port " in done.stdout and "an app key created" in done.stdout
    assert re.search(r"- 64 requests planned: \d+ ", done.stdout)
    assert not any(tmp_path.iterdir()), "--check wrote into the cache dir"


@pytest.mark.parametrize(
    ("option", "error"),
    [
        ("--server-arg=--no-such-option", "`airgate serve` refuses"),
        ("--server-env=AIRGATE_NO_SUCH_SETTING=1", "airgate would refuse its configuration"),
    ],
)
def test_check_fails_on_a_set_up_airgate_refuses(option: str, error: str, tmp_path: Path) -> None:
    done = _bench(
        "bench", "--check", "--scenario", "edge", option, "--cache-dir", str(tmp_path), timeout=300
    )
    assert done.returncode == 1, done.stdout
    assert error in done.stderr
