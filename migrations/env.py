"""Alembic environment for the audit/keys database: async online mode, offline `--sql` mode.

Run from code by `gateway.db.migrate` (which hands over an open connection in
`config.attributes["connection"]`, or the URL in `config.attributes["url"]`), or by the
`alembic` command with `sqlalchemy.url` set.  `target_metadata` is the shared
`gateway.db.metadata` with every table module that exists in this installation imported.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.pool import NullPool

import gateway.audit.schema  # noqa: F401  (registers the audit tables on the metadata)
from gateway.db import create_db_engine, metadata


def _module_exists(name: str) -> bool:
    parent = name.rpartition(".")[0]
    found = importlib.util.find_spec(parent) is not None  # find_spec(a.b) raises without a
    return found and importlib.util.find_spec(name) is not None


if _module_exists("gateway.access.auth.schema"):
    importlib.import_module("gateway.access.auth.schema")

config = context.config
target_metadata = metadata


def _url() -> str:
    url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database URL: pass one to gateway.db.migrate or set sqlalchemy.url")
    return str(url)


def run_migrations_offline() -> None:
    """Write the SQL for a DBA to apply (`alembic upgrade head --sql`)."""
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def do_run_migrations(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite cannot ALTER much
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def run_async_migrations() -> None:
    engine = create_db_engine(_url(), poolclass=NullPool)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(do_run_migrations)
    finally:
        await engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
elif (shared := config.attributes.get("connection")) is not None:
    do_run_migrations(shared)
else:
    asyncio.run(run_async_migrations())
