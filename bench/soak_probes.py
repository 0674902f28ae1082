"""What the soak reads off the server besides its answers: its process tree from /proc, and
its metrics and readiness once the load has stopped.

``sample_tree`` sums resident memory (VmRSS), open file descriptors and threads over the
server's process tree, every ``SAMPLE_EVERY_S`` seconds. ``after_load`` waits up to
``SETTLE_S`` for the in-flight gauges (``IDLE_GAUGES``) of /metrics to read 0, then asks /ready.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path

import httpx
import msgspec

__all__ = [
    "IDLE_GAUGES",
    "SAMPLE_EVERY_S",
    "SETTLE_S",
    "AfterLoad",
    "ProcSample",
    "after_load",
    "metric_sums",
    "peak_rss_kib",
    "sample_tree",
]

SAMPLE_EVERY_S = 10.0
SETTLE_S = 30.0  # for the in-flight gauges to reach 0 after the load
# The gauges that must read 0 once the load has stopped (summed over their label sets).
IDLE_GAUGES = {
    "airgate_router_deployment_inflight": "router in flight",
    "airgate_router_queue_depth": "router queue",
    "vllm:num_requests_running": "engine running",
    "vllm:num_requests_waiting": "engine waiting",
}


class ProcSample(msgspec.Struct, frozen=True, kw_only=True):
    at_s: float  # since the load started
    rss_kib: int
    fds: int
    threads: int
    processes: int


def _tree(root: int) -> list[int]:
    """``root`` and every descendant (from /proc/*/stat parent ids)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue  # exited meanwhile
            ppid = int(stat.rpartition(")")[2].split()[1])  # the name may hold spaces
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _status_int(status: str, field: str) -> int:
    match = re.search(rf"^{field}:\s*(\d+)", status, re.MULTILINE)
    return int(match.group(1)) if match else 0


def sample_tree(root: int, at_s: float) -> ProcSample:
    """Resident memory, open fds and threads summed over ``root``'s process tree."""
    rss = fds = threads = processes = 0
    for pid in _tree(root):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            open_fds = len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            continue
        rss += _status_int(status, "VmRSS")
        threads += _status_int(status, "Threads")
        fds += open_fds
        processes += 1
    return ProcSample(at_s=at_s, rss_kib=rss, fds=fds, threads=threads, processes=processes)


def peak_rss_kib(pid: int) -> int:
    """The peak resident memory (VmHWM) of one process, 0 when it cannot be read."""
    try:
        return _status_int(Path(f"/proc/{pid}/status").read_text(), "VmHWM")
    except OSError:
        return 0


def metric_sums(text: str) -> dict[str, float]:
    """Prometheus text exposition -> each series' value summed over its label sets."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            name = series.partition("{")[0]
            sums[name] = sums.get(name, 0.0) + float(value)
    return sums


class AfterLoad(msgspec.Struct, frozen=True, kw_only=True):
    metrics_status: int | None  # HTTP status of the last /metrics read
    gauges: dict[str, float]  # IDLE_GAUGES as last read (absent: not exported)
    idle: bool
    settle_s: float  # load end -> every gauge at 0 (or gave up)
    ready_status: int | None


async def _get_status(client: httpx.AsyncClient, path: str) -> tuple[int | None, str]:
    try:
        response = await client.get(path, timeout=10.0)
    except httpx.HTTPError:
        return None, ""
    return response.status_code, response.text


async def after_load(client: httpx.AsyncClient) -> AfterLoad:
    """Wait up to SETTLE_S for the in-flight gauges to read 0; then ask /ready."""
    start = time.monotonic()
    while True:
        status, text = await _get_status(client, "/metrics")
        sums = metric_sums(text) if status == 200 else {}
        gauges = {name: sums[name] for name in IDLE_GAUGES if name in sums}
        idle = len(gauges) == len(IDLE_GAUGES) and not any(gauges.values())
        waited = time.monotonic() - start
        if idle or waited > SETTLE_S:
            break
        await asyncio.sleep(0.5)
    ready, _ = await _get_status(client, "/ready")
    return AfterLoad(
        metrics_status=status, gauges=gauges, idle=idle, settle_s=waited, ready_status=ready
    )
