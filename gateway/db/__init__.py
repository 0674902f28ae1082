"""The gateway's database: one SQLAlchemy MetaData for the audit log and the API keys.

SQLite (WAL) in the data dir is the embedded default; PostgreSQL for production.  The schema
changes only through Alembic revisions in `migrations/` (see `gateway.db.migrate`).
"""

from .engine import create_db_engine, database_url
from .metadata import metadata

__all__ = ["create_db_engine", "database_url", "metadata"]
