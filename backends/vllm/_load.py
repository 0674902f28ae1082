"""The engine's load: vLLM's scheduler statistics combined with this process's own count.

vLLM reports `SchedulerStats` (running, waiting, KV-cache use) after each engine step, through
the stat loggers given to `AsyncLLM`; they arrive a step late.  The front end knows at once how
many requests it has handed to the engine and not yet seen finish.  `split_load` combines both;
`admit` refuses a request that would wait beyond the engine's bound.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import EngineOverloaded

__all__ = ["SchedulerSnapshot", "admit", "split_load", "stat_logger_factory"]


class SchedulerSnapshot:
    """The latest statistics vLLM's scheduler reported (written on the event loop thread)."""

    __slots__ = ("kv_usage", "waiting")

    def __init__(self) -> None:
        self.waiting = 0
        self.kv_usage = 0.0


def split_load(in_flight: int, capacity: int, reported_waiting: int) -> tuple[int, int]:
    """(running, waiting) for `in_flight` requests, given the scheduler's last waiting count.

    `in_flight` is authoritative for the total: it counts a request from the moment submit()
    returns until its last output (or its cancellation), while the scheduler's counts lag by a
    step and can still show requests that have just finished or been aborted.  The scheduler
    decides the split: requests beyond `capacity` are waiting, and so are those it holds back
    (no KV-cache room, preempted), however many it last reported, never more than are in flight.
    """
    waiting = min(in_flight, max(in_flight - capacity, reported_waiting, 0))
    return in_flight - waiting, waiting


def admit(
    in_flight: int, sequences: int, *, capacity: int, max_waiting: int, mean_duration_s: float
) -> None:
    """Raise EngineOverloaded unless `sequences` more fit beside the `in_flight` ones within
    `capacity + max_waiting`.

    A request larger than that whole bound (many choices, many inputs to embed) is admitted
    only by an idle engine: otherwise it could never run.  Retry-After is the mean request time
    scaled by how many requests wait ahead per running slot.
    """
    limit = capacity + max_waiting
    if in_flight + min(sequences, limit) > limit:
        waiting = max(in_flight - capacity, 0)
        raise EngineOverloaded(
            f"the engine is at capacity ({min(in_flight, capacity)} running, {waiting} waiting)",
            retry_after_s=max(1.0, mean_duration_s * (waiting + 1) / capacity),
        )


def stat_logger_factory(snapshot: SchedulerSnapshot) -> Callable[[Any, int], Any]:
    """A per-engine `StatLoggerFactory` whose loggers keep `snapshot` current.

    Imports vLLM: call it only where vLLM is being started.
    """
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _SnapshotLogger(StatLoggerBase):  # type: ignore[misc]  # vLLM is Any to mypy
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self._snapshot = snapshot

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            if scheduler_stats is None:
                return
            snap = self._snapshot
            # Deferred requests (held back by a transient constraint) are waiting too.  The
            # running count is not kept: the total comes from the front end (`split_load`).
            stats = scheduler_stats
            snap.waiting = stats.num_waiting_reqs + stats.num_skipped_waiting_reqs
            snap.kv_usage = stats.kv_cache_usage

        def log_engine_initialized(self) -> None:
            pass

    return _SnapshotLogger
