"""gateway/access/auth/store.py on real databases: SQLite (a file per test) and PostgreSQL (a
database per test, created and dropped here), plus the `20261129_02_api_keys` migration."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import msgspec
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from databases import postgres_database
from sqlalchemy import MetaData, event, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.access.auth import (
    ApiKeyRecord,
    AuthConfigError,
    KeyExpired,
    KeyRevoked,
    KeyStore,
    KeyStoreUnavailable,
    MalformedKey,
    Principal,
    UnknownKey,
    WrongSecret,
    generate_api_key,
    parse_api_key,
)
from gateway.access.auth import apikeys as apikeys_module
from gateway.access.auth.apikeys import api_key_checksum
from gateway.access.auth.schema import api_keys
from gateway.db import create_db_engine, metadata
from gateway.db.migrate import head_revision, upgrade

PEPPER = bytes(range(32))
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


# ---- databases ------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
async def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'airgate.db'}"
    else:
        async with postgres_database("airgate_auth") as url:
            yield url


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_db_engine(db_url)
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all, tables=[api_keys])
    try:
        yield engine
    finally:
        await engine.dispose()


@pytest.fixture
async def store(engine: AsyncEngine) -> AsyncIterator[KeyStore]:
    keys = KeyStore(engine, PEPPER)
    try:
        yield keys
    finally:
        await keys.aclose()


class Statements:
    """The SQL an engine sends, to count SELECTs and UPDATEs."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.sql: list[str] = []
        event.listen(engine.sync_engine, "before_cursor_execute", self._seen)

    def _seen(self, _conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        self.sql.append(" ".join(statement.split()))

    def count(self, prefix: str) -> int:
        return sum(1 for s in self.sql if s.upper().startswith(prefix))


async def _row(engine: AsyncEngine, key_id: str) -> dict[str, Any]:
    async with engine.connect() as conn:
        row = (await conn.execute(select(api_keys).where(api_keys.c.key_id == key_id))).one()
    return dict(row._mapping)


def _with_secret(text_key: str, secret: str) -> str:
    key_id, _ = parse_api_key(text_key)
    body = f"ag_{key_id}_{secret}"
    return f"{body}_{api_key_checksum(body)}"


# ---- create / authenticate / list / get -----------------------------------------------------


async def test_create_stores_only_an_hmac(
    store: KeyStore, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        plaintext, record = await store.create(
            "app", team="search", name="indexer", created_by="AdminKey0001", now=NOW
        )
        await store.authenticate(plaintext, NOW)
        await store.drain()
    key_id, secret = parse_api_key(plaintext)
    assert record == ApiKeyRecord(
        key_id=key_id,
        role="app",
        team="search",
        name="indexer",
        created_at=NOW,
        created_by="AdminKey0001",
        expires_at=None,
        revoked_at=None,
        last_used_at=None,
    )
    row = await _row(engine, key_id)
    assert row["secret_hmac"] == hmac.new(PEPPER, secret.encode(), hashlib.sha256).hexdigest()
    assert not any(secret in str(value) for value in row.values())
    assert secret not in caplog.text and plaintext not in caplog.text


async def test_authenticate_returns_the_principal(store: KeyStore) -> None:
    plaintext, record = await store.create("auditor", team="legal", name="officer", now=NOW)
    principal = await store.authenticate(plaintext, NOW + timedelta(minutes=1))
    assert principal == Principal(
        key_id=record.key_id,
        method="api_key",
        team="legal",
        roles=frozenset({"auditor"}),
        subject="officer",
    )
    bare, bare_record = await store.create("admin", now=NOW)
    assert await store.authenticate(bare, NOW) == Principal(
        key_id=bare_record.key_id, method="api_key", roles=frozenset({"admin"})
    )


async def test_list_and_get(store: KeyStore) -> None:
    assert await store.list() == []
    created = [
        (await store.create(role, name=f"k{i}", now=NOW + timedelta(seconds=i)))[1]
        for i, role in enumerate(["app", "auditor", "admin"])
    ]
    listed = await store.list()
    assert listed == created
    assert all(not hasattr(r, "secret_hmac") for r in listed)
    assert await store.get(created[1].key_id) == created[1]
    assert await store.get("NoSuchKey000") is None


async def test_create_validates_its_input(store: KeyStore) -> None:
    with pytest.raises(ValueError, match="role"):
        await store.create("root")
    with pytest.raises(ValueError, match="team"):
        await store.create("app", team="t" * 129)
    with pytest.raises(ValueError, match="timezone"):
        await store.create("app", expires_at=datetime(2027, 1, 1))
    assert await store.list() == []


# ---- failures -------------------------------------------------------------------------------


async def test_wrong_secret(store: KeyStore) -> None:
    plaintext, _ = await store.create("app", now=NOW)
    forged = _with_secret(plaintext, "A" * 32)
    with pytest.raises(WrongSecret) as info:
        await store.authenticate(forged, NOW)
    assert info.value.reason == "wrong_secret"
    assert str(info.value) == "authentication failed"


async def test_another_pepper_does_not_verify(store: KeyStore, engine: AsyncEngine) -> None:
    plaintext, _ = await store.create("app", now=NOW)
    other = KeyStore(engine, b"\x01" * 32)
    with pytest.raises(WrongSecret):
        await other.authenticate(plaintext, NOW)


async def test_unknown_id(store: KeyStore) -> None:
    await store.create("app", now=NOW)
    with pytest.raises(UnknownKey) as info:
        await store.authenticate(generate_api_key(), NOW)
    assert info.value.reason == "unknown_key"


async def test_malformed_key_never_reaches_the_database(
    store: KeyStore, engine: AsyncEngine
) -> None:
    plaintext, _ = await store.create("app", now=NOW)
    statements = Statements(engine)
    changed_last = plaintext[:-1] + ("y" if plaintext.endswith("x") else "x")
    for bad in ("", "Bearer " + plaintext, changed_last, plaintext.upper()):
        with pytest.raises(MalformedKey):
            await store.authenticate(bad, NOW)
    assert statements.sql == []


async def test_unknown_id_takes_the_same_hmac_path(
    store: KeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    digests: list[str] = []
    comparisons: list[tuple[str, str]] = []
    real_digest, real_compare = apikeys_module.secret_digest, hmac.compare_digest

    def digest(pepper: bytes, secret: str) -> str:
        digests.append(secret)
        return real_digest(pepper, secret)

    def compare(a: str, b: str) -> bool:
        if len(a) == 64:  # the secret's HMAC (the 6-character checksum is compared too)
            comparisons.append((a, b))
        return real_compare(a, b)

    monkeypatch.setattr(apikeys_module, "secret_digest", digest)
    monkeypatch.setattr(hmac, "compare_digest", compare)  # the store's call goes through hmac
    plaintext, _ = await store.create("app", now=NOW)
    digests.clear()
    comparisons.clear()

    unknown = generate_api_key()
    with pytest.raises(UnknownKey):
        await store.authenticate(unknown, NOW)
    assert digests == [parse_api_key(unknown)[1]]
    assert len(comparisons) == 1 and comparisons[0][1] == "0" * 64

    wrong = _with_secret(plaintext, "B" * 32)
    with pytest.raises(WrongSecret):
        await store.authenticate(wrong, NOW)
    assert digests == [parse_api_key(unknown)[1], "B" * 32]
    assert len(comparisons) == 2 and comparisons[1][1] != "0" * 64


async def test_revoke(store: KeyStore) -> None:
    plaintext, record = await store.create("app", now=NOW)
    assert await store.revoke(record.key_id, NOW + timedelta(hours=1)) is True
    assert await store.revoke(record.key_id, NOW + timedelta(hours=2)) is False  # already
    assert await store.revoke("NoSuchKey000", NOW) is False
    stored = await store.get(record.key_id)
    assert stored is not None and stored.revoked_at == NOW + timedelta(hours=1)
    with pytest.raises(KeyRevoked) as info:
        await store.authenticate(plaintext, NOW + timedelta(hours=3))
    assert info.value.reason == "key_revoked"
    # revocation is only revealed to the holder of the secret
    with pytest.raises(WrongSecret):
        await store.authenticate(_with_secret(plaintext, "C" * 32), NOW)


async def test_expiry(store: KeyStore) -> None:
    expires = NOW + timedelta(hours=1)
    plaintext, record = await store.create("app", expires_at=expires, now=NOW)
    assert record.expires_at == expires
    await store.authenticate(plaintext, expires - timedelta(microseconds=1))
    for when in (expires, expires + timedelta(days=1)):
        with pytest.raises(KeyExpired) as info:
            await store.authenticate(plaintext, when)
        assert info.value.reason == "key_expired"
    with pytest.raises(WrongSecret):
        await store.authenticate(_with_secret(plaintext, "D" * 32), expires)


async def test_times_come_back_in_utc(store: KeyStore) -> None:
    plus_two = datetime(2026, 11, 29, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    _, record = await store.create("app", expires_at=plus_two, now=NOW)
    stored = await store.get(record.key_id)
    assert stored is not None
    assert stored.expires_at == plus_two and stored.expires_at.tzinfo == UTC
    assert stored.created_at == NOW and stored.created_at.tzinfo == UTC


# ---- last-used throttling -------------------------------------------------------------------


async def test_last_used_is_throttled(store: KeyStore, engine: AsyncEngine) -> None:
    plaintext, record = await store.create("app", now=NOW)
    other, other_record = await store.create("app", now=NOW)
    statements = Statements(engine)

    async def last_used(key_id: str) -> datetime | None:
        await store.drain()
        stored = await store.get(key_id)
        assert stored is not None
        return stored.last_used_at

    await store.authenticate(plaintext, NOW)
    assert await last_used(record.key_id) == NOW
    await store.authenticate(plaintext, NOW + timedelta(seconds=10))
    assert await last_used(record.key_id) == NOW  # within the interval: no write
    assert statements.count("UPDATE") == 1

    await store.authenticate(other, NOW + timedelta(seconds=20))  # keys are throttled apart
    assert await last_used(other_record.key_id) == NOW + timedelta(seconds=20)
    assert statements.count("UPDATE") == 2

    await store.authenticate(plaintext, NOW + timedelta(seconds=61))
    assert await last_used(record.key_id) == NOW + timedelta(seconds=61)
    assert statements.count("UPDATE") == 3


async def test_key_records_are_cached_and_revocation_is_immediate(
    engine: AsyncEngine, store: KeyStore
) -> None:
    cached = KeyStore(engine, b"p" * 32, cache_ttl_s=3600)
    plaintext, record = await cached.create("app", now=NOW)
    statements = Statements(engine)
    for _ in range(5):
        await cached.authenticate(plaintext, NOW)
    assert statements.count("SELECT") == 1  # one read, then the cache
    assert await cached.revoke(record.key_id, NOW)
    with pytest.raises(KeyRevoked):  # this store revoked it: no stale cache entry
        await cached.authenticate(plaintext, NOW)
    await cached.aclose()


async def test_concurrent_authentications_write_once(store: KeyStore, engine: AsyncEngine) -> None:
    plaintext, record = await store.create("app", now=NOW)
    statements = Statements(engine)
    principals = await asyncio.gather(*(store.authenticate(plaintext, NOW) for _ in range(20)))
    assert {p.key_id for p in principals} == {record.key_id}
    await store.drain()
    assert statements.count("UPDATE") == 1
    stored = await store.get(record.key_id)
    assert stored is not None and stored.last_used_at == NOW


async def test_last_used_never_moves_back(store: KeyStore, engine: AsyncEngine) -> None:
    plaintext, record = await store.create("app", now=NOW)
    await store.authenticate(plaintext, NOW + timedelta(minutes=5))
    await store.drain()
    replica = KeyStore(engine, PEPPER)  # another process with a stale request time
    await replica.authenticate(plaintext, NOW)
    await replica.aclose()
    stored = await store.get(record.key_id)
    assert stored is not None and stored.last_used_at == NOW + timedelta(minutes=5)


async def test_failed_last_used_write_is_logged_not_raised(
    store: KeyStore, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    plaintext, record = await store.create("app", now=NOW)
    async with engine.begin() as conn:
        if engine.dialect.name == "sqlite":
            await conn.execute(
                text(
                    "CREATE TRIGGER no_touch BEFORE UPDATE ON api_keys "
                    "BEGIN SELECT RAISE(ABORT, 'read only'); END"
                )
            )
        else:
            await conn.execute(
                text(
                    "CREATE FUNCTION no_touch() RETURNS trigger AS "
                    "$$ BEGIN RAISE EXCEPTION 'read only'; END $$ LANGUAGE plpgsql"
                )
            )
            await conn.execute(
                text(
                    "CREATE TRIGGER no_touch BEFORE UPDATE ON api_keys "
                    "FOR EACH ROW EXECUTE FUNCTION no_touch()"
                )
            )
    with caplog.at_level(logging.WARNING, logger="airgate.auth"):
        principal = await store.authenticate(plaintext, NOW)
        await store.drain()
    assert principal.key_id == record.key_id
    messages = [r.getMessage() for r in caplog.records if r.name == "airgate.auth"]
    assert len(messages) == 1 and "last use" in messages[0]
    assert plaintext not in caplog.text


async def test_no_last_used_writes_after_close(store: KeyStore, engine: AsyncEngine) -> None:
    plaintext, record = await store.create("app", now=NOW)
    await store.aclose()
    await store.authenticate(plaintext, NOW)
    await store.drain()
    stored = await store.get(record.key_id)
    assert stored is not None and stored.last_used_at is None


# ---- the database failing -------------------------------------------------------------------


async def test_unreachable_database_is_not_an_authentication_failure(tmp_path: Path) -> None:
    engine = create_db_engine(f"sqlite+aiosqlite:///{tmp_path / 'missing' / 'airgate.db'}")
    try:
        keys = KeyStore(engine, PEPPER)
        with pytest.raises(KeyStoreUnavailable):
            await keys.authenticate(generate_api_key(), NOW)
        with pytest.raises(KeyStoreUnavailable):
            await keys.create("app")
    finally:
        await engine.dispose()


def test_short_pepper_is_refused() -> None:
    engine = create_db_engine("sqlite+aiosqlite://")
    with pytest.raises(AuthConfigError):
        KeyStore(engine, b"short")


# ---- the migration --------------------------------------------------------------------------


def _schema_diff(conn: Connection) -> list[Any]:
    """Differences between the migrated `api_keys` and the table the code declares."""
    ours = MetaData(naming_convention=metadata.naming_convention)
    api_keys.to_metadata(ours)

    def only_ours(name: str | None, type_: str, _parent: Any) -> bool:
        return type_ != "table" or name == "api_keys"

    context = MigrationContext.configure(
        conn, opts={"compare_type": True, "include_name": only_ours}
    )
    return list(compare_metadata(context, ours))


async def test_migration_creates_the_table_the_store_uses(db_url: str) -> None:
    await upgrade(db_url)
    engine = create_db_engine(db_url)
    try:
        async with engine.connect() as conn:
            assert await conn.run_sync(_schema_diff) == []
            version = (await conn.execute(text("SELECT version_num FROM alembic_version"))).one()
            assert version[0] == head_revision()  # the api_keys one, or a later one
        keys = KeyStore(engine, PEPPER, last_used_interval_s=0)
        plaintext, record = await keys.create("admin", team="platform", now=NOW)
        assert (await keys.authenticate(plaintext, NOW)).roles == frozenset({"admin"})
        await keys.aclose()
        assert await keys.list() == [msgspec.structs.replace(record, last_used_at=NOW)]
        async with engine.begin() as conn:
            with pytest.raises(IntegrityError, match=r"(?i)check"):
                await conn.execute(
                    api_keys.insert().values(
                        key_id="BadRole00000", secret_hmac="0" * 64, role="root", created_at=NOW
                    )
                )
    finally:
        await engine.dispose()
