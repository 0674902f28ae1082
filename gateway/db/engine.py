"""Async engines for SQLite (the data dir's `airgate.db`, WAL) and PostgreSQL (asyncpg)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

__all__ = ["create_db_engine", "database_url"]


def database_url(data_dir: str | Path, configured: str | None) -> str:
    """The configured URL, else the data dir's SQLite file.

    `postgresql://...` is accepted and rewritten to the asyncpg driver.
    """
    if configured:
        if configured.startswith("postgresql://"):
            return "postgresql+asyncpg://" + configured.removeprefix("postgresql://")
        return configured
    return f"sqlite+aiosqlite:///{Path(data_dir) / 'airgate.db'}"


def create_db_engine(
    url: str, *, sqlite_synchronous: Literal["full", "normal"] = "full", **kwargs: Any
) -> AsyncEngine:
    """An async engine.  SQLite gets WAL, foreign keys on and a busy timeout (the CLI can read
    while a server writes), and `synchronous`: FULL fsyncs every commit (it survives power
    loss); NORMAL makes a commit durable against any crash of the process, and reaches the
    disk at the next WAL checkpoint."""
    engine = create_async_engine(url, **kwargs)
    synchronous = {"full": "FULL", "normal": "NORMAL"}[sqlite_synchronous]
    if engine.dialect.name == "sqlite":

        @event.listens_for(engine.sync_engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA synchronous={synchronous}")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=5000")
            cursor.close()

    return engine
