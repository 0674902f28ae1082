"""The benchmarks still run: ``bundles`` and ``access`` whole in their ``--quick`` form, the
audit throughput command (``python -m bench.audit_throughput``) on SQLite, and every scenario
that needs a peer or a long-running server (edge, http, vllm, structured, embeddings, choices,
the soak) up to its set-up
(``--check``: configuration, keys and command lines built and validated, nothing started).

Each runs the benchmark's command line as a subprocess from the repository root, as a user
does, with a temporary ``--cache-dir`` and none of the caller's ``AIRGATE_*`` variables.
"""

from __future__ import annotations

import argparse
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


def test_audit_throughput_writes_its_section_only_where_told(tmp_path: Path) -> None:
    """`python -m bench.audit_throughput` end to end on SQLite (the PostgreSQL measurement runs
    in tests/integration/test_audit_store.py): every run's log verifies (else no section), and
    the section goes to `--output`, never to BENCHMARKS.md."""
    benchmarks = (ROOT / "BENCHMARKS.md").read_bytes()
    output = tmp_path / "benchmarks.md"
    done = _bench(
        "bench.audit_throughput",
        "--quick",
        "--database",
        "sqlite",
        "--output",
        str(output),
        timeout=300,
    )
    # 0, or 1 when this machine misses the target; a crash leaves no section behind
    assert done.returncode in (0, 1) and "Traceback" not in done.stderr, done.stderr[-3000:]
    section = output.read_text()
    assert "<!-- bench:audit:start -->" in section and "<!-- bench:audit:end -->" in section
    assert "## Audit log: events/s with a signed checkpoint per group commit" in section
    assert _figure(section, "SQLite (WAL, synchronous=FULL)", 1) > 0
    assert _figure(section, "SQLite (WAL, synchronous=FULL)", 3) >= 2  # open, close, batches
    assert "PostgreSQL" not in section.split("| Database |", 1)[1]
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
                   "policy version",
                   "llama-server: `", "--embeddings --pooling mean", "-m bench.embeddings_st",
                   "decoded as airgate's EmbeddingsRequest"],
    "choices": [" serve --port ", "an app key created",
                "decoded as airgate's ChatCompletionRequest", "(n=4, and 4 x n=1"],
    "replicas": ["parsed as `airgate serve`; audit on SQLite",
                 "parsed as `airgate serve`; audit on PostgreSQL, 2 pinned key(s)",
                 "audit chains: one chain each", "HAProxy, 2 replica(s): `haproxy -f "],
    "audit-signing": ["open_audit_signer", "[audit.signer] configurations loaded by airgate: "
                      "local, pkcs11, vault-transit, aws-kms", "signs of a 200-byte message"],
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


def _args(tmp_path: Path) -> argparse.Namespace:
    return argparse.Namespace(
        command="python -m bench", quick=False, threads=2, slots=8, no_engine_env=False,
        server_env=[], cache_dir=tmp_path, max_foreign_load=0.05,
    )  # fmt: skip


def test_embeddings_section_renders(tmp_path: Path) -> None:
    """The section from a made-up record: every batch size's figures, the ratios per round and
    the vectors' agreement (the full run takes minutes; a crash in the report would lose it)."""
    from bench.embeddings_report import Results, Round, render
    from bench.embeddings_servers import BATCHES, Level, ServerOutcome
    from bench.embeddings_st import StLevel, StOutcome

    vectors = [[1.0, 0.0], [0.6, 0.8]]

    def server(name: str, wall_s: float) -> ServerOutcome:
        levels = [Level(batch=b, requests=512 // b, inputs=512, prompt_tokens=512 * 64,
                        wall_s=wall_s, latencies_s=[0.1, 0.2]) for b in BATCHES]  # fmt: skip
        return ServerOutcome(server=name, ready_s=1.0, warmup_s=0.1, warmup_vectors=vectors,
                             levels=levels)  # fmt: skip

    st = StOutcome(load_s=1.0, versions={"torch": "x"}, warmup_vectors=vectors,
                   levels=[StLevel(batch=b, inputs=512, wall_s=8.0) for b in BATCHES])  # fmt: skip
    one = Round(first="airgate", airgate=server("airgate", 4.0),
                llama_server=server("llama-server", 5.0), st=st, foreign_share=0.01)  # fmt: skip
    results = Results(gguf_name="m.gguf", gguf_sha256="0" * 64, inputs_per_level=512,
                      rounds=[one, one])  # fmt: skip
    out = render(_args(tmp_path), results)
    assert out.startswith("## Embeddings: airgate against llama-server and sentence-transformers")
    for batch in BATCHES:
        assert _figure(out, f"batch {batch}: inputs/s, airgate / llama-server", 1) == 1.25
        assert _figure(out, f"batch {batch}: inputs/s, airgate / sentence-transformers", 1) == 2
    assert "lowest cosine over the 16 warm-up inputs, airgate against llama-server 1.000000" in out


def test_choices_section_renders(tmp_path: Path) -> None:
    from bench.choices_report import Results, Round, render
    from bench.choices_stream import ModeResult

    def mode(kind: str, wall_s: float, ttfts: list[float]) -> ModeResult:
        return ModeResult(mode=kind, choices=4, wall_s=wall_s, completion_tokens=256,  # type: ignore[arg-type]
                          prompt_tokens=311, ttfts_s=ttfts)  # fmt: skip

    pair = (mode("n", 2.0, [0.4] * 4), mode("separate", 3.0, [0.5, 0.6, 0.7, 0.8]))
    one = Round(ready_s=3.0, pairs=[pair, pair], firsts=["n=4", "4 requests"], foreign_share=0.0)
    results = Results(choices=4, max_tokens=64, prompt_words=300, rounds=[one])
    out = render(_args(tmp_path), results)
    assert out.startswith("## Choices: one n=4 request against 4 concurrent requests")
    assert _figure(out, "one request, n=4", 3) == 128
    assert _figure(out, "aggregate tokens/s, one n=4 request / 4 concurrent requests", 1) == 1.5
    assert _figure(out, "TTFT of the last choice, n=4 / 4 requests", 1) == 0.5
    assert "311 prompt tokens" in out and "| PASS |" in out
