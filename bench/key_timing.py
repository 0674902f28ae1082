"""API-key authentication: does an unknown key id cost what a known id with a wrong secret does?

``python -m bench.key_timing [--n 2000] [--database URL]`` times `KeyStore.authenticate`
directly (no HTTP) on a fresh SQLite file (or the given empty database): `--n` attempts with an
unknown key id and `--n` with a known id and a wrong secret, interleaved so both see the same
machine (and alternating which goes first), in two shapes:

- repeat: the same presented key each time (what a client retrying one key sees);
- fresh: a new unknown id each time, against a known id that is used successfully between
  attempts (a busy key: its row is in the store's cache).

Prints the median of each and their ratio.  Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from gateway.access.auth import AuthenticationFailed, KeyStore, generate_api_key
from gateway.access.auth.schema import api_keys
from gateway.db import create_db_engine, metadata


def _wrong_secret(key: str) -> str:
    from gateway.access.auth.apikeys import api_key_checksum

    prefix, key_id, secret, _ = key.split("_")
    body = f"{prefix}_{key_id}_{'B' * len(secret) if secret[0] != 'B' else 'C' * len(secret)}"
    return f"{body}_{api_key_checksum(body)}"


async def _failure_ms(store: KeyStore, text: str) -> float:
    start = time.perf_counter_ns()
    try:
        await store.authenticate(text)
    except AuthenticationFailed:
        pass
    else:
        raise AssertionError("the attempt authenticated")
    return (time.perf_counter_ns() - start) / 1e6


async def _measure(url: str, n: int) -> dict[str, tuple[float, float]]:
    engine = create_db_engine(url)
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all, tables=[api_keys])
    store = KeyStore(engine, bytes(range(32)))
    try:
        good, _ = await store.create("app", name="bench")
        wrong = _wrong_secret(good)
        repeated_unknown = generate_api_key()
        shapes: dict[str, tuple[Callable[[], str], bool]] = {
            "repeat": (lambda: repeated_unknown, False),
            "fresh": (generate_api_key, True),
        }
        results = {}
        for shape, (unknown, warm) in shapes.items():
            unknown_ms, wrong_ms = [], []
            for _ in range(50):  # warm up: connections, caches, code paths
                await _failure_ms(store, unknown())
                await _failure_ms(store, wrong)
            for i in range(n):
                # alternate which goes first, so neither always follows the other
                for kind in ("unknown", "wrong") if i % 2 else ("wrong", "unknown"):
                    if warm:
                        await store.authenticate(good)  # the holder keeps its row cached
                    if kind == "unknown":
                        unknown_ms.append(await _failure_ms(store, unknown()))
                    else:
                        wrong_ms.append(await _failure_ms(store, wrong))
            results[shape] = (statistics.median(unknown_ms), statistics.median(wrong_ms))
        return results
    finally:
        await store.aclose()
        await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.key_timing", description=__doc__)
    parser.add_argument("--n", type=int, default=2000, help="attempts of each kind per shape")
    parser.add_argument("--database", help="an empty database URL (default: a SQLite file)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.database or f"sqlite+aiosqlite:///{Path(tmp) / 'keys.db'}"
        results = asyncio.run(_measure(url, args.n))
    for shape, (unknown, wrong) in results.items():
        print(
            f"{shape:>6}: unknown id {unknown:.3f} ms, known id + wrong secret {wrong:.3f} ms "
            f"(median of {args.n}); ratio {unknown / wrong:.2f}"
        )


if __name__ == "__main__":
    main()
