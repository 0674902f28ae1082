"""Repeated runs on a shared machine: the options every load scenario shares, and the loop that
discards a run other processes disturbed.

A run during which other processes used more than ``--max-foreign-load`` of the CPUs (measured
with ``bench._report.foreign_cpu_share``) is discarded and repeated: on a 2-core machine one busy
neighbour thread halves an engine's speed. After more discarded runs than wanted ones the
scenario gives up: the machine is not quiet enough to measure on.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
from collections.abc import Callable
from typing import Protocol, TypeVar

from bench._client import BenchError
from bench._report import say

__all__ = ["MAX_FOREIGN_LOAD", "add_run_options", "quiet_runs"]

MAX_FOREIGN_LOAD = 0.05  # share of the CPUs other processes may use before a run is repeated
READY_TIMEOUT_S = 300.0


class _Disturbable(Protocol):
    @property
    def foreign_share(self) -> float: ...  # of all CPUs, used by other processes during the run


R = TypeVar("R", bound=_Disturbable)


def add_run_options(group: argparse._ArgumentGroup) -> None:
    """``--max-foreign-load`` and ``--ready-timeout``: declared by every scenario that starts
    servers, with one meaning for all; the first declaration stands."""
    with contextlib.suppress(argparse.ArgumentError):
        group.add_argument(
            "--max-foreign-load",
            type=float,
            default=MAX_FOREIGN_LOAD,
            metavar="SHARE",
            help="repeat a run in which other processes used more than this share of the CPUs "
            f"(default {MAX_FOREIGN_LOAD}; 1 disables)",
        )
    with contextlib.suppress(argparse.ArgumentError):
        group.add_argument(
            "--ready-timeout",
            type=float,
            default=READY_TIMEOUT_S,
            help="seconds to wait for /ready",
        )


def quiet_runs(
    runs: int, max_foreign_load: float, one_run: Callable[[int, int], R]
) -> tuple[list[R], int]:
    """``runs`` results of ``one_run(kept, attempt)`` (``kept``: results kept so far,
    ``attempt``: calls so far), each taken while other processes left the CPUs alone; returns
    them and how many were discarded."""
    kept: list[R] = []
    discarded = 0
    for attempt in itertools.count():
        if len(kept) >= runs:
            break
        if discarded > runs:
            raise BenchError(
                f"{discarded} runs discarded: other processes kept more than "
                f"{max_foreign_load:.0%} of the CPUs busy; run on a quiet machine"
            )
        result = one_run(len(kept), attempt)
        if result.foreign_share > max_foreign_load:
            discarded += 1
            say(f"  discarded: other processes used {result.foreign_share:.0%} of the CPUs")
            continue
        kept.append(result)
    return kept, discarded
