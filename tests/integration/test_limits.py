"""gateway/access/limits against real Redis: the shared server on 127.0.0.1:6379 (random key prefix
per test, keys deleted afterwards) and, for failover, a PRIVATE `redis-server` on a free
loopback port that the tests kill and restart.  The shared Redis is never stopped.

Time is Redis's: bounds are checked against `TIME` read before and after the admissions.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import shutil
import signal
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.access.limits import (
    Admission,
    FailoverLimiter,
    LimiterUnavailable,
    LocalLimiter,
    RedisLimiter,
)
from gateway.access.limits._lua import SCRIPT_SHA
from gateway.access.limits.resp import PipelinedRedis

SHARED_HOST, SHARED_PORT = "127.0.0.1", 6379
PRINCIPAL = "key_7f3a9c"


def _client(port: int) -> Redis:
    """The client settings the limiter's docstring recommends: short timeouts, no retries, and
    a bounded pool, so that 100 concurrent admits share 16 connections instead of opening 100
    at once (on a loaded 2-core runner, 100 simultaneous connects outlast the 0.5 s timeout)."""
    pool = BlockingConnectionPool(
        host="127.0.0.1",
        port=port,
        max_connections=16,
        timeout=10,
        socket_timeout=0.5,
        socket_connect_timeout=0.5,
        retry=Retry(NoBackoff(), 0),
    )
    return Redis.from_pool(pool)  # the client owns the pool: aclose() closes it


async def _redis_time(client: Redis) -> float:
    seconds, micros = await client.time()
    return seconds + micros / 1_000_000


async def _delete_prefix(client: Redis, prefix: str) -> None:
    keys = [key async for key in client.scan_iter(match=prefix + "*", count=500)]
    if keys:
        await client.delete(*keys)


class _Pipelined:
    """The limiter's calls (`evalsha`, `script_load`) through the gateway's `PipelinedRedis`;
    everything the tests inspect Redis with through redis-py, on the same server."""

    def __init__(self, port: int) -> None:
        self.fast = PipelinedRedis(
            f"redis://127.0.0.1:{port}/0", timeout_s=0.5, connect_timeout_s=0.5
        )
        self.inspect = _client(port)

    async def evalsha(self, sha: str, numkeys: int, *args: str) -> Any:
        return await self.fast.evalsha(sha, numkeys, *args)

    async def script_load(self, script: str) -> Any:
        return await self.fast.script_load(script)

    async def aclose(self) -> None:
        await self.fast.aclose()
        await self.inspect.aclose()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inspect, name)


# every RedisLimiter test runs with redis-py's client and with the gateway's own
CLIENTS = ["redis-py", "pipelined"]


def _limiter_client(kind: str, port: int) -> Any:
    return _client(port) if kind == "redis-py" else _Pipelined(port)


@pytest.fixture(params=CLIENTS)
async def shared(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Redis, str]]:
    """The shared Redis and a fresh key prefix; every key under it is deleted afterwards."""
    client = _limiter_client(request.param, SHARED_PORT)
    try:
        await client.ping()
    except redis.RedisError as exc:
        await client.aclose()
        pytest.fail(f"Redis is not reachable on {SHARED_HOST}:{SHARED_PORT}: {exc!r}")
    prefix = f"airgate:test:{secrets.token_hex(6)}:"
    try:
        yield client, prefix
    finally:
        await _delete_prefix(client, prefix)
        await client.aclose()


def _limiter(shared: tuple[Redis, str], **kwargs: Any) -> RedisLimiter:
    client, prefix = shared
    return RedisLimiter(client, prefix=prefix, **kwargs)


async def _admit(
    lim: RedisLimiter | FailoverLimiter,
    *,
    rpm: int | None = None,
    tpm: int | None = None,
    streams: int | None = None,
    tokens: int = 0,
    key: str = PRINCIPAL,
) -> Admission:
    return await lim.admit(key, rpm=rpm, tpm=tpm, streams=streams, tokens=tokens)


# --- GCRA on Redis's clock -------------------------------------------------------------------


async def test_concurrent_admits_get_the_burst_and_no_more(shared: tuple[Redis, str]) -> None:
    lim = _limiter(shared, request_burst=lambda _rpm: 5)
    start = await _redis_time(shared[0])
    results = await asyncio.gather(*(_admit(lim, rpm=600) for _ in range(100)))
    elapsed = await _redis_time(shared[0]) - start
    admitted = sum(r.allowed for r in results)
    assert 5 <= admitted <= 5 + 10 * elapsed
    refused = next(r for r in results if not r.allowed)
    assert refused.reason == "requests"
    assert 0 < refused.retry_after_s <= 0.1 + 1e-6
    assert refused.headers["retry-after"] == "1"


async def test_remaining_counts_down_from_the_limit(shared: tuple[Redis, str]) -> None:
    lim = _limiter(shared)  # rpm=60: burst 6, one request a second refills
    results = [await _admit(lim, rpm=60) for _ in range(7)]
    assert [r.allowed for r in results] == [True] * 6 + [False]
    seen = [int(r.headers["x-ratelimit-remaining-requests"]) for r in results]
    # a fresh key reads the limit less this request; the burst spent, the last and the 429 read 0
    assert seen == [59, 58, 57, 56, 55, 0, 0]
    assert all(r.headers["x-ratelimit-limit-requests"] == "60" for r in results)


async def test_no_burst_across_a_second_boundary(shared: tuple[Redis, str]) -> None:
    """10/s with burst 5, hammered by waves of concurrent admits from just before a whole
    second of Redis time until 0.1 s after it.  A fixed one-second window would admit up to
    20 here; GCRA admits at most burst + rate*T over the measured T."""
    client = shared[0]
    lim = _limiter(shared, request_burst=lambda _rpm: 5)
    while True:  # wait for the run-up to a whole second
        now = await _redis_time(client)
        if now % 1.0 >= 0.9:
            break
        await asyncio.sleep(0.01)
    boundary = int(now) + 1
    start = await _redis_time(client)
    admitted = 0
    while await _redis_time(client) < boundary + 0.1:
        results = await asyncio.gather(*(_admit(lim, rpm=600) for _ in range(20)))
        admitted += sum(r.allowed for r in results)
    elapsed = await _redis_time(client) - start
    assert elapsed >= 0.1
    assert 5 <= admitted <= 5 + 10 * elapsed


async def test_tokens_are_reserved_and_refunded(shared: tuple[Redis, str]) -> None:
    lim = _limiter(shared)  # tpm=60: one token a second, the whole minute at once
    first = await _admit(lim, tpm=60, tokens=60)
    assert first.allowed
    assert first.headers["x-ratelimit-remaining-tokens"] == "0"
    assert first.headers["x-ratelimit-reset-tokens"] == "1m0s"
    refused = await _admit(lim, tpm=60, tokens=10)
    assert (refused.allowed, refused.reason) == (False, "tokens")
    assert 9.9 < refused.retry_after_s <= 10.0
    await lim.finish(first, used_tokens=20)  # 40 unused tokens go back
    await lim.finish(first, used_tokens=20)  # idempotent: no second refund
    assert (await _admit(lim, tpm=60, tokens=40)).allowed
    assert not (await _admit(lim, tpm=60, tokens=1)).allowed


async def test_refund_never_moves_below_now(shared: tuple[Redis, str]) -> None:
    lim = _limiter(shared)
    first = await _admit(lim, tpm=6000, tokens=10)
    await lim.finish(first, used_tokens=0)  # the TAT goes back to now, not before it
    assert not await shared[0].exists(lim.keys(PRINCIPAL)[1])
    assert (await _admit(lim, tpm=6000, tokens=6000)).allowed
    assert not (await _admit(lim, tpm=6000, tokens=200)).allowed


async def test_all_or_nothing(shared: tuple[Redis, str]) -> None:
    lim = _limiter(shared, request_burst=lambda _rpm: 2)
    assert (await _admit(lim, rpm=60, tpm=60, streams=2, tokens=60)).allowed
    refused = await _admit(lim, rpm=60, tpm=60, streams=2, tokens=1)
    assert refused.reason == "tokens"
    # had the refusal kept its request or its slot, this would be refused (burst 2, 2 slots)
    after = await _admit(lim, rpm=60, streams=2)
    assert after.allowed
    assert after.headers["x-ratelimit-remaining-requests"] == "0"
    full = await _admit(lim, key="other", rpm=60, tpm=60, streams=1, tokens=10)
    assert full.allowed
    refused = await _admit(lim, key="other", rpm=60, tpm=60, streams=1, tokens=10)
    assert refused.reason == "streams"
    assert refused.headers["x-ratelimit-remaining-tokens"] == "50"  # nothing reserved


async def test_stream_slots_are_released_and_expire_on_redis_time(
    shared: tuple[Redis, str],
) -> None:
    client = shared[0]
    lim = _limiter(shared, stream_ttl_s=0.3)
    a = await _admit(lim, streams=1)
    assert a.allowed
    assert (await _admit(lim, streams=1)).reason == "streams"
    await lim.finish(a, used_tokens=0)
    start = await _redis_time(client)
    assert (await _admit(lim, streams=1)).allowed  # released by finish
    assert 0 < await client.pttl(lim.keys(PRINCIPAL)[2]) <= 300
    while True:  # never finished: this slot is freed by its TTL
        if (await _admit(lim, streams=1)).allowed:
            break
        await asyncio.sleep(0.02)
    assert await _redis_time(client) - start >= 0.3


async def test_keys_hold_only_numbers_under_the_principal(shared: tuple[Redis, str]) -> None:
    client, prefix = shared
    lim = _limiter(shared)
    for _ in range(3):
        await _admit(lim, rpm=60, tpm=6000, streams=4, tokens=100)
    keys = sorted([k.decode() async for k in client.scan_iter(match=prefix + "*")])
    assert keys == sorted(lim.keys(PRINCIPAL))
    assert all(re.fullmatch(re.escape(f"{prefix}{{{PRINCIPAL}}}") + ":[rts]", k) for k in keys)
    number = re.compile(rb"[0-9]+(\.[0-9]+)?(e[+-]?[0-9]+)?")
    request_tat, token_tat, slots = keys[0], keys[2], keys[1]  # sorted: :r, :s, :t
    for key in (request_tat, token_tat):
        value = await client.get(key)
        assert isinstance(value, bytes) and number.fullmatch(value)
    members = await client.zrange(slots, 0, -1, withscores=True)
    assert len(members) == 3
    for member in members:
        assert isinstance(member, tuple) and isinstance(member[0], bytes)
        assert member[0].isdigit()  # a random slot id, nothing more
    assert all([await client.pttl(k) > 0 for k in keys])  # nothing outlives its use


async def test_unlimited_touches_nothing(shared: tuple[Redis, str]) -> None:
    client, prefix = shared
    lim = _limiter(shared)
    result = await _admit(lim, tokens=123)
    assert result == Admission(allowed=True)
    await lim.finish(result, used_tokens=5)
    assert [k async for k in client.scan_iter(match=prefix + "*")] == []


# --- failover: a private redis-server, killed and restarted ---------------------------------


class PrivateRedis:
    """A throwaway redis-server on a loopback port (no persistence), started and killed at
    will; the port stays the same across restarts."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed (the failover tests start their own)")
        self.binary = binary
        self.workdir = workdir
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = self.workdir / "redis.log"
        self.proc = subprocess.Popen(
            [
                *(self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""),
                *("--appendonly", "no", "--dir", str(self.workdir), "--logfile", str(log)),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        probe = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.2)
        try:
            while True:  # until it answers, or fail with its log if it exits
                try:
                    if probe.ping():
                        return
                except redis.ConnectionError:
                    pass
                if self.proc.poll() is not None:
                    text = log.read_text() if log.exists() else ""
                    pytest.fail(f"redis-server exited with {self.proc.returncode}:\n{text[-3000:]}")
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=0.01)  # returns at once if it exits
        finally:
            probe.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(params=CLIENTS)
