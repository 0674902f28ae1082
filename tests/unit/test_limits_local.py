"""gateway/access/limits: GCRA in process (LocalLimiter) on a fake clock, OpenAI headers, and the
FailoverLimiter's switching rules over a primary that can be told to fail."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.access.limits import (
    Admission,
    FailoverLimiter,
    LimitArgumentError,
    LimiterUnavailable,
    LocalLimiter,
    RedisLimiter,
    Ticket,
    TokensExceedLimit,
    duration_text,
)

T = TypeVar("T")


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Drive a coroutine that must never suspend: LocalLimiter's calls are atomic on the
    event loop because they never await."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coro.close()
    raise AssertionError("the limiter suspended inside a call")


def limiter(clock: FakeClock, burst: int | None = None, **kwargs: Any) -> LocalLimiter:
    if burst is not None:
        kwargs["request_burst"] = lambda _rpm: burst
    return LocalLimiter(clock, **kwargs)


def admit(
    lim: LocalLimiter,
    key: str = "key-1",
    *,
    rpm: int | None = None,
    tpm: int | None = None,
    streams: int | None = None,
    tokens: int = 0,
) -> Admission:
    return run(lim.admit(key, rpm=rpm, tpm=tpm, streams=streams, tokens=tokens))


def finish(lim: LocalLimiter, admission: Admission, used: int) -> None:
    run(lim.finish(admission, used_tokens=used))


# --- requests: spacing, burst, no boundary burst -------------------------------------------


def test_requests_are_spaced_by_the_emission_interval() -> None:
    clock = FakeClock()
    lim = limiter(clock, burst=1)
    assert admit(lim, rpm=60).allowed
    refused = admit(lim, rpm=60)
    assert (refused.allowed, refused.reason) == (False, "requests")
    assert refused.retry_after_s == pytest.approx(1.0)
    clock.advance(0.999)
    assert not admit(lim, rpm=60).allowed
    clock.advance(0.001)
    assert admit(lim, rpm=60).allowed


def test_default_burst_is_a_tenth_of_the_minute() -> None:
    clock = FakeClock()
    lim = limiter(clock)
    results = [admit(lim, rpm=600) for _ in range(61)]
    assert [r.allowed for r in results] == [True] * 60 + [False]
    assert results[-1].retry_after_s == pytest.approx(0.1)
    # a small limit still admits one request
    assert admit(lim, "key-2", rpm=5).allowed
    assert not admit(lim, "key-2", rpm=5).allowed


def test_no_burst_across_a_window_boundary() -> None:
    """10/s with burst 5, hammered every millisecond from 0.9 s to 1.1 s: a fixed one-second
    window would admit 20 (10 before the boundary, 10 after); GCRA admits burst + rate*T."""
    clock = FakeClock(0.9)
    lim = limiter(clock, burst=5)
    admitted = 0
    for _ in range(201):
        admitted += admit(lim, rpm=600).allowed
        clock.advance(0.001)
    assert admitted <= 5 + 10 * 0.2
    assert admitted >= 5


@settings(max_examples=200, deadline=None)
@given(
    gaps=st.lists(st.floats(min_value=0.0, max_value=0.5), min_size=1, max_size=80),
    burst=st.integers(min_value=1, max_value=6),
    rpm=st.integers(min_value=1, max_value=1200),
)
def test_any_window_admits_at_most_burst_plus_rate_times_t(
    gaps: list[float], burst: int, rpm: int
) -> None:
    clock = FakeClock()
    lim = limiter(clock, burst=burst)
    times: list[float] = []
    for gap in gaps:
        clock.advance(gap)
        if admit(lim, rpm=rpm).allowed:
            times.append(clock.now)
    rate = rpm / 60
    for i in range(len(times)):
        for j in range(i, len(times)):
            assert j - i + 1 <= burst + rate * (times[j] - times[i]) + 1e-6


async def test_concurrent_admits_never_exceed_the_burst() -> None:
    lim = limiter(FakeClock(), burst=7)
    results = await asyncio.gather(
        *(lim.admit("key-1", rpm=60, tpm=None, streams=None, tokens=0) for _ in range(100))
    )
    assert sum(r.allowed for r in results) == 7


def test_keys_are_independent() -> None:
    lim = limiter(FakeClock(), burst=1)
    assert admit(lim, "a", rpm=60).allowed
    assert not admit(lim, "a", rpm=60).allowed
    assert admit(lim, "b", rpm=60).allowed


# --- tokens: reservation, refund, charge -----------------------------------------------------


def test_tokens_are_reserved_and_unused_ones_refunded() -> None:
    clock = FakeClock()
    lim = limiter(clock)  # tpm=60: one token a second, the whole minute at once
    first = admit(lim, tpm=60, tokens=60)
    assert first.allowed
    assert first.headers["x-ratelimit-remaining-tokens"] == "0"
    refused = admit(lim, tpm=60, tokens=10)
    assert (refused.allowed, refused.reason) == (False, "tokens")
    assert refused.retry_after_s == pytest.approx(10.0)
    finish(lim, first, used=20)  # 40 unused tokens go back
    assert admit(lim, tpm=60, tokens=40).allowed
    assert not admit(lim, tpm=60, tokens=1).allowed


def test_refund_never_moves_below_now() -> None:
    clock = FakeClock()
    lim = limiter(clock)
    first = admit(lim, tpm=60, tokens=60)
    clock.advance(120)  # idle: the bucket is full again
    finish(lim, first, used=0)  # the refund must not bank credit beyond the burst
    assert admit(lim, tpm=60, tokens=60).allowed
    assert not admit(lim, tpm=60, tokens=1).allowed


def test_tokens_used_beyond_the_reservation_are_charged() -> None:
    lim = limiter(FakeClock())
    first = admit(lim, tpm=60, tokens=10)
    finish(lim, first, used=50)
    assert admit(lim, tpm=60, tokens=10).allowed
    assert not admit(lim, tpm=60, tokens=1).allowed


def test_finish_is_idempotent() -> None:
    lim = limiter(FakeClock())
    first = admit(lim, tpm=60, streams=1, tokens=60)
    finish(lim, first, used=0)
    finish(lim, first, used=0)  # a second refund would bank 60 more tokens
    assert admit(lim, tpm=60, streams=2, tokens=60).allowed
    assert not admit(lim, tpm=60, streams=2, tokens=1).allowed


def test_a_request_larger_than_the_token_burst_is_an_error() -> None:
    lim = limiter(FakeClock())
    with pytest.raises(TokensExceedLimit) as info:
        admit(lim, tpm=100, tokens=101)
    assert (info.value.requested, info.value.limit) == (101, 100)
    small = LocalLimiter(FakeClock(), token_burst=lambda tpm: tpm // 10)
    with pytest.raises(TokensExceedLimit):
        admit(small, tpm=100, tokens=11)


# --- streams ---------------------------------------------------------------------------------


def test_stream_slots_are_taken_and_released() -> None:
    lim = limiter(FakeClock())
    a, b = admit(lim, streams=2), admit(lim, streams=2)
    assert a.allowed and b.allowed
    refused = admit(lim, streams=2)
    assert (refused.allowed, refused.reason, refused.retry_after_s) == (False, "streams", 1.0)
    finish(lim, a, used=0)
    assert admit(lim, streams=2).allowed
    assert not admit(lim, streams=2).allowed


def test_a_slot_never_finished_expires_after_its_ttl() -> None:
    clock = FakeClock()
    lim = limiter(clock, stream_ttl_s=10)
    assert admit(lim, streams=1).allowed
    clock.advance(9.999)
    assert not admit(lim, streams=1).allowed
    clock.advance(0.001)
    assert admit(lim, streams=1).allowed


# --- all or nothing --------------------------------------------------------------------------


def test_refused_tokens_leave_requests_and_slots_untouched() -> None:
    lim = limiter(FakeClock(), burst=2)
    assert admit(lim, rpm=60, tpm=60, streams=2, tokens=60).allowed
    refused = admit(lim, rpm=60, tpm=60, streams=2, tokens=1)
    assert refused.reason == "tokens"
    # had the refusal kept its request or its slot, this would be refused (burst 2, 2 slots)
    after = admit(lim, rpm=60, streams=2)
    assert after.allowed
    assert after.headers["x-ratelimit-remaining-requests"] == "0"


def test_full_streams_reserve_no_tokens_and_no_request() -> None:
    lim = limiter(FakeClock(), burst=2)
    assert admit(lim, rpm=60, tpm=60, streams=1, tokens=30).allowed
    refused = admit(lim, rpm=60, tpm=60, streams=1, tokens=30)
    assert refused.reason == "streams"
    assert refused.headers["x-ratelimit-remaining-tokens"] == "30"
    ok = admit(lim, rpm=60, tpm=60, streams=2, tokens=30)
    assert ok.allowed
    assert ok.headers["x-ratelimit-remaining-requests"] == "0"
    assert ok.headers["x-ratelimit-remaining-tokens"] == "0"


def test_refused_requests_reserve_no_tokens() -> None:
    lim = limiter(FakeClock(), burst=1)
    assert admit(lim, rpm=60, tpm=60, tokens=10).allowed
    refused = admit(lim, rpm=60, tpm=60, tokens=10)
    assert refused.reason == "requests"
    assert refused.headers["x-ratelimit-remaining-tokens"] == "50"


def test_retry_after_covers_every_refused_dimension() -> None:
    lim = limiter(FakeClock(), burst=1)
    assert admit(lim, rpm=60, tpm=60, tokens=60).allowed
    refused = admit(lim, rpm=60, tpm=60, tokens=30)
    assert refused.reason == "requests"  # the first refused dimension names the reason
    assert refused.retry_after_s == pytest.approx(30.0)  # but the wait is the longest
    assert refused.headers["retry-after"] == "30"
    assert refused.headers["retry-after-ms"] == "30000"


# --- headers, unlimited, arguments -----------------------------------------------------------


def test_headers_follow_openai() -> None:
    lim = limiter(FakeClock())
    first = admit(lim, rpm=60, tpm=6000, tokens=600)
    assert first.headers == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-limit-tokens": "6000",
        "x-ratelimit-remaining-tokens": "5400",
        "x-ratelimit-reset-tokens": "6s",
    }
    assert first.ticket is not None
    assert not first.degraded and first.reason is None and first.retry_after_s == 0.0
    assert set(admit(lim, "k", tpm=60).headers) == {
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
    }


def remaining(admission: Admission, what: str = "requests") -> int:
    return int(admission.headers[f"x-ratelimit-remaining-{what}"])


def test_remaining_counts_down_from_the_limit_and_reads_0_once_the_burst_is_spent() -> None:
    clock = FakeClock()
    lim = limiter(clock)  # rpm=600: burst 60, one request every 0.1 s
    results = [admit(lim, rpm=600) for _ in range(61)]
    assert [r.allowed for r in results] == [True] * 60 + [False]
    seen = [remaining(r) for r in results]
    assert seen[0] == 599  # a fresh key: the limit less this request
    assert seen[:59] == list(range(599, 540, -1))  # one less per request
    assert seen[59:] == [0, 0]  # the burst is spent: the next request, and the 429, read 0
    assert all(r.headers["x-ratelimit-limit-requests"] == "600" for r in results)
    assert results[-1].headers["x-ratelimit-reset-requests"] == "6s"
    clock.advance(0.1)  # one request refills: it is admitted, and the next would not be
    again = admit(lim, rpm=600)
    assert again.allowed and remaining(again) == 0
    clock.advance(6.0)  # reset: back to the initial state
    fresh = admit(lim, rpm=600)
    assert remaining(fresh) == 599
    assert fresh.headers["x-ratelimit-reset-requests"] == "100ms"


def test_remaining_refills_one_request_per_interval() -> None:
    clock = FakeClock()
    lim = limiter(clock)
    for _ in range(10):
        admit(lim, rpm=600)
    clock.advance(0.25)  # 2.5 of the 10 refilled; with this one, 8.5 are in use
    assert remaining(admit(lim, rpm=600)) == 600 - 9  # a part-refilled request still counts
    assert remaining(admit(lim, "other", rpm=600)) == 599  # keys are their own


def test_remaining_tokens_count_down_by_the_reservation() -> None:
    lim = limiter(FakeClock())
    counts = [remaining(admit(lim, tpm=6000, tokens=1000), "tokens") for _ in range(6)]
    assert counts == [5000, 4000, 3000, 2000, 1000, 0]
    refused = admit(lim, tpm=6000, tokens=1)
    assert (refused.allowed, remaining(refused, "tokens")) == (False, 0)


def test_remaining_never_reads_above_a_limit_smaller_than_its_burst() -> None:
    lim = limiter(FakeClock(), burst=20)  # a burst rule larger than the minute
    seen = [remaining(admit(lim, rpm=10)) for _ in range(21)]
    assert seen == [10] * 10 + list(range(9, -1, -1)) + [0]


@settings(max_examples=300, deadline=None)
@given(
    gaps=st.lists(st.sampled_from([0.0, 0.0, 0.01, 0.1, 0.5, 2.0, 7.0]), min_size=1, max_size=80),
    burst=st.integers(min_value=1, max_value=30),
    rpm=st.integers(min_value=1, max_value=1200),
)
def test_remaining_agrees_with_what_the_limiter_admits(
    gaps: list[float], burst: int, rpm: int
) -> None:
    """Never above the limit; while one more request would pass, the limit less the requests
    not yet refilled (the debt, from a model of the TAT); 0 exactly when the next request at
    the same instant is refused."""
    clock = FakeClock()
    lim = limiter(clock, burst=burst)
    interval = 60 / rpm
    tat = clock.now
    left: int | None = None
    for gap in gaps:
        clock.advance(gap)
        result = admit(lim, rpm=rpm)
        if gap == 0 and left is not None:
            assert result.allowed == (left > 0)
        if result.allowed:
            tat = max(tat, clock.now) + interval
        left = remaining(result)
        assert 0 <= left <= rpm
        if not result.allowed:
            assert left == 0
        elif left and burst <= rpm:
            debt = (tat - clock.now) / interval
            assert rpm - debt - 1 < left <= rpm - debt + 1e-3


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0s"),
        (0.0001, "1ms"),
        (0.017, "17ms"),
        (0.999, "999ms"),
        (1.0, "1s"),
        (1.5, "1.5s"),
        (8.64, "8.64s"),
        (59.9991, "1m0s"),
        (360.0, "6m0s"),
        (179.56, "2m59.56s"),
        (3600.0, "1h0m0s"),
        (3723.25, "1h2m3.25s"),
    ],
)
def test_duration_text(seconds: float, text: str) -> None:
    assert duration_text(seconds) == text


def test_unlimited_admits_without_state() -> None:
    lim = limiter(FakeClock())
    result = admit(lim, tokens=10**9)
    assert result == Admission(allowed=True)
    finish(lim, result, used=10)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"key": ""},
        {"key": "x" * 257},
        {"key": "tenant-{a}"},
        {"key": "line\nbreak"},
        {"rpm": 0},
        {"tpm": -1},
        {"streams": 0},
        {"tokens": -1},
    ],
)
def test_bad_arguments_are_limit_argument_errors(kwargs: dict[str, Any]) -> None:
    lim = limiter(FakeClock())
    args: dict[str, Any] = {"key": "key-1", "rpm": 60, "tpm": 600, "streams": 1, "tokens": 1}
    args |= kwargs
    with pytest.raises(LimitArgumentError):
        admit(lim, **args)


def test_bad_burst_rule_and_bad_finish() -> None:
    lim = LocalLimiter(FakeClock(), request_burst=lambda _rpm: 0)
    with pytest.raises(LimitArgumentError):
        admit(lim, rpm=60)
    ok = admit(limiter(FakeClock()), tpm=60, tokens=1)
    with pytest.raises(LimitArgumentError):
        finish(limiter(FakeClock()), ok, used=-1)
    with pytest.raises(LimitArgumentError):
        LocalLimiter(FakeClock(), stream_ttl_s=0)


def test_idle_keys_are_forgotten() -> None:
    clock = FakeClock()
    lim = limiter(clock)
    for i in range(3000):
        admit(lim, f"key-{i}", rpm=60, tpm=60, streams=1, tokens=1)
        clock.advance(0.1)
    assert len(lim._requests) < 1100  # swept every 1024 admissions
    assert len(lim._tokens) < 1100


# --- FailoverLimiter's switching rules (the real outage is in tests/integration) ------------


class FlakyPrimary(RedisLimiter):
    """A RedisLimiter stand-in that answers from a LocalLimiter, or fails like a dead Redis."""

    def __init__(self) -> None:
        self.down = False
        self.calls = 0
        self.finished: list[Admission] = []
        self._inner = LocalLimiter(FakeClock())

    async def admit(
        self, key: str, *, rpm: int | None, tpm: int | None, streams: int | None, tokens: int
    ) -> Admission:
        self.calls += 1
        if self.down:
            raise LimiterUnavailable("ConnectionError")
        return await self._inner.admit(key, rpm=rpm, tpm=tpm, streams=streams, tokens=tokens)

    async def finish(self, admission: Admission, *, used_tokens: int) -> None:
        if self.down:
            raise LimiterUnavailable("ConnectionError")
        self.finished.append(admission)


async def _admit(lim: FailoverLimiter, tokens: int = 0) -> Admission:
    return await lim.admit("key-1", rpm=None, tpm=60, streams=None, tokens=tokens)


async def test_fail_open_uses_the_fallback_and_probes_on_schedule() -> None:
    clock = FakeClock()
    primary, events = FlakyPrimary(), list[bool]()
    lim = FailoverLimiter(
        primary,
        LocalLimiter(clock),
        fail_mode="open",
        probe_interval_s=5,
        clock=clock,
        on_degraded=events.append,
    )
    assert not (await _admit(lim)).degraded
    primary.down = True
    local = await _admit(lim, tokens=60)
    assert local.allowed and local.degraded and lim.degraded
    assert not (await _admit(lim, tokens=1)).allowed  # local limits are enforced
    calls = primary.calls
    await _admit(lim)
    assert primary.calls == calls  # no probe before the interval
    primary.down = False
    clock.advance(5)
    back = await _admit(lim)
    assert not back.degraded and not lim.degraded
    assert events == [True, False]
    await lim.finish(local, used_tokens=0)  # goes to the fallback, which refunds
    assert (await _admit(lim)).allowed


async def test_fail_closed_raises_and_recovers() -> None:
    clock = FakeClock()
    primary = FlakyPrimary()
    lim = FailoverLimiter(primary, LocalLimiter(clock), fail_mode="closed", clock=clock)
    primary.down = True
    with pytest.raises(LimiterUnavailable):
        await _admit(lim)
    with pytest.raises(LimiterUnavailable):
        await _admit(lim)  # fails fast until the next probe
    assert lim.degraded
    primary.down = False
    clock.advance(1)
    assert not (await _admit(lim)).degraded
    assert not lim.degraded


async def test_finish_during_an_outage_does_not_raise() -> None:
    clock = FakeClock()
    primary = FlakyPrimary()
    lim = FailoverLimiter(primary, LocalLimiter(clock), fail_mode="open", clock=clock)
    primary.down = True
    ticket = Ticket(origin="redis", key="key-1", reserved=5, token_interval_s=1.0, stream="7")
    await lim.finish(Admission(allowed=True, ticket=ticket), used_tokens=1)
    assert lim.degraded
    primary.down = False
    await lim.finish(Admission(allowed=True, ticket=ticket), used_tokens=1)
    assert primary.finished  # a Redis ticket goes to Redis (the stand-in sees the call)


def test_failover_arguments() -> None:
    with pytest.raises(LimitArgumentError):
        mode: Any = "sideways"
        FailoverLimiter(FlakyPrimary(), LocalLimiter(), fail_mode=mode)
