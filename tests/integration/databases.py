"""Throwaway databases for integration tests: a SQLite file, or a real PostgreSQL database on
127.0.0.1:5432 (trust auth) created for one test and dropped after it.  PostgreSQL missing is a
failure, never a skip."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
import pytest

__all__ = ["PG_HOST", "PG_PORT", "fresh_database", "postgres_database"]

PG_HOST, PG_PORT = "127.0.0.1", 5432


async def _admin() -> asyncpg.Connection:
    try:
        return await asyncpg.connect(host=PG_HOST, port=PG_PORT, user="postgres")
    except (OSError, asyncpg.PostgresError) as exc:
        pytest.fail(
            f"PostgreSQL must run on {PG_HOST}:{PG_PORT} (trust auth) for these tests: {exc}"
        )


@asynccontextmanager
async def postgres_database(prefix: str = "airgate_test") -> AsyncIterator[str]:
    """The SQLAlchemy URL of a new, empty PostgreSQL database, dropped afterwards."""
    name = f"{prefix}_{secrets.token_hex(6)}"
    admin = await _admin()
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    try:
        yield f"postgresql+asyncpg://postgres@{PG_HOST}:{PG_PORT}/{name}"
    finally:
        admin = await _admin()
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


@asynccontextmanager
async def fresh_database(kind: str, tmp_path: Path) -> AsyncIterator[str]:
    """The URL of an empty database of `kind` ("sqlite" or "postgresql")."""
    if kind == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'audit.db'}"
        return
    async with postgres_database() as url:
        yield url
