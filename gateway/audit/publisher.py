"""Handing checkpoints to the witnesses, off the commit path.

The writer tells the publisher of each new checkpoint (`offer`); a task hands the latest one
to every witness at most once per `interval_s` (each checkpoint vouches for all before it, so
skipping intermediate ones loses nothing), and `publish_now` hands one over at once (the open
and close checkpoints).  A witness that cannot be written is logged by name and error class
and counted, never fatal: the next checkpoint tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from .checkpoint import Checkpoint
from .witness import Witness, WitnessError

__all__ = ["Publisher"]

_log = logging.getLogger("airgate.audit")


class Publisher:
    def __init__(self, witnesses: Sequence[Witness], interval_s: float) -> None:
        if interval_s <= 0:
            raise ValueError("the witness interval must be > 0")
        self.witnesses = tuple(witnesses)
        self._interval = interval_s
        self._latest: Checkpoint | None = None
        self._published: Checkpoint | None = None
        self._dirty = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.published = 0  # checkpoints handed to every witness
        self.failures = 0

    def start(self) -> None:
        if self._task is None and self.witnesses:
            self._task = asyncio.create_task(self._loop(), name="audit-witness")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def offer(self, checkpoint: Checkpoint | None) -> None:
        """A new committed checkpoint, for the next publication."""
        self._latest = checkpoint
        self._dirty.set()

    async def publish_now(self, checkpoint: Checkpoint | None = None) -> None:
        """Hand `checkpoint` (default: the latest offered) to every witness now."""
        if checkpoint is not None:
            self._latest = checkpoint
        latest = self._latest
        if latest is None or latest is self._published or not self.witnesses:
            return
        for witness in self.witnesses:
            try:
                await asyncio.to_thread(witness.publish, latest)
            except WitnessError as exc:
                self.failures += 1
                _log.error("%s", exc)  # names the witness and the error class only
        self._published = latest
        self.published += 1

    async def _loop(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            await self.publish_now()
            await asyncio.sleep(self._interval)  # at most one publication per interval