async def private_client(
    request: pytest.FixtureRequest, private_redis: PrivateRedis
) -> AsyncIterator[Redis]:
    client = _limiter_client(request.param, private_redis.port)
    try:
        yield client
    finally:
        await client.aclose()


async def test_fail_open_continues_locally_and_comes_back(
    private_redis: PrivateRedis, private_client: Redis
) -> None:
    events: list[bool] = []
    primary = RedisLimiter(private_client, request_burst=lambda _rpm: 3)
    fallback = LocalLimiter(request_burst=lambda _rpm: 2)
    lim = FailoverLimiter(
        primary, fallback, fail_mode="open", probe_interval_s=0, on_degraded=events.append
    )
    first = await _admit(lim, rpm=60, tpm=600, streams=2, tokens=10)
    assert first.allowed and not first.degraded and not lim.degraded

    private_redis.kill()
    local = await _admit(lim, rpm=60, tpm=600, streams=2, tokens=10)
    assert local.allowed and local.degraded and lim.degraded
    assert events == [True]
    assert (await _admit(lim, rpm=60)).degraded
    refused = await _admit(lim, rpm=60)  # the local limiter enforces its own burst of 2
    assert (refused.allowed, refused.reason, refused.degraded) == (False, "requests", True)
    await lim.finish(first, used_tokens=1)  # a Redis ticket while Redis is down: no error
    await lim.finish(local, used_tokens=1)

    private_redis.start()  # empty: no keys, no cached script (NOSCRIPT -> SCRIPT LOAD)
    back = await _admit(lim, rpm=60, tpm=600, streams=2, tokens=10)
    assert back.allowed and not back.degraded and not lim.degraded
    assert events == [True, False]
    assert await private_client.script_exists(SCRIPT_SHA) == [True]
    assert await private_client.exists(*primary.keys(PRINCIPAL)) == 3


