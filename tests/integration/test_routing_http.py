"""Routing across real engines behind one model id, over real HTTP with the `openai` SDK.

One model, "mixed", has two deployments: the real vLLM engine on the tiny generated Llama
(class gpu) and the real llama.cpp engine on Gemma 3 270M (class edge), two sequences each and no
engine-side queue, so the gateway's own decisions show: overflow, its wait queue, 429 and 503,
the circuit breaker, the retry before the first token, the abort on disconnect.

What cannot happen on demand in a real engine is injected in front of it by `Injected`: holding
its output back (to keep a deployment busy) and failing (at submission, before the first token,
after it).  Everything else is the real engines and the real gateway.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from live_server import serve_in_thread

from backends.errors import EngineFailure
from backends.llamacpp import LlamaCppEngine, LlamaCppOptions
from backends.types import (
    EmbeddingRequest,
    EmbeddingResult,
    Engine,
    EngineLoad,
    GenerationDelta,
    GenerationHandle,
    GenerationRequest,
)
from backends.vllm import VllmEngine, VllmOptions
from gateway.access.keys import key_store
from gateway.app import create_app
from gateway.config import load_settings
from gateway.engines.breaker import CircuitBreaker
from gateway.engines.registry import Deployment, ModelRegistry, ServedModel

pytestmark = pytest.mark.engine

MODEL = "mixed"
GPU, EDGE = "mixed-gpu", "mixed-edge"
WAIT_S = 120.0


class Injected:
    """A real engine with test-controlled holds and faults in front of it."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.name = inner.name
        self.task = inner.task
        self.hold = threading.Event()  # cleared: handles hold their output back
        self.hold.set()
        self.fail_submit = 0  # the next N submissions fail
        self.fail_before_first = 0  # the next N streams fail before their first delta
        self.fail_after_first = 0  # the next N streams fail after their first delta
        self.seen: list[GenerationRequest] = []  # every request submitted, as the engine got it

    async def start(self) -> None:
        await self.inner.start()

    async def stop(self) -> None:
        await self.inner.stop()

    def load(self) -> EngineLoad:
        return self.inner.load()

    @property
    def context_length(self) -> int:
        return self.inner.context_length

    @property
    def embedding_size(self) -> int | None:
        return self.inner.embedding_size

    @property
    def truncatable(self) -> bool:
        return self.inner.truncatable

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult:
        return await self.inner.embed(request)

    async def submit(self, request: GenerationRequest) -> GenerationHandle:
        self.seen.append(request)
        if self.fail_submit:
            self.fail_submit -= 1
            raise EngineFailure("injected failure at submission")
        handle = await self.inner.submit(request)
        before = after = False
        if self.fail_before_first:
            self.fail_before_first -= 1
            before = True
        elif self.fail_after_first:
            self.fail_after_first -= 1
            after = True
        return _Handle(self, handle, before, after)


class _Handle:
    def __init__(self, owner: Injected, inner: GenerationHandle, before: bool, after: bool) -> None:
        self._owner, self._inner = owner, inner
        self._before, self._after = before, after

    @property
    def prompt_tokens(self) -> int:
        return self._inner.prompt_tokens

    def cancel(self) -> None:
        self._inner.cancel()

    async def __aiter__(self) -> AsyncIterator[GenerationDelta]:
        if not self._owner.hold.is_set():
            await asyncio.to_thread(self._owner.hold.wait)
        if self._before:
            self._inner.cancel()
            raise EngineFailure("injected failure before the first token")
        first = True
        async for delta in self._inner:
            yield delta
            if first and self._after:
                self._inner.cancel()
                raise EngineFailure("injected failure after the first token")
            first = False


