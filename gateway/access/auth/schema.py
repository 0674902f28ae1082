"""The `api_keys` table, on the shared MetaData (created by revision `20261129_02_api_keys`).

Only the HMAC of a key's secret is stored.  Times are timezone-aware UTC in and out, on
PostgreSQL (`timestamptz`) and on SQLite (which keeps them as text without a zone).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import CheckConstraint, Column, DateTime, Dialect, String, Table
from sqlalchemy.types import TypeDecorator

from gateway.db import metadata

__all__ = ["UtcDateTime", "api_keys"]


class UtcDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every backend; naive values are refused on write."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: pass a timezone-aware UTC time")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


api_keys = Table(
    "api_keys",
    metadata,
    Column("key_id", String(12), primary_key=True),
    Column("secret_hmac", String(64), nullable=False),
    Column("role", String(16), nullable=False),
    Column("team", String(128), nullable=True),
    Column("name", String(128), nullable=True),
    Column("created_at", UtcDateTime(), nullable=False),
    Column("created_by", String(300), nullable=True),
    Column("expires_at", UtcDateTime(), nullable=True),
    Column("revoked_at", UtcDateTime(), nullable=True),
    Column("last_used_at", UtcDateTime(), nullable=True),
    CheckConstraint("role IN ('app', 'auditor', 'admin')", name="role"),
)