async def test_fail_open_when_redis_stops_answering(
    private_redis: PrivateRedis, private_client: Redis
) -> None:
    """A frozen Redis (SIGSTOP) accepts connections and never replies: the client's socket
    timeout turns that into an outage, and the limiter carries on locally."""
    lim = FailoverLimiter(
        RedisLimiter(private_client), LocalLimiter(), fail_mode="open", probe_interval_s=0
    )
    assert not (await _admit(lim, rpm=60)).degraded
    assert private_redis.proc is not None
    private_redis.proc.send_signal(signal.SIGSTOP)
    try:
        frozen = await _admit(lim, rpm=60)
    finally:
        private_redis.proc.send_signal(signal.SIGCONT)
    assert frozen.allowed and frozen.degraded
    assert not (await _admit(lim, rpm=60)).degraded


async def test_fail_closed_raises_until_redis_answers(
    private_redis: PrivateRedis, private_client: Redis
) -> None:
    lim = FailoverLimiter(
        RedisLimiter(private_client), LocalLimiter(), fail_mode="closed", probe_interval_s=0
    )
    assert (await _admit(lim, rpm=60)).allowed
    private_redis.kill()
    with pytest.raises(LimiterUnavailable):
        await _admit(lim, rpm=60)
    assert lim.degraded
    private_redis.start()
    back = await _admit(lim, rpm=60)
    assert back.allowed and not back.degraded and not lim.degraded


