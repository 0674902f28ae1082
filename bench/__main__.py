"""Command line: ``python -m bench [--quick] [--runs N] [--scenario NAME] [scenario options]``.

Each scenario module offers ``NAME``, ``add_arguments(parser)``, ``run(args) -> str`` (the
markdown body of its section) and ``check(args) -> str``; this module writes the body of ``run``
into BENCHMARKS.md between the scenario's markers. A full run writes BENCHMARKS.md; ``--quick``
(one run, few requests: a smoke check) only prints, unless ``--output`` is given.

``--check`` runs each selected scenario up to its set-up and no further: it parses the options,
imports every module the scenario uses, builds what a run builds (airgate's configuration and
policy files, loaded with airgate's own settings and policy code; app keys in fresh data dirs;
the command lines of airgate, parsed by airgate's own CLI, and of the peers; request bodies) in a
temporary directory (never the cache), prints a summary per scenario and exits 0, or 1 naming
what would break. It starts no server or peer, installs, builds and downloads nothing, and
contacts no database or Redis; tools a run needs (wrk) are reported, not required.
``python -m bench.soak --check`` does the same for the soak.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from bench import (
    access,
    audit_signing,
    bundles,
    choices,
    edge,
    egress,
    embeddings,
    http_path,
    ollama_api,
    replicas,
    structured,
    vllm_peer,
)
from bench._client import BenchError
from bench._report import REPO_ROOT, default_cache_dir, redacted_argv, write_section


class Scenario(Protocol):
    NAME: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> str: ...

    def check(self, args: argparse.Namespace) -> str: ...


SCENARIOS: dict[str, Scenario] = {
    edge.NAME: edge,
    bundles.NAME: bundles,
    access.NAME: access,
    vllm_peer.NAME: vllm_peer,
    http_path.NAME: http_path,
    egress.NAME: egress,
    structured.NAME: structured,
    embeddings.NAME: embeddings,
    choices.NAME: choices,
    ollama_api.NAME: ollama_api,
    audit_signing.NAME: audit_signing,
    replicas.NAME: replicas,
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description="airgate benchmarks; results go to BENCHMARKS.md"
    )
    parser.add_argument(
        "--scenario",
        action="append",
        choices=sorted(SCENARIOS),
        help="scenario to run (repeatable; default: all)",
    )
    parser.add_argument("--runs", type=int, default=3, help="repetitions (default 3)")
    parser.add_argument("--quick", action="store_true", help="smoke check: 1 run, few requests")
    parser.add_argument(
        "--check",
        action="store_true",
        help="set-up only: build and validate each scenario's configuration and command lines "
        "in a temporary directory; start, install and write nothing else",
    )
    parser.add_argument(
        "--output",
        type=Path,
        help="file to write (default BENCHMARKS.md at the repo root; --quick: print only)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=default_cache_dir(),
        help="model, server data dir and logs (default ~/.cache/airgate/bench)",
    )
    for scenario in SCENARIOS.values():
        scenario.add_arguments(parser)
    return parser


def _check(args: argparse.Namespace, names: Sequence[str]) -> int:
    """``--check``: each scenario's set-up, built in a temporary directory."""
    for name in names:
        with tempfile.TemporaryDirectory(prefix=f"airgate-bench-check-{name}-") as tmp:
            args.cache_dir = Path(tmp)
            try:
                summary = SCENARIOS[name].check(args)
            except BenchError as exc:
                print(f"bench: {name}: {exc}", file=sys.stderr)
                return 1
        print(summary)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.runs < 1:
        print("bench: --runs must be at least 1", file=sys.stderr)
        return 2
    args.command = shlex.join(["python", "-m", "bench", *redacted_argv(argv)])
    names = args.scenario or sorted(SCENARIOS)
    if args.check:
        return _check(args, names)
    output: Path | None = args.output
    if output is None and not args.quick:
        output = REPO_ROOT / "BENCHMARKS.md"
    for name in names:
        try:
            body = SCENARIOS[name].run(args)
        except BenchError as exc:
            print(f"bench: {name}: {exc}", file=sys.stderr)
            return 1
        print(body)
        if output is not None:
            write_section(output, name, body)
            print(f"bench: wrote the {name} section of {output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
