"""The limiter's Redis URLs: what `PipelinedRedis` accepts, and what it refuses at start-up."""

from __future__ import annotations

import pytest

from gateway.access.limits.resp import PipelinedRedis, _encode


@pytest.mark.parametrize(
    ("url", "where", "db", "user", "password"),
    [
        ("redis://127.0.0.1:6379/0", ("127.0.0.1", 6379), 0, None, None),
        ("redis://cache.internal/3", ("cache.internal", 6379), 3, None, None),
        ("redis://:s%40cret@10.0.0.5:6380", ("10.0.0.5", 6380), 0, None, "s@cret"),
        ("rediss://svc:pw@redis.corp:6390/2", ("redis.corp", 6390), 2, "svc", "pw"),
        ("unix:///run/redis/redis.sock?db=5", "/run/redis/redis.sock", 5, None, None),
    ],
)
def test_accepted_urls(
    url: str, where: object, db: int, user: str | None, password: str | None
) -> None:
    client = PipelinedRedis(url)
    target = client._path if isinstance(where, str) else (client._host, client._port)
    assert (target, client._db, client._username, client._password) == (where, db, user, password)
    assert (client._ssl is not None) == url.startswith("rediss://")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://127.0.0.1:6379", "starts with redis://"),
        ("redis://127.0.0.1:6379/x", "must be a number"),
        ("redis://127.0.0.1:6379/0?health_check_interval=5", "unsupported Redis URL options"),
    ],
)
def test_refused_urls(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PipelinedRedis(url)


def test_commands_are_resp_arrays_of_bulk_strings() -> None:
    assert _encode(("EVALSHA", "ab", "1", "k", "é")) == (
        b"*5\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$1\r\n1\r\n$1\r\nk\r\n$2\r\n\xc3\xa9\r\n"
    )
