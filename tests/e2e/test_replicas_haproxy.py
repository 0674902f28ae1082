"""Three replicas behind a real HAProxy under mixed load, through a crash and a drain.

Three `airgate serve` (echo engine) share one PostgreSQL database (keys; the strict audit log,
one chain per replica), one Redis (limits) and one pepper (`tests/e2e/replicas.py`).  For
`AIRGATE_REPLICA_LOAD_S` seconds (180 by default; shorter for local iteration) 16 clients send
chat completions through HAProxy, alternating streamed (read to `data: [DONE]`) and whole ones,
without max_tokens, each pausing up to 0.1 s between requests.  At a third of the run replica
r1 gets SIGKILL and is started again on its data dir and chain; at two thirds r2 gets SIGTERM
(a graceful drain), must exit 0, and is started again.  Meanwhile, until the kill, a second team
whose policy allows 60 requests/min sends 5 requests/s.

Every request is recorded: when it was sent and ended, its status, whether it arrived whole,
its `x-request-id`, and the replica that answered (`x-served-by`, set by HAProxy).  Then:

- failures only among requests in flight on r1 when it was killed (at most one per client);
  none attributable to the drain, none anywhere else;
- every acknowledged request (a 200 read whole) has its `inference.completed` audit event,
  found by request id in the shared database after the replicas stopped: none lost;
- `airgate audit verify` (every chain, the pinned keys) passes;
- the limited team got no more than the shared GCRA allows across all replicas: its burst
  (`default_request_burst`) plus one request a second over the window, plus one; a limiter
  kept in each replica would have let about three times that through.

A summary table is printed (run with `-s` to see it on success).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from replicas import Cluster, cluster

from gateway.access.limits.gcra import default_request_burst

pytestmark = pytest.mark.e2e

LOAD_S = float(os.environ.get("AIRGATE_REPLICA_LOAD_S", "180"))
REPLICAS = 3
CONCURRENCY = 16
THINK_S = 0.1  # each client pauses up to this between requests (uniformly), as users do
LIMIT_RPM = 60
LIMIT_EVERY_S = 0.2  # the limited team sends 5 requests/s: five times its limit
LIMIT_WINDOW_S = min(60.0, LOAD_S / 3 - 1)  # ends before the kill: one minute at most
# after the killed process is reaped, HAProxy may still hold a pooled connection to it for
# as long as its event loop takes to see the reset: failures begun this soon after still count
KILL_SLACK_S = 0.5
KILLED, DRAINED = "r1", "r2"
BODY = {"model": "echo", "messages": [{"role": "user", "content": "Tell me about the tides."}]}

POLICY = f"""\
name = "replicas"
description = "The replica e2e test: one team limited to {LIMIT_RPM} requests/min, one not."

[[rules]]
name = "limited"
teams = ["limited"]
roles = ["app"]
models = ["echo"]
requests_per_minute = {LIMIT_RPM}