class Clock:
    """The circuit breakers' clock, moved by the tests (no waiting for `open_s` to pass)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


OPEN_S = 30.0


class Gateway:
    def __init__(
        self,
        base: str,
        key: str,
        gpu: Injected,
        edge: Injected,
        registry: ModelRegistry,
        db: Path,
        clock: Clock,
    ) -> None:
        self.base, self.key, self.gpu, self.edge, self.registry, self.db = (
            base,
            key,
            gpu,
            edge,
            registry,
            db,
        )
        self.other_key = ""
        self.clock = clock
        if base:
            self.connect(base)

    def connect(self, base: str) -> None:
        self.base = base
        self.client = openai.OpenAI(base_url=f"{base}/v1", api_key=self.key, max_retries=0)
        self.http = httpx.Client(
            base_url=base, headers={"authorization": f"Bearer {self.key}"}, timeout=WAIT_S
        )

    def deployment(self, name: str) -> Deployment:
        return next(d for d in self.registry.deployments if d.name == name)

    def metrics(self) -> str:
        return self.http.get("/metrics").text

    def metric(self, name: str, **labels: str) -> float:
        """One series' value from /metrics (0 when absent)."""
        text = self.metrics()
        for line in text.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def wait_until(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        done = threading.Event()
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting until {what}")
            done.wait(0.02)  # a bounded pause between polls of the condition

    def complete(self, max_tokens: int = 4, **extra: Any) -> Any:
        """A non-streaming completion: the raw response (status, headers) and its body."""
        return self.client.completions.with_raw_response.create(
            model=MODEL, prompt="hello there", max_tokens=max_tokens, temperature=0, **extra
        )

    def audit(self, request_id: str) -> list[tuple[str, str]]:
        """(kind, body) of one request's audit events."""
        with sqlite3.connect(self.db) as conn:
            rows = conn.execute(
                "SELECT kind, body FROM audit_events WHERE body LIKE ? ORDER BY seq",
                (f'%"request_id":"{request_id}"%',),
            ).fetchall()
        return [(k, b) for k, b in rows]

    def reset(self) -> None:
        for engine in (self.gpu, self.edge):
            engine.hold.set()
            engine.fail_submit = engine.fail_before_first = engine.fail_after_first = 0
        self.wait_until(
            lambda: (
                all(d.inflight == 0 for d in self.registry.deployments)
                and self.metric("airgate_router_queue_depth") == 0
            ),
            "no request is in flight",
        )
        for d in self.registry.deployments:
            d.breaker.success()


@pytest.fixture(scope="module")
def gateway(
    tiny_llama: Path, gguf_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    data = tmp_path_factory.mktemp("routing")
    settings = load_settings(
        None,
        environ={},
        overrides={
            "data_dir": str(data),
            "routing.queue_size": 2,
            "routing.queue_timeout_s": 2.0,
            "routing.team_share": 1.0,
        },
    )

    async def make_keys() -> tuple[str, str]:
        async with key_store(settings) as store:
            one = await store.create("app", team="routing", name="routing-test")
            other = await store.create("app", team="other-team", name="routing-other")
            return one[0], other[0]

    key, other_key = asyncio.run(make_keys())
    gpu = Injected(
        VllmEngine(
            str(tiny_llama),
            VllmOptions(
                max_num_seqs=2,
                max_waiting=0,
                max_model_len=512,
                dtype="float32",
                kv_cache_space_gib=1,
                enforce_eager=True,
            ),
        )
    )
    edge = Injected(
        LlamaCppEngine(str(gguf_path), LlamaCppOptions(slots=2, max_waiting=0, context_length=512))
    )
    clock = Clock()

    def breaker() -> CircuitBreaker:  # on the test's clock
        return CircuitBreaker(failure_threshold=2, open_s=OPEN_S, clock=clock)

    registry = ModelRegistry(
        [
            ServedModel(
                MODEL,
                [
                    Deployment(GPU, gpu, engine_class="gpu", breaker=breaker()),
                    Deployment(EDGE, edge, breaker=breaker()),
                ],
            )
        ]
    )
    app = create_app(settings, registry=registry)
    gateway = Gateway("", key, gpu, edge, registry, data / "airgate.db", clock)
    gateway.other_key = other_key
    with serve_in_thread(app) as base:
        gateway.connect(base)
        yield gateway


@pytest.fixture
def gw(gateway: Gateway) -> Iterator[Gateway]:
    gateway.reset()
    yield gateway
    gateway.reset()


def _hold_streams(gw: Gateway, count: int, pool: ThreadPoolExecutor) -> list[Any]:
    """`count` streaming requests that stay in flight until their engine's hold is lifted."""

    def one() -> str:
        with gw.client.completions.with_streaming_response.create(
            model=MODEL, prompt="hold", max_tokens=3, temperature=0, stream=True
        ) as resp:
            deployment = resp.headers["x-airgate-deployment"]
            for _ in resp.iter_lines():
                pass
            return deployment

    return [pool.submit(one) for _ in range(count)]


def test_requests_prefer_gpu_and_report_the_deployment(gw: Gateway) -> None:
    raw = gw.complete()
    assert raw.status_code == 200
    assert raw.headers["x-airgate-deployment"] == GPU
    assert gw.metric("airgate_router_decisions_total", deployment=GPU, reason="gpu") >= 1


def test_each_team_gets_its_own_prefix_cache_salt(gw: Gateway) -> None:
    other = openai.OpenAI(base_url=f"{gw.base}/v1", api_key=gw.other_key, max_retries=0)
    salts = []
    for client in (gw.client, gw.client, other):
        client.completions.create(model=MODEL, prompt="same prefix", max_tokens=1)
        salts.append(gw.gpu.seen[-1].cache_salt)
    assert salts[0] == salts[1]  # one team shares its cache
    assert salts[0] != salts[2]  # another team does not
    assert all(s and re.fullmatch(r"[0-9a-f]{32}", s) for s in salts)  # derived, not the name
    assert gw.gpu.seen[-1].priority == 0  # the default policy's priority


def test_saturated_gpu_overflows_to_edge_then_queues_then_429(gw: Gateway) -> None:
    overflow_before = gw.metric("airgate_router_overflow_total", deployment=EDGE)
    with ThreadPoolExecutor(8) as pool:
        gw.gpu.hold.clear()
        held_gpu = _hold_streams(gw, 2, pool)
        gw.wait_until(lambda: gw.deployment(GPU).inflight == 2, "both gpu slots are taken")

        raw = gw.complete()  # gpu saturated: overflow to edge
        assert raw.status_code == 200 and raw.headers["x-airgate-deployment"] == EDGE
        assert gw.metric("airgate_router_overflow_total", deployment=EDGE) == overflow_before + 1

        gw.edge.hold.clear()
        held_edge = _hold_streams(gw, 2, pool)
        gw.wait_until(lambda: gw.deployment(EDGE).inflight == 2, "both edge slots are taken")

        # everything is full: two requests wait at the gateway, the third finds the queue full
        queued = [pool.submit(gw.complete) for _ in range(2)]
        gw.wait_until(lambda: gw.metric("airgate_router_queue_depth") == 2, "two requests queue")
        with pytest.raises(openai.RateLimitError) as full:
            gw.complete()
        assert full.value.response.headers["retry-after"] == "1"
        assert full.value.body["code"] == "engine_overloaded"  # type: ignore[index]

        gw.gpu.hold.set()  # the gpu streams finish: the queued requests take their slots
        assert sorted(f.result(WAIT_S) for f in held_gpu) == [GPU, GPU]
        served = [f.result(WAIT_S) for f in queued]
        assert all(r.status_code == 200 for r in served)
        assert {r.headers["x-airgate-deployment"] for r in served} == {GPU}
        gw.edge.hold.set()
        assert sorted(f.result(WAIT_S) for f in held_edge) == [EDGE, EDGE]
    assert gw.metric("airgate_router_rejections_total", reason="queue_full") >= 1


def test_queued_request_times_out_with_429(gw: Gateway) -> None:
    with ThreadPoolExecutor(6) as pool:
        gw.gpu.hold.clear()
        gw.edge.hold.clear()
        held = _hold_streams(gw, 4, pool)
        gw.wait_until(
            lambda: gw.deployment(GPU).inflight == 2 and gw.deployment(EDGE).inflight == 2,
            "every slot is taken",
        )
        before = gw.metric("airgate_router_rejections_total", reason="queue_timeout")
        with pytest.raises(openai.RateLimitError) as timed_out:
            gw.complete()  # waits queue_timeout_s (2 s), then 429
        assert "retry-after" in timed_out.value.response.headers
        assert gw.metric("airgate_router_rejections_total", reason="queue_timeout") == before + 1
        gw.gpu.hold.set()
        gw.edge.hold.set()
        for f in held:
            f.result(WAIT_S)


def test_failures_open_the_circuit_and_a_probe_closes_it(gw: Gateway) -> None:
    retries = gw.metric("airgate_router_retries_total", model_name=MODEL)
    gw.gpu.fail_submit = 1000
    for _ in range(2):  # each fails on gpu and is retried on edge: the client sees a success
        raw = gw.complete()
        assert raw.status_code == 200 and raw.headers["x-airgate-deployment"] == EDGE
        events = gw.audit(raw.headers["x-request-id"])
        assert [k for k, _ in events] == ["inference.admitted", "inference.completed"]
        assert '"deployment":"mixed-edge"' in events[-1][1] and '"attempts":2' in events[-1][1]
    assert gw.metric("airgate_router_retries_total", model_name=MODEL) == retries + 2
    assert gw.metric("airgate_router_circuit_state", deployment=GPU) == 2  # open

    raw = gw.complete()  # the open circuit keeps gpu out: straight to edge, no retry
    assert raw.headers["x-airgate-deployment"] == EDGE
    assert gw.metric("airgate_router_retries_total", model_name=MODEL) == retries + 2
    assert gw.metric("airgate_router_decisions_total", deployment=EDGE, reason="edge") >= 1

    gw.gpu.fail_submit = 0  # the engine recovers; after open_s one probe is let through
    gw.clock.now += OPEN_S - 0.5
    assert gw.metric("airgate_router_circuit_state", deployment=GPU) == 2  # still open
    gw.clock.now += 0.5
    assert gw.metric("airgate_router_circuit_state", deployment=GPU) == 1  # half-open
    raw = gw.complete()
    assert raw.headers["x-airgate-deployment"] == GPU
    assert gw.metric("airgate_router_circuit_state", deployment=GPU) == 0  # closed again


def test_nothing_healthy_gives_503_with_retry_after(gw: Gateway) -> None:
    gw.gpu.fail_submit = gw.edge.fail_submit = 1000
    while gw.metric("airgate_router_circuit_state", deployment=GPU) != 2 or (
        gw.metric("airgate_router_circuit_state", deployment=EDGE) != 2
    ):
        with pytest.raises(openai.APIStatusError) as failed:
            gw.complete()
        assert failed.value.status_code in (500, 503)
    with pytest.raises(openai.InternalServerError) as unavailable:
        gw.complete()
    assert unavailable.value.status_code == 503
    assert int(unavailable.value.response.headers["retry-after"]) == OPEN_S
    assert gw.metric("airgate_router_rejections_total", reason="unavailable") >= 1


def test_failure_before_the_first_token_is_retried_elsewhere(gw: Gateway) -> None:
    gw.gpu.fail_before_first = 1
    chunks = list(
        gw.client.completions.create(
            model=MODEL, prompt="retry me", max_tokens=4, temperature=0, stream=True
        )
    )
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    assert gw.metric("airgate_router_retries_total", model_name=MODEL) >= 1


def test_failure_after_the_first_token_ends_the_stream_with_an_error(gw: Gateway) -> None:
    gw.gpu.fail_after_first = 1
    stream = gw.client.completions.create(
        model=MODEL, prompt="fail me", max_tokens=16, temperature=0, stream=True
    )
    with pytest.raises(openai.APIError, match="engine failed"):
        for _ in stream:
            pass


def test_disconnect_aborts_the_generation_in_the_engine(gw: Gateway, tiny_llama: Path) -> None:
    from transformers import AutoTokenizer

    eos = AutoTokenizer.from_pretrained(str(tiny_llama)).eos_token_id
    vllm = gw.gpu.inner
    body = {
        "model": MODEL,
        "prompt": "go on",
        "max_tokens": 480,
        "temperature": 0,
        "stream": True,
        "logit_bias": {str(eos): -100},  # no early end: only the abort can stop it
    }
    with gw.http.stream("POST", "/v1/completions", json=body) as resp:
        request_id = resp.headers["x-request-id"]
        assert resp.headers["x-airgate-deployment"] == GPU
        for line in resp.iter_lines():
            if re.search(r'"text":"[^"]', line):
                break  # the first content chunk: now leave
    gw.wait_until(lambda: vllm.load().running == 0, "the engine stops generating")
    gw.wait_until(lambda: gw.deployment(GPU).inflight == 0, "the router frees the slot")
    gw.wait_until(lambda: len(gw.audit(request_id)) == 2, "the request is audited")
    kind, event = gw.audit(request_id)[-1]
    assert kind == "inference.cancelled"
    found = re.search(r'"completion_tokens":(\d+)', event)
    assert found is not None and int(found.group(1)) < 480
