"""Benchmark reporting: environment header, statistics, tables, and the BENCHMARKS.md writer.

Each scenario owns the text between ``<!-- bench:NAME:start -->`` and ``<!-- bench:NAME:end -->``
in BENCHMARKS.md. ``write_section`` replaces only that text (appending the markers when they
are missing), so scenarios run at different times never overwrite each other or the prose
around them.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CpuSample",
    "Environment",
    "Spread",
    "collect_environment",
    "cpu_sample",
    "default_cache_dir",
    "foreign_cpu_share",
    "markdown_table",
    "percentile",
    "redacted_argv",
    "replace_section",
    "say",
    "write_section",
]

REPO_ROOT = Path(__file__).resolve().parents[1]

_FILE_HEADER = """# Benchmarks

Written by `python -m bench` (see `bench/`). Each scenario rewrites only the text between its
`<!-- bench:NAME:start -->` and `<!-- bench:NAME:end -->` markers; edit outside them freely.
"""


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation, as numpy's default."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True, slots=True)
class Spread:
    """Median, minimum and maximum of one figure over repeated runs."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        data = list(values)
        return cls(statistics.median(data), min(data), max(data))

    def format(self, spec: str) -> str:
        """``median (min-max)``; only the median when every run gave the same figure."""
        if len({format(v, spec) for v in (self.median, self.low, self.high)}) == 1:
            return format(self.median, spec)
        return f"{self.median:{spec}} ({self.low:{spec}}–{self.high:{spec}})"


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[str]], right: int = 1) -> str:
    """A GitHub table; columns from index ``right`` on are right-aligned (numbers)."""
    aligns = [":---" if i < right else "---:" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(aligns) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Environment:
    """Where and with what a benchmark ran."""

    date: str
    cpu: str
    cores: str
    memory: str
    system: str
    python: str
    packages: tuple[tuple[str, str], ...]
    commit: str
    command: str

    def markdown(self) -> str:
        versions = "; ".join(f"{name} {version}" for name, version in self.packages)
        return "\n".join(
            [
                f"- Date: {self.date}",
                f"- Machine: {self.cpu}, {self.cores}, {self.memory} RAM; {self.system}",
                f"- Python {self.python}; {versions}",
                f"- airgate commit: {self.commit}",
                f"- Command: `{self.command}`",
            ]
        )


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return match.group(1).strip() if match else platform.machine()


def _cores() -> str:
    total = os.cpu_count() or 0
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else total
    return f"{total} cores" if usable == total else f"{total} cores ({usable} usable)"


def _memory() -> str:
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return "? GiB"
    match = re.search(r"^MemTotal:\s*(\d+) kB", text, re.MULTILINE)
    return f"{int(match.group(1)) / 2**20:.1f} GiB" if match else "? GiB"


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _commit() -> str:
    head = _git("rev-parse", "--short=12", "HEAD")
    if head is None:
        return "none (no commit yet)"
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return f"{head} (with uncommitted changes)" if dirty else head


def collect_environment(command: str, distributions: Sequence[str]) -> Environment:
    """Describe this machine, the given distributions' versions and the git commit."""
    return Environment(
        date=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        cpu=_cpu_model(),
        cores=_cores(),
        memory=_memory(),
        system=f"{platform.system()} {platform.release()}",
        python=platform.python_version(),
        packages=tuple((name, _version(name)) for name in distributions),
        commit=_commit(),
        command=command,
    )


@dataclass(frozen=True, slots=True)
class CpuSample:
    """System-wide busy CPU time and this process tree's CPU time at one instant."""

    wall_s: float
    busy_s: float  # every CPU, every process (/proc/stat)
    own_s: float  # this process and its reaped children


def cpu_sample() -> CpuSample | None:
    """A sample for ``foreign_cpu_share``; None where /proc/stat is unavailable."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    # steal (8th field) is time taken by the hypervisor: count it as busy, it slows us too
    ticks = os.sysconf("SC_CLK_TCK")
    own = os.times()
    return CpuSample(
        wall_s=time.monotonic(),
        busy_s=(sum(fields[:8]) - idle) / ticks,
        own_s=own.user + own.system + own.children_user + own.children_system,
    )


def foreign_cpu_share(before: CpuSample | None, after: CpuSample | None) -> float:
    """Share of all CPUs used by other processes between two samples (0 when unknown).

    Children count as ours once reaped, so take ``after`` when every child has exited.
    """
    if before is None or after is None or after.wall_s <= before.wall_s:
        return 0.0
    foreign = (after.busy_s - before.busy_s) - (after.own_s - before.own_s)
    capacity = (after.wall_s - before.wall_s) * (os.cpu_count() or 1)
    return max(0.0, foreign / capacity)


def say(message: str) -> None:
    """A progress line on stderr (stdout carries the report)."""
    print(message, file=sys.stderr, flush=True)


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"


def replace_section(document: str, name: str, body: str) -> str:
    """``document`` with the section ``name`` set to ``body`` (appended if absent)."""
    start, end = _markers(name)
    block = f"{start}\n{body.strip()}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.DOTALL)
    if pattern.search(document):
        return pattern.sub(lambda _: block, document, count=1)
    return document.rstrip("\n") + "\n\n" + block + "\n"


def write_section(path: Path, name: str, body: str) -> None:
    """Rewrite one scenario's section of ``path`` atomically, creating the file if needed."""
    document = path.read_text() if path.exists() else _FILE_HEADER
    updated = replace_section(document, name, body)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(updated)
    os.replace(tmp, path)


def publish(module: str, name: str, body: str, output: Path | None, *, full: bool) -> None:
    """Print a scenario's section and write it to ``output``; without one, a full run (not a
    quick or partial one) writes it to BENCHMARKS.md."""
    print(body)
    if output is None and full:
        output = REPO_ROOT / "BENCHMARKS.md"
    if output is not None:
        write_section(output, name, body)
        say(f"{module}: wrote the {name} section of {output}")


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "airgate" / "bench"


_SECRET_OPTIONS = ("--api-key",)


def redacted_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with secret option values replaced, fit to be written into BENCHMARKS.md."""
    shown: list[str] = []
    hide_next = False
    for arg in argv:
        option, sep, _ = arg.partition("=")
        if hide_next:
            shown.append("***")
        elif option in _SECRET_OPTIONS and sep:
            shown.append(f"{option}=***")
        else:
            shown.append(arg)
        hide_next = arg in _SECRET_OPTIONS
    return shown
