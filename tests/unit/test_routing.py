"""The routing decision, the circuit breaker and the gateway queue (pure parts, no engine)."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.engines.breaker import CircuitBreaker
from gateway.routing import (
    Candidate,
    GatewayQueue,
    QueueRefused,
    Route,
    predicted_wait,
    route,
)

BOTH = frozenset({"gpu", "edge"})


def c(
    name: str,
    cls: str = "gpu",
    running: int = 0,
    waiting: int = 0,
    capacity: int = 4,
    max_queue: int = 0,
    weight: float = 1.0,
    healthy: bool = True,
) -> Candidate:
    return Candidate(
        name=name,
        engine_class=cls,  # type: ignore[arg-type]
        running=running,
        waiting=waiting,
        capacity=capacity,
        max_queue=max_queue,
        weight=weight,
        healthy=healthy,
    )


@pytest.mark.parametrize(
    ("candidates", "allowed", "expected"),
    [
        ([c("g", running=1), c("e", "edge")], BOTH, Route("g", "gpu")),
        ([c("g1", running=3), c("g2", running=1)], BOTH, Route("g2", "gpu")),
        # saturated gpu overflows to a free edge deployment
        ([c("g", running=4), c("e", "edge", running=3)], BOTH, Route("e", "overflow")),
        # no gpu at all: edge is simply the class there is
        ([c("e", "edge")], BOTH, Route("e", "edge")),
        # an unhealthy gpu is not "saturated": edge without overflow
        ([c("g", healthy=False), c("e", "edge")], BOTH, Route("e", "edge")),
        # everything full: the engine queue with room and the least predicted wait
        (
            [c("g", running=4, waiting=2, max_queue=4), c("e", "edge", running=4, max_queue=1)],
            BOTH,
            Route("e", "engine_queue"),
        ),
        ([c("g", running=4), c("e", "edge", running=4)], BOTH, Route(None, "saturated")),
        ([c("g", healthy=False), c("e", "edge", healthy=False)], BOTH, Route(None, "unavailable")),
        # the policy's classes
        ([c("g"), c("e", "edge")], frozenset({"edge"}), Route("e", "edge")),
        ([c("g", running=4), c("e", "edge")], frozenset({"gpu"}), Route(None, "saturated")),
        ([c("g")], frozenset({"edge"}), Route(None, "no_deployment")),
        ([], BOTH, Route(None, "no_deployment")),
        # weight: a deployment twice as fast per slot looks half as loaded
        ([c("a", running=2), c("b", running=3, weight=2.0)], BOTH, Route("b", "gpu")),
        # ties: gpu first, then the larger weight, then the name
        (
            [c("e", "edge", running=4, max_queue=2), c("g", running=4, max_queue=2)],
            BOTH,
            Route("g", "engine_queue"),
        ),
        ([c("b"), c("a")], BOTH, Route("a", "gpu")),
    ],
)
def test_route_table(candidates: list[Candidate], allowed: frozenset[str], expected: Route) -> None:
    assert route(candidates, allowed) == expected  # type: ignore[arg-type]


def test_route_excludes_a_failed_deployment() -> None:
    pool = [c("g"), c("e", "edge")]
    assert route(pool, BOTH, frozenset({"g"})) == Route("e", "edge")
    assert route(pool, BOTH, frozenset({"g", "e"})) == Route(None, "no_deployment")


candidates = st.lists(
    st.builds(
        c,
        name=st.text("abcdef", min_size=1, max_size=3),
        cls=st.sampled_from(["gpu", "edge"]),
        running=st.integers(0, 8),
        waiting=st.integers(0, 8),
        capacity=st.integers(1, 8),
        max_queue=st.integers(0, 4),
        weight=st.sampled_from([0.5, 1.0, 2.0]),
        healthy=st.booleans(),
    ),
    max_size=6,
    unique_by=lambda x: x.name,
)


@settings(max_examples=400, deadline=None)
@given(candidates, st.sampled_from([BOTH, frozenset({"gpu"}), frozenset({"edge"})]))
def test_route_properties(pool: list[Candidate], allowed: frozenset[str]) -> None:
    decision = route(pool, allowed)  # type: ignore[arg-type]
    eligible = [x for x in pool if x.engine_class in allowed]
    healthy = [x for x in eligible if x.healthy]
    if decision.deployment is None:
        expected = (
            "no_deployment" if not eligible else "unavailable" if not healthy else "saturated"
        )
        assert decision.reason == expected
        assert all(x.busy >= x.capacity + x.max_queue for x in healthy)
        return
    chosen = next(x for x in pool if x.name == decision.deployment)
    assert chosen.healthy and chosen.engine_class in allowed
    free = [x for x in healthy if x.busy < x.capacity]
    if free:
        # never queue inside an engine while another deployment has a free slot
        assert chosen.busy < chosen.capacity
        free_gpu = [x for x in free if x.engine_class == "gpu"]
        if free_gpu:  # gpu preferred whenever one has room
            assert chosen.engine_class == "gpu"
            assert predicted_wait(chosen) == min(predicted_wait(x) for x in free_gpu)
        else:
            assert predicted_wait(chosen) == min(predicted_wait(x) for x in free)
    else:
        assert decision.reason == "engine_queue"
        assert chosen.busy < chosen.capacity + chosen.max_queue


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_after_consecutive_failures_then_probes_once() -> None:
    clock = Clock()
    b = CircuitBreaker(failure_threshold=3, open_s=10.0, clock=clock)
    for _ in range(2):
        assert b.acquire()
        b.failure()
    b.success()  # a success resets the count: failures must be consecutive
    for _ in range(3):
        assert b.state == "closed"
        b.failure()
    assert (b.state, b.available(), b.acquire()) == ("open", False, False)
    assert b.retry_after_s() == 10.0
    clock.now += 9.9
    assert not b.available()
    clock.now += 0.1
    assert (b.state, b.available()) == ("half_open", True)
    assert b.acquire()  # the probe
    assert (b.available(), b.acquire()) == (False, False)  # only one at a time
    b.failure()  # the probe failed: open for another open_s
    assert b.state == "open" and b.retry_after_s() == 10.0
    clock.now += 10
    assert b.acquire()
    b.success()
    assert (b.state, b.available()) == ("closed", True)


def test_breaker_probe_released_without_verdict_lets_another_probe() -> None:
    clock = Clock()
    b = CircuitBreaker(failure_threshold=1, open_s=1.0, clock=clock)
    b.failure()
    clock.now += 1
    assert b.acquire()
    b.release_probe()  # e.g. the client went away before anything was known
    assert b.acquire()


def test_breaker_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="failure_threshold"):
        CircuitBreaker(failure_threshold=0)


async def test_queue_bounded_and_fair_share() -> None:
    q = GatewayQueue(4, team_share=0.5)
    a1, a2 = q.enter("a"), q.enter("a")
    with pytest.raises(QueueRefused) as refused:
        q.enter("a")
    assert refused.value.reason == "fair_share"
    q.enter("b")
    q.enter("c")
    with pytest.raises(QueueRefused) as full:
        q.enter("d")
    assert full.value.reason == "queue_full"
    assert q.depth == 4 and q.is_head(a1)
    q.leave(a1, served=True)
    assert q.depth == 3 and not q.is_head(a2)  # team a went to the back of the rotation


async def test_queue_round_robin_between_teams() -> None:
    q = GatewayQueue(100, team_share=1.0)
    tickets = [q.enter(team) for team in ["a", "a", "a", "b", "c", "b"]]
    order = []
    while q.depth:
        head = q.head()
        assert head is not None
        order.append(head.team)
        q.leave(head, served=True)
    assert order == ["a", "b", "c", "a", "b", "a"]
    assert all(t not in (q.head(),) for t in tickets)


async def test_queue_wakes_the_head_on_notify() -> None:
    q = GatewayQueue(10)
    head = q.enter("a")
    second = q.enter("b")
    woke = asyncio.ensure_future(head.wait(60))
    other = asyncio.ensure_future(second.wait(60))
    await asyncio.sleep(0)
    q.notify()
    await asyncio.wait_for(woke, 5)
    assert not other.done()  # only the head is woken
    q.leave(head, served=True)  # ... and leaving wakes the next head
    await asyncio.wait_for(other, 5)


def test_queue_one_place_minimum_per_team() -> None:
    q = GatewayQueue(1, team_share=0.1)
    assert q.per_team == 1
    q.enter("a")
    assert list(itertools.islice([q.depth], 1)) == [1]
