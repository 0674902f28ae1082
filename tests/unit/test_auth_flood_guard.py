"""The flood guard's token buckets and the auth-failure windows, on a clock the test holds:
budgets, refill, bounded memory (eviction and the overflow window)."""

from __future__ import annotations

import pytest

from gateway.http.failure_audit import FailureAudit
from gateway.http.flood import FloodGuard, retry_after_header

A, B = "10.0.0.1", "10.0.0.2"


def spend(guard: FloodGuard, address: str, n: int, now: float = 0.0) -> None:
    for _ in range(n):
        guard.failed(address, now)


def test_an_address_is_limited_once_its_burst_is_spent_and_recovers_at_the_rate() -> None:
    guard = FloodGuard(burst=3, rate_per_s=0.5)
    spend(guard, A, 2)
    assert guard.retry_after(A, 0.0) is None
    spend(guard, A, 1)
    assert guard.retry_after(A, 0.0) == pytest.approx(2.0)  # one token at 0.5 per second
    assert guard.retry_after(B, 0.0) is None  # another address is unaffected
    assert guard.retry_after(A, 1.0) == pytest.approx(1.0)
    assert guard.retry_after(A, 2.0) is None
    spend(guard, A, 1, now=2.0)
    assert guard.retry_after(A, 2.0) == pytest.approx(2.0)
    assert retry_after_header(0.01) == "1" and retry_after_header(2.2) == "3"


def test_a_refill_to_full_forgets_the_address() -> None:
    guard = FloodGuard(burst=2, rate_per_s=1.0)
    spend(guard, A, 1)
    assert guard.tracked == 1
    assert guard.retry_after(A, 10.0) is None
    assert guard.tracked == 0


def test_tracked_addresses_are_bounded_and_the_least_recent_is_evicted() -> None:
    guard = FloodGuard(burst=1, rate_per_s=0.001, max_addresses=100)
    for i in range(1000):
        guard.failed(f"10.1.{i // 256}.{i % 256}", 0.0)
    assert guard.tracked == 100
    assert guard.retry_after("10.1.0.0", 0.0) is None  # evicted long ago
    assert guard.retry_after("10.1.3.231", 0.0) is not None  # the last one is still limited


def test_known_credentials_pass_until_they_fail_or_expire() -> None:
    guard = FloodGuard(burst=1, rate_per_s=1.0, max_remembered=2, remember_s=60.0)
    guard.remember(b"Bearer good", 0.0)
    assert guard.known(b"Bearer good", 1.0)
    assert not guard.known(b"Bearer other", 1.0)
    assert not guard.known(b"", 1.0)
    assert not guard.known(b"Bearer good", 61.0)  # expired
    guard.remember(b"Bearer good", 100.0)
    guard.forget(b"Bearer good")  # revoked since, say
    assert not guard.known(b"Bearer good", 100.0)
    for i in range(5):
        guard.remember(b"Bearer %d" % i, 200.0)
    assert [guard.known(b"Bearer %d" % i, 200.0) for i in range(5)] == [False] * 3 + [True] * 2


def test_burst_zero_turns_the_limit_off() -> None:
    guard = FloodGuard(burst=0, rate_per_s=1.0)
    spend(guard, A, 1000)
    assert guard.retry_after(A, 0.0) is None
    assert guard.tracked == 0


def note(audit: FailureAudit, address: str, now: float, reason: str = "unknown_key") -> list[int]:
    noted = audit.note(address, reason, status=401, route="/v1/models", request_id="r1", now=now)
    return [e.count or 0 for e in noted.events]


def test_a_window_records_its_first_failure_at_once_and_the_rest_as_one_total() -> None:
    audit = FailureAudit(10.0)
    assert note(audit, A, 0.0) == [1]
    assert [note(audit, A, t) for t in (1.0, 2.0, 9.0)] == [[], [], []]
    assert note(audit, B, 3.0) == [1]
    assert audit.next_close() == 10.0
    assert audit.due(9.9) == []
    (total,) = audit.due(10.0)
    assert (total.client_address, total.count, total.request_id) == (A, 3, None)
    assert audit.due(13.0) == []  # B's window held nothing after its first
    assert audit.open_windows == 0


def test_the_next_failure_after_a_window_closes_it() -> None:
    audit = FailureAudit(10.0)
    note(audit, A, 0.0)
    note(audit, A, 5.0)
    assert note(audit, A, 12.0) == [1, 1]  # the old window's total, then a new first


def test_an_unrecorded_first_failure_is_retracted() -> None:
    audit = FailureAudit(10.0)
    noted = audit.note(A, "unknown_key", status=401, route=None, request_id=None, now=0.0)
    assert noted.opened is not None
    audit.retract(noted.opened)
    assert audit.open_windows == 0
    assert note(audit, A, 1.0) == [1]


def test_windows_are_bounded_and_the_overflow_is_counted_per_reason() -> None:
    audit = FailureAudit(10.0, max_windows=4)
    for i in range(4):
        note(audit, f"10.2.0.{i}", 0.0)
    assert note(audit, "10.9.9.9", 0.0) == [1]  # the overflow window's first
    for i in range(100):
        note(audit, f"10.3.0.{i}", 1.0)
    assert audit.open_windows == 5
    totals = audit.drain()
    (overflow,) = totals
    assert overflow.client_address is None and overflow.detail == {"overflow": 1}
    assert overflow.count == 100


def test_window_zero_records_every_failure() -> None:
    audit = FailureAudit(0.0)
    assert [note(audit, A, 0.0) for _ in range(3)] == [[1], [1], [1]]
    assert audit.open_windows == 0
