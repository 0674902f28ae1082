"""The processes an `AsyncLLM` runs: found before shutdown, waited for after.

vLLM's shutdown sends SIGTERM, waits up to five seconds, then SIGKILLs what is left and returns
without waiting for it to die; `stop()` promises that the engine's processes are gone.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

__all__ = ["EngineProcesses"]

_log = logging.getLogger("airgate.vllm")


class EngineProcesses:
    """The engine-core processes of one `AsyncLLM` and their descendants (model workers)."""

    def __init__(self, llm: Any) -> None:
        import psutil

        resources = getattr(llm.engine_core, "resources", None)
        manager = getattr(resources, "engine_manager", None)
        # multiprocessing's own handles for the direct children: joining them reaps them.
        self._children: list[Any] = list(getattr(manager, "processes", ()))
        self._descendants: list[Any] = []
        for proc in self._children:
            with contextlib.suppress(psutil.NoSuchProcess, ValueError):
                self._descendants += psutil.Process(proc.pid).children(recursive=True)

    def wait(self, timeout_s: float = 30.0) -> None:
        """Blocking: until every process has exited (or `timeout_s`, then a warning)."""
        import psutil

        deadline = time.monotonic() + timeout_s
        for proc in self._children:
            proc.join(max(0.0, deadline - time.monotonic()))
        _, alive = psutil.wait_procs(
            self._descendants, timeout=max(0.0, deadline - time.monotonic())
        )
        left = [p for p in self._children if p.is_alive()] + alive
        if left:
            _log.warning("vLLM engine processes still running after stop: %d", len(left))
