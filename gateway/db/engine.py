"""Async engines for SQLite (the data dir's `airgate.db`, WAL) and PostgreSQL (asyncpg)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def create_db_engine(url: str, **kwargs: Any) -> AsyncEngine:
    """An async engine; SQLite gets WAL, FULL sync (a commit is durable), foreign keys on
    and a busy timeout, so the CLI can read while a server writes."""
    engine = create_async_engine(url, **kwargs)
    if engine.dialect.name == "sqlite":

        @event.listens_for(engine.sync_engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=FULL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=5000")
            cursor.close()

    return engine