[[rules]]
name = "load"
teams = ["load"]
roles = ["app"]
models = ["echo"]
requests_per_minute = 10000000
tokens_per_minute = 10000000000
concurrent_streams = 10000
"""
KEYS: dict[str, tuple[str, str | None]] = {"load": ("app", "load"), "limited": ("app", "limited")}


@dataclass(frozen=True)
class Outcome:
    """One request as its client saw it."""

    client: str  # "load" or "limited"
    stream: bool
    start: float  # time.monotonic() before it was sent
    end: float  # when its response ended, or it failed
    status: int | None  # None: no response at all
    whole: bool  # a 200 read to its end: the JSON body, or the stream to `data: [DONE]`
    request_id: str | None
    served_by: str | None  # HAProxy's x-served-by: the replica that answered ("": none)
    error: str | None  # why it is not whole: an exception class, "status N", "error event"

    @property
    def acknowledged(self) -> bool:
        return self.status == 200 and self.whole

    def overlaps(self, start: float, end: float) -> bool:
        return self.start <= end and self.end >= start


async def send(http: httpx.AsyncClient, client: str, stream: bool) -> Outcome:
    start = time.monotonic()
    status = request_id = served_by = error = None
    whole = False
    try:
        body = {**BODY, "stream": True} if stream else BODY
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            status = response.status_code
            request_id = response.headers.get("x-request-id")
            served_by = response.headers.get("x-served-by")
            if status != 200:
                await response.aread()
                error = f"status {status}"
            elif stream:
                async for line in response.aiter_lines():
                    if line == "data: [DONE]":
                        whole = True
                    elif line.startswith("data: ") and "error" in json.loads(line[6:]):
                        error = "error event"
                if not whole and error is None:
                    error = "no [DONE]"
                whole = whole and error is None
            else:
                data = json.loads(await response.aread())
                whole = bool(data["choices"][0]["message"]["content"])
    except httpx.HTTPError as exc:
        error = type(exc).__name__
    return Outcome(
        client, stream, start, time.monotonic(), status, whole, request_id, served_by, error
    )


async def load_client(
    url: str, headers: dict[str, str], until: float, first_stream: bool, seed: int
) -> list[Outcome]:
    """One user: requests one after another, streamed and whole in turn, until `until`."""
    rng = random.Random(seed)
    outcomes: list[Outcome] = []
    stream = first_stream
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http:
        while time.monotonic() < until:
            outcomes.append(await send(http, "load", stream))
            stream = not stream
            await asyncio.sleep(rng.uniform(0, THINK_S))
    return outcomes


async def limited_client(url: str, headers: dict[str, str], start: float) -> list[Outcome]:
    """The limited team: a request every LIMIT_EVERY_S for LIMIT_WINDOW_S, on schedule
    (not waiting for answers)."""
    sent: list[asyncio.Task[Outcome]] = []
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http:
        for i in range(math.ceil(LIMIT_WINDOW_S / LIMIT_EVERY_S)):
            await asyncio.sleep(max(0.0, start + i * LIMIT_EVERY_S - time.monotonic()))
            sent.append(asyncio.create_task(send(http, "limited", False)))
        return list(await asyncio.gather(*sent))


@dataclass
class Timeline:
    """When the faults happened (time.monotonic()) and how the processes ended."""

    start: float = 0.0
    kill: float = 0.0  # SIGKILL sent to KILLED
    killed: float = 0.0  # ... and the process reaped
    killed_code: int | None = None
    back_1: float = 0.0  # KILLED ready again and UP in HAProxy
    term: float = 0.0  # SIGTERM sent to DRAINED
    drained: float = 0.0  # ... and the process exited
    drained_code: int | None = None
    back_2: float = 0.0  # DRAINED ready again and UP in HAProxy


async def faults(c: Cluster, t: Timeline) -> None:
    """SIGKILL KILLED at a third of the run and start it again; SIGTERM DRAINED at two
    thirds, wait for its exit and start it again.  Blocking waits run in threads: the load
    goes on meanwhile."""
    killed, drained = c.replicas[KILLED], c.replicas[DRAINED]
    assert killed.process is not None and drained.process is not None
    await asyncio.sleep(max(0.0, t.start + LOAD_S / 3 - time.monotonic()))
    t.kill = time.monotonic()
    killed.signal(signal.SIGKILL)
    t.killed_code = await asyncio.to_thread(killed.process.wait)
    t.killed = time.monotonic()
    await asyncio.to_thread(c.start, KILLED)
    t.back_1 = time.monotonic()

    await asyncio.sleep(max(0.0, t.start + 2 * LOAD_S / 3 - time.monotonic()))
    t.term = time.monotonic()
    drained.signal(signal.SIGTERM)
    t.drained_code = await asyncio.to_thread(drained.process.wait, 60)
    t.drained = time.monotonic()
    await asyncio.to_thread(c.start, DRAINED)
    t.back_2 = time.monotonic()


async def drive(c: Cluster) -> tuple[list[Outcome], Timeline]:
    t = Timeline(start=time.monotonic())
    until = t.start + LOAD_S
    clients = [
        load_client(c.url, c.auth("load"), until, i % 2 == 0, seed=i) for i in range(CONCURRENCY)
    ]
    results = await asyncio.gather(
        faults(c, t), limited_client(c.url, c.auth("limited"), t.start), *clients
    )
    outcomes = [o for batch in results[1:] if batch for o in batch]
    return outcomes, t


@dataclass
class Run:
    outcomes: list[Outcome]
    t: Timeline
    stop_codes: dict[str, int | None]
    completed_ids: set[str]  # request ids of inference.completed events in the database
    verify: Any  # `airgate audit verify`: (exit status, its JSON report or stderr)
    served: Counter[str | None] = field(default_factory=Counter)

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.acknowledged and o.status != 429]

    def killed(self) -> list[Outcome]:
        """Failures that were in flight on KILLED when it died (or went to it before HAProxy
        could know: see KILL_SLACK_S)."""
        t = self.t
        return [
            o
            for o in self.failures
            if o.overlaps(t.kill, t.killed + KILL_SLACK_S) and o.served_by in (KILLED, "", None)
        ]

    def drained(self) -> list[Outcome]:
        """Other failures while DRAINED drained, was down, or came back."""
        killed = set(map(id, self.killed()))
        return [
            o
            for o in self.failures
            if id(o) not in killed and o.overlaps(self.t.term, self.t.back_2)
        ]

    def other(self) -> list[Outcome]:
        attributed = {id(o) for o in (*self.killed(), *self.drained())}
        return [o for o in self.failures if id(o) not in attributed]

    def limited(self) -> tuple[int, int, float, int, int]:
        """The limited team: (200s, 429s, the window its requests spanned in s, the most the
        shared GCRA admits in that window, the fewest)."""
        sent = [o for o in self.outcomes if o.client == "limited"]
        ok = sum(o.acknowledged for o in sent)
        limited = sum(o.status == 429 for o in sent)
        first, last = min(o.start for o in sent), max(o.end for o in sent)
        arrivals = max(o.start for o in sent) - min(o.end for o in sent)  # at least this apart
        burst, per_s = default_request_burst(LIMIT_RPM), LIMIT_RPM / 60
        most = burst + math.floor((last - first) * per_s) + 1
        fewest = burst + math.floor(arrivals * per_s) - 1
        return ok, limited, last - first, most, fewest


def _brief(outcomes: list[Outcome], t0: float) -> str:
    return "; ".join(
        f"+{o.start - t0:.2f}s..+{o.end - t0:.2f}s {o.client} {'stream' if o.stream else 'json'} "
        f"{o.error} via {o.served_by or '?'}"
        for o in outcomes[:20]
    )


def summary(run: Run) -> str:
    t = run.t
    ok, limited, window, most, fewest = run.limited()
    causes = Counter(o.error for o in run.failures)
    acknowledged = [o for o in run.outcomes if o.acknowledged]
    in_flight = [
        o
        for o in run.outcomes
        if o.served_by in (KILLED, "", None) and o.overlaps(t.kill, t.killed + KILL_SLACK_S)
    ]
    verify_code, report = run.verify
    chains = report.get("chains", []) if isinstance(report, dict) else []
    rows = [
        ("load", f"{LOAD_S:.0f} s, {CONCURRENCY} clients, {REPLICAS} replicas behind HAProxy"),
        ("requests", f"{len(run.outcomes)} ({sum(o.stream for o in run.outcomes)} streamed)"),
        ("served by", ", ".join(f"{k or '?'} {v}" for k, v in sorted(run.served.items(), key=str))),
        ("acknowledged (200, whole)", str(len(acknowledged))),
        ("failed", str(len(run.failures))),
        ("  by cause", ", ".join(f"{k} {v}" for k, v in causes.most_common()) or "-"),
        (f"  {KILLED} SIGKILL (+{t.kill - t.start:.1f} s)",
         f"{len(run.killed())} failed of {len(in_flight)} in flight there (at most "
         f"{CONCURRENCY + 1} allowed); exit {t.killed_code}; UP again after "
         f"{t.back_1 - t.kill:.1f} s"),
        (f"  {DRAINED} SIGTERM (+{t.term - t.start:.1f} s)",
         f"{len(run.drained())} failed; exit {t.drained_code} after {t.drained - t.term:.2f} s; "
         f"UP again after {t.back_2 - t.term:.1f} s"),
        ("  elsewhere", str(len(run.other()))),
        ("audit events checked",
         f"{len(acknowledged)} acknowledged request ids against {len(run.completed_ids)} "
         f"inference.completed events: "
         f"{len({o.request_id for o in acknowledged} - run.completed_ids)} missing"),
        ("audit verify", f"exit {verify_code}; "
         + ", ".join(f"{c.get('log_id')} {'ok' if c.get('ok') else 'FAILED'} "
                     f"({c.get('rows', '?')} rows)" for c in chains)),
        (f"limit ({LIMIT_RPM}/min, team 'limited')",
         f"{ok} admitted, {limited} refused (429) in {window:.1f} s; shared GCRA allows "
         f"{fewest}..{most}; a limiter per replica would allow up to {REPLICAS * most}"),
        ("replica exits at the end", ", ".join(f"{k} {v}" for k, v in run.stop_codes.items())),
    ]  # fmt: skip
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    root = tmp_path_factory.mktemp("replicas")
    with cluster(root, REPLICAS, POLICY, KEYS) as c:
        outcomes, t = asyncio.run(drive(c))
        stop_codes = c.stop_replicas()  # each writes its closing checkpoint
        completed = c.database_rows(
            "SELECT body::json->>'request_id' FROM audit_events WHERE kind = 'inference.completed'"
        )
        verified = c.airgate(KILLED, "audit", "verify")
    try:
        report: Any = json.loads(verified.stdout)
    except ValueError:
        report = verified.stderr[-3000:]
    result = Run(
        outcomes,
        t,
        stop_codes,
        {r for r in completed if r},
        (verified.returncode, report),
        Counter(o.served_by for o in outcomes),
    )
    t0 = t.start
    with (root / "outcomes.jsonl").open("w") as f:  # for a failure's post-mortem
        for o in outcomes:
            f.write(json.dumps({**o.__dict__, "start": o.start - t0, "end": o.end - t0}) + "\n")
    print("\n" + summary(result))
    yield result


def test_every_replica_served_and_came_back(run: Run) -> None:
    t = run.t
    for name in ("r1", "r2", "r3"):
        assert run.served[name] > 0, summary(run)
    assert any(o.served_by == KILLED and o.start > t.back_1 for o in run.outcomes), summary(run)
    assert any(o.served_by == DRAINED and o.start > t.back_2 for o in run.outcomes), summary(run)


def test_only_requests_in_flight_on_the_killed_replica_fail(run: Run) -> None:
    assert len(run.killed()) <= CONCURRENCY + 1, summary(run)  # one request per client at most
    other = run.other()
    assert not other, f"{summary(run)}\n{_brief(other, run.t.start)}"


def test_a_drain_fails_nothing_and_exits_0(run: Run) -> None:
    drained = run.drained()
    assert not drained, f"{summary(run)}\n{_brief(drained, run.t.start)}"
    assert run.t.drained_code == 0, summary(run)


def test_no_acknowledged_request_is_missing_from_the_audit_log(run: Run) -> None:
    acknowledged = {o.request_id for o in run.outcomes if o.acknowledged}
    assert None not in acknowledged
    missing = acknowledged - run.completed_ids
    assert not missing, f"{summary(run)}\nmissing: {sorted(map(str, missing))[:20]}"


def test_every_chain_verifies(run: Run) -> None:
    code, report = run.verify
    assert code == 0, f"{summary(run)}\n{report}"
    assert isinstance(report, dict) and report["ok"]
    assert len(report["chains"]) >= REPLICAS and all(c["ok"] for c in report["chains"])


def test_a_team_limit_holds_across_replicas(run: Run) -> None:
    ok, limited, _, most, fewest = run.limited()
    assert fewest <= ok <= most, summary(run)
    assert limited > 0, summary(run)
