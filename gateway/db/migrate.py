"""Schema migrations run from code: Alembic with a Config built here, no `alembic.ini` needed.

    MigrationError              the schema is not (or cannot be made) what this code expects
    ├── DatabaseUnreachable     the database did not answer
    ├── SchemaOutdated          PostgreSQL behind this code and migrating was not allowed
    └── SchemaUnknown           the database is at a revision this code does not know
                                (written by a newer airgate)

SQLite (the embedded default) is always migrated at start; a PostgreSQL database is shared and
usually upgraded by a DBA, from `offline_sql()` (`alembic upgrade head --sql`) or with
`airgate db upgrade`, so the gateway refuses to start on an outdated one unless told to migrate.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TextIO

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from .engine import create_db_engine

__all__ = [
    "DatabaseUnreachable",
    "MigrationError",
    "SchemaOutdated",
    "SchemaUnknown",
    "alembic_config",
    "current_revision",
    "ensure_schema",
    "head_revision",
    "offline_sql",
    "upgrade",
]

# The Alembic environment ships next to the packages (the repository's `migrations/`).
MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"


class MigrationError(Exception):
    """Base of every schema failure."""


class DatabaseUnreachable(MigrationError):
    """The database could not be reached (the message names the dialect, never the URL)."""


class SchemaOutdated(MigrationError):
    """The database is behind this code; run `airgate db upgrade` or apply `offline_sql()`."""


class SchemaUnknown(MigrationError):
    """The database was migrated by a newer airgate than this one."""


def alembic_config(url: str | None = None, *, output: TextIO | None = None) -> Config:
    """An Alembic Config for `migrations/`; `url` is handed to env.py (never parsed as INI,
    so a `%` in a password needs no escaping)."""
    if not (MIGRATIONS / "env.py").is_file():
        raise MigrationError(f"the Alembic environment is missing (expected {MIGRATIONS})")
    cfg = Config(output_buffer=output)
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("path_separator", "os")
    cfg.set_main_option("file_template", "%%(rev)s")  # revision ids are date-prefixed
    if url is not None:
        cfg.attributes["url"] = url
    return cfg


def head_revision() -> str:
    """The newest revision this code ships."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise MigrationError("no migrations found")
    return head


def _dialect(url: str) -> str:
    return url.split(":", 1)[0].split("+", 1)[0]


def _upgrade_sync(connection: Connection, cfg: Config, revision: str) -> None:
    cfg.attributes["connection"] = connection
    command.upgrade(cfg, revision)


def _current_sync(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


async def upgrade(url: str, revision: str = "head") -> None:
    """Apply migrations up to `revision`, in one transaction where the database allows."""
    engine = create_db_engine(url, poolclass=NullPool)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_upgrade_sync, alembic_config(url), revision)
    except CommandError as exc:
        raise SchemaUnknown(f"cannot upgrade this database: {exc}") from exc
    except (SQLAlchemyError, OSError) as exc:
        raise DatabaseUnreachable(f"the {_dialect(url)} database is unavailable") from exc
    finally:
        await engine.dispose()


async def current_revision(url: str) -> str | None:
    """The database's revision (None: never migrated)."""
    engine = create_db_engine(url, poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(_current_sync)
    except (SQLAlchemyError, OSError) as exc:
        raise DatabaseUnreachable(f"the {_dialect(url)} database is unavailable") from exc
    finally:
        await engine.dispose()


async def ensure_schema(url: str, *, migrate: bool) -> None:
    """Make sure the schema is current: SQLite is always migrated; PostgreSQL only when
    `migrate` is set, otherwise an outdated database raises `SchemaOutdated`."""
    current = await current_revision(url)
    script = ScriptDirectory.from_config(alembic_config())
    head = head_revision()
    if current is not None and current != head:
        try:
            script.get_revision(current)
        except CommandError:
            raise SchemaUnknown(
                f"the database is at revision {current}, which this airgate does not know"
            ) from None
    if current == head:
        return
    if migrate or _dialect(url) == "sqlite":
        await upgrade(url)
        return
    raise SchemaOutdated(
        f"the database is at revision {current or '(empty)'}, this airgate needs {head}: "
        "run `airgate db upgrade` or apply the SQL from `alembic upgrade head --sql`"
    )


def offline_sql(url: str, revision: str = "head", *, start: str | None = None) -> str:
    """The SQL a DBA applies by hand (Alembic offline mode) for the database kind of `url`
    (only its dialect matters; nothing connects)."""
    out = io.StringIO()
    target = f"{start}:{revision}" if start else revision
    command.upgrade(alembic_config(url, output=out), target, sql=True)
    return out.getvalue()
