"""One writer per chain: a PostgreSQL session advisory lock held while the writer runs.

Two processes configured with the same chain would otherwise race for its sequence numbers
and sign over each other's rows.  The lock lives as long as one dedicated connection: a clean
stop releases it, and a process that dies (even `kill -9`) loses its connection and with it
the lock, so its successor takes over as soon as the server notices, which `acquire` waits for
(`wait_s`).  SQLite needs none: its database lives in the data directory, which `serve` locks.
"""

from __future__ import annotations

import asyncio
import hashlib
import time

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .errors import AuditChainBusy, AuditUnavailable

__all__ = ["ChainLease"]

_NAMESPACE = b"airgate-audit-chain\0"


def _lock_key(log_id: str) -> int:
    digest = hashlib.sha256(_NAMESPACE + log_id.encode("ascii")).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class ChainLease:
    def __init__(self, engine: AsyncEngine, log_id: str) -> None:
        self._engine = engine
        self._log_id = log_id
        self._conn: AsyncConnection | None = None

    async def acquire(self, wait_s: float = 10.0) -> None:
        """Hold the chain, waiting up to `wait_s` for a previous holder's session to end.
        Raises `AuditChainBusy`, or `AuditUnavailable` when the database cannot be reached."""
        if self._engine.dialect.name != "postgresql" or self._conn is not None:
            return
        try:
            await self._acquire(wait_s)
        except AuditChainBusy:
            raise
        except Exception as exc:
            raise AuditUnavailable("the audit log is unavailable") from exc

    async def _acquire(self, wait_s: float) -> None:
        conn = await self._engine.connect()
        query = text("SELECT pg_try_advisory_lock(:key)").bindparams(key=_lock_key(self._log_id))
        deadline = time.monotonic() + wait_s
        try:
            while not (await conn.execute(query)).scalar():
                await conn.rollback()  # no transaction held open while waiting
                if time.monotonic() >= deadline:
                    raise AuditChainBusy(
                        f"audit chain {self._log_id} is being written by another running "
                        "process: give each replica its own `[audit] chain`"
                    )
                await asyncio.sleep(0.2)
            await conn.commit()  # a session lock outlives the transaction that took it
        except BaseException:
            await conn.close()
            raise
        self._conn = conn

    async def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            # end the session rather than unlock and pool it: a pooled session would keep the
            # lock if the unlock went wrong
            await conn.invalidate()
        finally:
            await conn.close()
