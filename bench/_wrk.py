"""wrk as the HTTP load generator, CPU pinning, and the CPU time of a server's process group.

``run_wrk`` runs ``wrk`` (one thread) with ``bench/wrk/post.lua``, which POSTs ``$WRK_BODY`` with
``$WRK_TOKEN`` as Bearer and prints one ``WRK_RESULT {json}`` line (requests, errors by kind,
latency percentiles in µs); any error fails the point.  ``pinning`` puts the load generator and
the server under test on different CPUs (``taskset``) where there are two; ``group_cpu_s`` and
``wait_idle`` read a process group's CPU time from /proc.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec

from bench._client import BenchError

__all__ = [
    "Pinning",
    "WrkResult",
    "group_cpu_s",
    "pinning",
    "run_wrk",
    "wait_idle",
    "wrk_command",
    "wrk_version",
]

WRK_SCRIPT = Path(__file__).with_name("wrk") / "post.lua"


class WrkErrors(msgspec.Struct, frozen=True):
    connect: int
    read: int
    write: int
    status: int
    timeout: int


class WrkLatency(msgspec.Struct, frozen=True):
    p50: int
    p90: int
    p99: int
    max: int
    mean: int


class WrkResult(msgspec.Struct, frozen=True):
    requests: int
    duration_us: int
    bytes: int
    errors: WrkErrors
    latency_us: WrkLatency


@dataclass(frozen=True, slots=True)
class Pinning:
    """CPU lists for ``taskset -c`` (empty: not pinned)."""

    load: str = ""
    server: str = ""

    def prefix(self, cpus: str) -> list[str]:
        return ["taskset", "-c", cpus] if cpus else []


def pinning() -> Pinning:
    """wrk on the first usable CPU, the server under test on the second (if there are two)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < 2 or shutil.which("taskset") is None:
        return Pinning()
    return Pinning(load=str(cpus[0]), server=str(cpus[1]))


def wrk_command(url: str, connections: int, duration_s: int) -> list[str]:
    return ["wrk", "-t1", f"-c{connections}", f"-d{duration_s}s", "--timeout", "30s",
            "-s", str(WRK_SCRIPT), f"{url}/v1/chat/completions"]  # fmt: skip


def run_wrk(
    url: str,
    token: str,
    body: str,
    connections: int,
    duration_s: int,
    pin: Pinning,
    *,
    warm_up: bool = False,
) -> WrkResult:
    """One wrk load; BenchError when it fails, any request erred, or (unless ``warm_up``) no
    request completed."""
    env = {**os.environ, "WRK_BODY": body, "WRK_TOKEN": token}
    command = [*pin.prefix(pin.load), *wrk_command(url, connections, duration_s)]
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=duration_s + 120, check=False
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("WRK_RESULT ")), None)
    if done.returncode != 0 or line is None:
        raise BenchError(f"wrk failed (exit {done.returncode}): {done.stderr.strip()[-400:]}")
    result = msgspec.json.decode(line.partition(" ")[2], type=WrkResult)
    failed = msgspec.structs.asdict(result.errors)
    if sum(failed.values()):
        counts = ", ".join(f"{k} {v}" for k, v in failed.items() if v)
        raise BenchError(f"{sum(failed.values())} of {result.requests} requests failed ({counts})")
    if not result.requests and not warm_up:
        raise BenchError(f"no request completed in {duration_s} s (raise --http-duration)")
    return result


def wrk_version() -> str:
    done = subprocess.run(["wrk", "--version"], capture_output=True, text=True, check=False)
    first = (done.stdout or done.stderr).splitlines()[:1]
    return first[0].partition(" Copyright")[0].strip() if first else "unknown"


def group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system, reaped children included) of every process in a group."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue  # exited meanwhile
        fields = text[text.rindex(")") + 2 :].split()  # fields[0] is stat field 3 (state)
        if int(fields[2]) == pgid:
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total / ticks


def wait_idle(pgid: int, deadline_s: float = 60.0) -> None:
    """Wait until a process group stops using CPU (under 5% of a CPU over 0.3 s): requests a
    load abandoned at its end (wrk closes their connections) must not count in the next one."""
    step = 0.3
    last = group_cpu_s(pgid)
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        time.sleep(step)
        now = group_cpu_s(pgid)
        if now - last <= 0.05 * step:
            return
        last = now
    raise BenchError(f"the server kept a CPU busy for {deadline_s:.0f} s after a load ended")
