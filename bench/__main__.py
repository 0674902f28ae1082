"""Command line: ``python -m bench [--quick] [--runs N] [--scenario NAME] [scenario options]``.

Each scenario module offers ``NAME``, ``add_arguments(parser)`` and ``run(args) -> str`` (the
markdown body of its section); this module writes that body into BENCHMARKS.md between the
scenario's markers. A full run writes BENCHMARKS.md; ``--quick`` (one run, few requests: a smoke
check) only prints, unless ``--output`` is given.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from bench import access, bundles, edge, http_path, vllm_peer
from bench._client import BenchError
from bench._report import REPO_ROOT, default_cache_dir, redacted_argv, write_section


class Scenario(Protocol):
    NAME: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> str: ...


SCENARIOS: dict[str, Scenario] = {
    edge.NAME: edge,
    bundles.NAME: bundles,
    access.NAME: access,
    vllm_peer.NAME: vllm_peer,
    http_path.NAME: http_path,
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


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.runs < 1:
        print("bench: --runs must be at least 1", file=sys.stderr)
        return 2
    args.command = shlex.join(["python", "-m", "bench", *redacted_argv(argv)])
    output: Path | None = args.output
    if output is None and not args.quick:
        output = REPO_ROOT / "BENCHMARKS.md"
    for name in args.scenario or sorted(SCENARIOS):
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
