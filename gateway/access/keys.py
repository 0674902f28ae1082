"""API keys outside the HTTP API: the first admin key, and the `airgate keys` commands' core."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from ..config import Settings
from ..db import create_db_engine, database_url
from ..db.migrate import ensure_schema
from .auth import KeyStore, default_pepper_path, load_or_create_pepper

__all__ = ["bootstrap_admin_key", "key_store"]


@asynccontextmanager
async def key_store(settings: Settings) -> AsyncIterator[KeyStore]:
    """The key store of this configuration's database (migrated first, as `serve` would)."""
    url = database_url(settings.data_dir, settings.audit.database_url)
    Path(settings.data_dir).mkdir(parents=True, exist_ok=True, mode=0o700)  # noqa: ASYNC240
    await ensure_schema(url, migrate=settings.audit.migrate)
    engine = create_db_engine(url)
    pepper = Path(settings.auth.pepper_file or default_pepper_path(settings.data_dir))
    store = KeyStore(engine, load_or_create_pepper(pepper))
    try:
        yield store
    finally:
        await store.aclose()
        await engine.dispose()


async def bootstrap_admin_key(settings: Settings) -> str | None:
    """On a database without any admin key, create one and return it (to print once)."""
    async with key_store(settings) as store:
        if any(r.role == "admin" and r.revoked_at is None for r in await store.list()):
            return None
        key, _ = await store.create("admin", name="first-admin", created_by="airgate-serve")
        return key
