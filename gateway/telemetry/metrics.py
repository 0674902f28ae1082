"""Prometheus metrics: vLLM's names (so existing dashboards work) plus `airgate_*`.

Engine series are labelled by model, engine kind and deployment (one model may have several).

Each app gets its own CollectorRegistry, so several apps can live in one process (tests).
Engine gauges are read at scrape time from `Engine.load()`; nothing here holds content.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from ..engines.registry import ModelRegistry
from .loop_metrics import LoopCounter, LoopHistogram

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LABELS = ("model_name", "engine", "deployment")
_TTFT_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
_ITL_BUCKETS = (0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.2, 0.4, 0.8, 1.6)
_E2E_BUCKETS = (0.1, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0)


class _EngineCollector(Collector):
    def __init__(self, models: ModelRegistry) -> None:
        self._models = models

    def collect(self) -> Iterator[GaugeMetricFamily]:
        running = GaugeMetricFamily(
            "vllm:num_requests_running", "Requests generating now", labels=_LABELS
        )
        waiting = GaugeMetricFamily(
            "vllm:num_requests_waiting", "Requests waiting for a slot", labels=_LABELS
        )
        kv = GaugeMetricFamily("vllm:kv_cache_usage_perc", "KV-cache use, 0..1", labels=_LABELS)
        for d in self._models.deployments:
            load = d.engine.load()
            labels = [d.model_id, d.engine.name, d.name]
            running.add_metric(labels, load.running)
            waiting.add_metric(labels, load.waiting)
            kv.add_metric(labels, load.kv_usage)
        yield running
        yield waiting
        yield kv


class _GaugeCollector(Collector):
    """Gauges read at scrape time from a callable: name -> (help, value)."""

    def __init__(self, read: Callable[[], dict[str, tuple[str, float]]]) -> None:
        self._read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for name, (text, value) in self._read().items():
            yield GaugeMetricFamily(name, text, value=value)


class _CounterCollector(Collector):
    """`<name>_total{label=...}` read at scrape time from a callable: label value -> count."""

    def __init__(
        self, name: str, text: str, label: str, read: Callable[[], dict[str, float]]
    ) -> None:
        self._name, self._text, self._label, self._read = name, text, label, read

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self._name, self._text, labels=[self._label])
        for value, count in self._read().items():
            family.add_metric([value], count)
        yield family


class _InfoCollector(Collector):
    """`<name>_info{labels} 1`, the labels read at scrape time (None: no series)."""

    def __init__(self, name: str, text: str, read: Callable[[], dict[str, str] | None]) -> None:
        self._name, self._text, self._read = name, text, read

    def collect(self) -> Iterator[InfoMetricFamily]:
        labels = self._read()
        if labels is not None:
            yield InfoMetricFamily(self._name, self._text, value=labels)


class Metrics:
    def watch(self, read: Callable[[], dict[str, tuple[str, float]]]) -> None:
        """Export the gauges `read()` returns at every scrape (access stack state)."""
        self.registry.register(_GaugeCollector(read))

    def count(self, name: str, text: str, label: str, read: Callable[[], dict[str, float]]) -> None:
        """Export the counter `<name>_total`, one series per value of `label`, as `read()`
        returns them at every scrape (counts kept elsewhere: the egress guard's refusals)."""
        self.registry.register(_CounterCollector(name, text, label, read))

    def info(self, name: str, text: str, read: Callable[[], dict[str, str] | None]) -> None:
        """Export `<name>_info{labels} 1` with the labels `read()` returns at every scrape
        (the policy version: replicas that disagree show on one dashboard)."""
        self.registry.register(_InfoCollector(name, text, read))

    def __init__(self, models: ModelRegistry) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call] # as vLLM does: `_created` series only add cardinality
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.ttft = LoopHistogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token",
            _LABELS,
            registry=r,
            buckets=_TTFT_BUCKETS,
        )
        self.itl = LoopHistogram(
            "vllm:inter_token_latency_seconds",
            "Time between streamed tokens",
            _LABELS,
            registry=r,
            buckets=_ITL_BUCKETS,
        )
        self.e2e = LoopHistogram(
            "vllm:e2e_request_latency_seconds",
            "Request latency",
            _LABELS,
            registry=r,
            buckets=_E2E_BUCKETS,
        )
        self.prompt_tokens = LoopCounter(
            "vllm:prompt_tokens", "Prompt tokens processed", _LABELS, registry=r
        )
        self.generation_tokens = LoopCounter(
            "vllm:generation_tokens", "Tokens generated", _LABELS, registry=r
        )
        self.request_success = LoopCounter(
            "vllm:request_success",
            "Finished requests by finish reason",
            (*_LABELS, "finished_reason"),
            registry=r,
        )
        self.requests = LoopCounter(
            "airgate_requests", "HTTP requests by route and status", ("route", "status"), registry=r
        )
        r.register(_EngineCollector(models))

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