async def test_redis_limiter_alone_raises_limiter_unavailable(
    private_redis: PrivateRedis, private_client: Redis
) -> None:
    lim = RedisLimiter(private_client)
    admission = await _admit(lim, tpm=60, streams=1, tokens=5)
    private_redis.kill()
    with pytest.raises(LimiterUnavailable) as info:
        await _admit(lim, rpm=60)
    assert info.value.cause == "ConnectionError"
    with pytest.raises(LimiterUnavailable):
        await lim.finish(admission, used_tokens=1)


async def test_script_is_reloaded_after_script_flush(private_client: Redis) -> None:
    lim = RedisLimiter(private_client)
    assert (await _admit(lim, rpm=60)).allowed
    await private_client.script_flush()
    assert await private_client.script_exists(SCRIPT_SHA) == [False]
    assert (await _admit(lim, rpm=60)).allowed
    assert await private_client.script_exists(SCRIPT_SHA) == [True]


def test_pipelined_client_under_uvloop() -> None:
    """The server runs on uvloop, whose transports are not asyncio's classes."""
    import uvloop

    async def main() -> list[Any]:
        client = PipelinedRedis(f"redis://{SHARED_HOST}:{SHARED_PORT}/0")
        try:
            assert await client.ping()
            sha = await client.script_load("return ARGV[1]")
            return await asyncio.gather(*(client.evalsha(sha, 0, str(i)) for i in range(20)))
        finally:
            await client.aclose()

    # twenty calls in one write, their replies matched back in order
    assert uvloop.run(main()) == [str(i).encode() for i in range(20)]
