"""`PipelinedRedis`: the limiter's Redis client, one pipelined connection and nothing else.

Every inference request runs the limiter's script twice (admit, then finish).  Through redis-py's
asyncio client an EVALSHA costs about 90-125 µs of CPU (connection pool, per-call timeout
context, command packing in Python): half of the gateway's CPU per request on the echo engine.
This client speaks just enough RESP for `RedisLimiter` (`evalsha`, `script_load`, `ping`) over
one connection that every request shares: the commands of one event-loop turn go out in one
write (Redis answers in order, so concurrent calls pipeline by themselves) and each call waits
for its reply, parsed by hiredis's C reader.  About 10-20 µs of CPU per call, against 90-125.

Failures use redis-py's exception classes, so `RedisLimiter` maps them in one place:
`ConnectionError` (refused, reset, closed), `TimeoutError` (no reply within `timeout_s`; the
connection is then dropped, since a late reply would answer the wrong caller), `NoScriptError`
and `ResponseError` for error replies.  A dropped connection fails every call waiting on it;
the next call reconnects (one connection attempt at a time, shared by concurrent callers).

URLs: `redis://[[user]:password@]host[:port][/db]`, `rediss://...` (TLS, verified against the
system's CAs or `?ssl_ca_certs=FILE`), `unix://[[user]:password@]/path.sock[?db=N]`.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qs, unquote, urlsplit

import hiredis
from redis import exceptions as redis_errors

__all__ = ["PipelinedRedis", "RedisTarget", "parse_redis_url"]

_SUPPORTED_QUERY = frozenset({"db", "ssl_ca_certs"})


def _encode(args: tuple[str | bytes, ...]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg.encode() if isinstance(arg, str) else arg
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def _reply_error(error: hiredis.ReplyError) -> redis_errors.RedisError:
    message = str(error)
    if message.startswith("NOSCRIPT"):
        return redis_errors.NoScriptError(message)
    return redis_errors.ResponseError(message)


class _Protocol(asyncio.Protocol):
    """One connection: replies are matched to waiting calls in order."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self._reader = hiredis.Reader()
        self._out: list[bytes] = []
        self.lost = False

    def send(self, command: bytes) -> None:
        """Queue a command; everything queued in one event-loop turn goes out in one write (a
        socket write costs tens of µs here: concurrent requests share it)."""
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append(command)

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self.transport is not None and not self.lost:
            self.transport.write(b"".join(out))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio's, or uvloop's (which does not subclass asyncio.Transport)
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        try:
            while (reply := self._reader.gets()) is not False:
                if not self.waiting:
                    raise hiredis.ProtocolError("a reply nobody asked for")
                future = self.waiting.popleft()
                if future.done():  # its caller gave up (cancelled)
                    continue
                if isinstance(reply, hiredis.ReplyError):
                    future.set_exception(_reply_error(reply))
                else:
                    future.set_result(reply)
        except hiredis.ProtocolError:
            self.drop(redis_errors.ConnectionError("Redis sent a malformed reply"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._fail(redis_errors.ConnectionError("the connection to Redis closed"))

    def drop(self, error: redis_errors.RedisError) -> None:
        """Close the connection and fail every call waiting on it."""
        self.lost = True
        if self.transport is not None:
            self.transport.abort()
        self._fail(error)

    def _fail(self, error: redis_errors.RedisError) -> None:
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(error)
                future.exception()  # retrieved: a caller that already left gets no warning


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """Where a Redis URL points: a TCP host and port (TLS with `tls`) or a unix socket."""

    host: str = "127.0.0.1"
    port: int = 6379
    path: str | None = None  # a unix socket instead of host and port
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False
    ca_file: str | None = None


def parse_redis_url(url: str) -> RedisTarget:
    """The target of a URL this client takes; ValueError naming what it does not take (never
    repeating the URL, which may carry a password)."""
    parts = urlsplit(url)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    unknown = set(query) - _SUPPORTED_QUERY
    if unknown:
        raise ValueError(f"unsupported Redis URL options: {', '.join(sorted(unknown))}")
    if parts.scheme in ("redis", "rediss"):
        where = {"host": parts.hostname or "127.0.0.1", "port": parts.port or 6379}
        db = parts.path.lstrip("/") or query.get("db", "0")
    elif parts.scheme == "unix":
        where = {"path": unquote(parts.path)}
        db = query.get("db", "0")
    else:
        raise ValueError("a Redis URL starts with redis://, rediss:// or unix://")
    if not db.isdigit():
        raise ValueError("the Redis database must be a number")
    return RedisTarget(
        **where,  # type: ignore[arg-type]
        db=int(db),
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        tls=parts.scheme == "rediss",
        ca_file=query.get("ssl_ca_certs"),
    )


class PipelinedRedis:
    """A Redis client for the limiter: one shared, pipelined connection (see the module)."""

    def __init__(
        self, url: str, *, timeout_s: float = 0.25, connect_timeout_s: float = 0.25
    ) -> None:
        target = parse_redis_url(url)
        self._host, self._port, self._path = target.host, target.port, target.path
        self._db, self._username, self._password = target.db, target.username, target.password
        self._ssl = ssl.create_default_context(cafile=target.ca_file) if target.tls else None
        self._timeout = timeout_s
        self._connect_timeout = connect_timeout_s
        self._conn: _Protocol | None = None
        self._connecting: asyncio.Future[_Protocol] | None = None

    async def evalsha(self, sha: str, numkeys: int, *args: str | bytes) -> Any:
        return await self.execute("EVALSHA", sha, str(numkeys), *args)

    async def script_load(self, script: str) -> Any:
        reply = await self.execute("SCRIPT", "LOAD", script)
        return reply.decode() if isinstance(reply, bytes) else reply

    async def ping(self) -> bool:
        return bool(await self.execute("PING") == b"PONG")

    async def execute(self, *args: str | bytes) -> Any:
        """Send one command and wait for its reply (see the module for the errors)."""
        conn = self._conn
        if conn is None or conn.lost:
            conn = await self._connection()
        return await self._call(conn, _encode(args))

    async def _call(self, conn: _Protocol, command: bytes) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        conn.waiting.append(future)
        conn.send(command)
        timer = loop.call_later(self._timeout, _expire, conn, future)
        try:
            return await future
        finally:
            timer.cancel()

    async def _connection(self) -> _Protocol:
        """The live connection, opened by one caller while the others wait for it."""
        if self._connecting is not None:
            return await asyncio.shield(self._connecting)
        loop = asyncio.get_running_loop()
        self._connecting = connecting = loop.create_future()
        try:
            conn = await self._open()
        except BaseException as exc:
            error = (
                exc
                if isinstance(exc, redis_errors.RedisError | asyncio.CancelledError)
                else redis_errors.ConnectionError(f"cannot connect to Redis ({type(exc).__name__})")
            )
            if isinstance(error, asyncio.CancelledError):
                connecting.cancel()
            else:
                connecting.set_exception(error)
                connecting.exception()
            raise error from None
        finally:
            self._connecting = None
        self._conn = conn
        connecting.set_result(conn)
        return conn

    async def _open(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                if self._path is not None:
                    _, conn = await loop.create_unix_connection(_Protocol, self._path)
                else:
                    _, conn = await loop.create_connection(
                        _Protocol, self._host, self._port, ssl=self._ssl
                    )
        except TimeoutError:
            raise redis_errors.TimeoutError("timed out connecting to Redis") from None
        except OSError as exc:
            raise redis_errors.ConnectionError(
                f"cannot connect to Redis ({type(exc).__name__})"
            ) from None
        try:
            if self._password is not None:
                auth = (self._username, self._password) if self._username else (self._password,)
                await self._call(conn, _encode(("AUTH", *auth)))
            if self._db:
                await self._call(conn, _encode(("SELECT", str(self._db))))
        except BaseException:
            conn.drop(redis_errors.ConnectionError("Redis refused the connection's set-up"))
            raise
        return conn

    async def aclose(self) -> None:
        if self._conn is not None:
            self._conn.drop(redis_errors.ConnectionError("the client was closed"))
            self._conn = None


def _expire(conn: _Protocol, future: asyncio.Future[Any]) -> None:
    if not future.done():
        conn.drop(redis_errors.TimeoutError("Redis did not answer in time"))
