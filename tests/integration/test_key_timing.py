"""A failed API-key authentication does the same work whether the key id exists or not, and
whether or not the key's row is cached: one HMAC of the presented secret, one constant-time
compare of two digests, one SELECT (gateway/access/auth/store.py, "Timing").  Counted, never
timed: `python -m bench.key_timing` measures it.  SQLite and PostgreSQL."""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from databases import fresh_database
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.access.auth import (
    AuthenticationFailed,
    KeyStore,
    UnknownKey,
    WrongSecret,
    generate_api_key,
)
from gateway.access.auth import apikeys as apikeys_module
from gateway.access.auth.apikeys import api_key_checksum, parse_api_key
from gateway.access.auth.schema import api_keys
from gateway.db import create_db_engine, metadata

PEPPER = bytes(range(32))


@pytest.fixture(params=["sqlite", "postgresql"])
async def engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    async with fresh_database(request.param, tmp_path) as url:
        engine = create_db_engine(url)
        async with engine.begin() as conn:
            await conn.run_sync(metadata.create_all, tables=[api_keys])
        try:
            yield engine
        finally:
            await engine.dispose()


@pytest.fixture
async def store(engine: AsyncEngine) -> AsyncIterator[KeyStore]:
    keys = KeyStore(engine, PEPPER, cache_ttl_s=3600)  # cached rows never expire here
    try:
        yield keys
    finally:
        await keys.aclose()


@dataclass
class Work:
    """What one authentication did: secrets HMACed, digests compared, SELECTs sent."""

    digests: int = 0
    compares: int = 0
    selects: int = 0

    def clear(self) -> None:
        self.digests = self.compares = self.selects = 0


@pytest.fixture
def work(engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch) -> Iterator[Work]:
    counted = Work()
    real_digest, real_compare = apikeys_module.secret_digest, hmac.compare_digest

    def digest(pepper: bytes, secret: str) -> str:
        counted.digests += 1
        return real_digest(pepper, secret)

    def compare(a: Any, b: Any) -> bool:
        if len(a) == 64:  # the secret's HMAC (the key's 6-character checksum is compared too)
            counted.compares += 1
        return real_compare(a, b)

    def statement(_conn: Any, _cursor: Any, sql: str, *_args: Any) -> None:
        if sql.lstrip().upper().startswith("SELECT"):
            counted.selects += 1

    monkeypatch.setattr(apikeys_module, "secret_digest", digest)
    monkeypatch.setattr(hmac, "compare_digest", compare)
    event.listen(engine.sync_engine, "before_cursor_execute", statement)
    yield counted
    event.remove(engine.sync_engine, "before_cursor_execute", statement)


def with_secret(key: str, secret: str) -> str:
    key_id, _ = parse_api_key(key)
    body = f"ag_{key_id}_{secret}"
    return f"{body}_{api_key_checksum(body)}"


async def failure(store: KeyStore, work: Work, text: str) -> tuple[type[Exception], Work]:
    work.clear()
    with pytest.raises(AuthenticationFailed) as info:
        await store.authenticate(text)
    return type(info.value), Work(work.digests, work.compares, work.selects)


ONE_OF_EACH = Work(digests=1, compares=1, selects=1)


async def test_unknown_id_and_wrong_secret_do_the_same_work(store: KeyStore, work: Work) -> None:
    key, _ = await store.create("app")
    wrong = with_secret(key, "B" * 32 if parse_api_key(key)[1] != "B" * 32 else "C" * 32)
    unknown = generate_api_key()

    # cold: nothing cached yet
    assert await failure(store, work, wrong) == (WrongSecret, ONE_OF_EACH)
    assert await failure(store, work, unknown) == (UnknownKey, ONE_OF_EACH)

    # the key's holder uses it: its row is cached, and a success reads nothing
    work.clear()
    await store.authenticate(key)
    assert (work.digests, work.compares, work.selects) == (1, 1, 0)

    # warm: a wrong secret still pays the read an unknown id pays; repeats change nothing
    for _ in range(3):
        assert await failure(store, work, wrong) == (WrongSecret, ONE_OF_EACH)
        assert await failure(store, work, unknown) == (UnknownKey, ONE_OF_EACH)
        assert await failure(store, work, generate_api_key()) == (UnknownKey, ONE_OF_EACH)

    # and the failures did not evict the key: its holder still reads nothing
    work.clear()
    await store.authenticate(key)
    assert work.selects == 0
