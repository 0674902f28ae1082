"""Prometheus counters and histograms for code that runs on the event loop's thread.

prometheus_client's Counter and Histogram take a mutex per increment and resolve their label
values at every `labels()` call; an inference request makes about twenty such calls (one per
streamed token for the inter-token latency), which py-spy showed as 6% of the gateway's CPU on
the echo engine.  Everything that records request metrics runs on the one event loop, so these
keep children by label values in a dict and add without a lock.  They are exposed exactly as
prometheus_client exposes its own (`<name>_total`, `_bucket{le=...}`, `_sum`, `_count`).

Not thread-safe by design: only the event loop's thread may record; a scrape (`collect`) may
come from anywhere, and reads a consistent-enough snapshot (a list copy per family).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["LoopCounter", "LoopHistogram"]


class _CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class _HistogramChild:
    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket (not cumulative); the last is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self._bounds, value)] += 1
        self.sum += value


class LoopCounter(Collector):
    """A labelled Prometheus counter for the event loop's thread: no lock per increment and
    children kept by label values, so `labels(...).inc()` costs a dict lookup and an add
    (prometheus_client's Counter takes a mutex per increment and validates labels per call;
    the request path makes about twenty such calls per request).  Exposed exactly as
    prometheus_client exposes a Counter (`<name>_total`)."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
    ) -> None:
        self._name, self._doc, self._labelnames = name, documentation, tuple(labelnames)
        self._children: dict[tuple[str, ...], _CounterChild] = {}
        registry.register(self)

    def labels(self, *values: str) -> _CounterChild:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self._labelnames):
                raise ValueError(f"{self._name} takes {len(self._labelnames)} label values")
            child = self._children[tuple(str(v) for v in values)] = _CounterChild()
        return child

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self._name, self._doc, labels=self._labelnames)
        for values, child in list(self._children.items()):
            family.add_metric(values, child.value)
        yield family


class LoopHistogram(Collector):
    """A labelled Prometheus histogram for the event loop's thread (see `LoopCounter`): an
    observation is one bisect and two adds.  Exposed as prometheus_client's Histogram."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        registry: CollectorRegistry,
        buckets: Sequence[float],
    ) -> None:
        self._name, self._doc, self._labelnames = name, documentation, tuple(labelnames)
        self._bounds = tuple(float(b) for b in buckets if b != float("inf"))
        self._les = [floatToGoString(b) for b in self._bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        self._children: dict[tuple[str, ...], _HistogramChild] = {}
        registry.register(self)

    def labels(self, *values: str) -> _HistogramChild:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self._labelnames):
                raise ValueError(f"{self._name} takes {len(self._labelnames)} label values")
            child = self._children[tuple(str(v) for v in values)] = _HistogramChild(self._bounds)
        return child

    def observe(self, value: float) -> None:
        """Observe on the unlabelled histogram."""
        self.labels().observe(value)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self._name, self._doc, labels=self._labelnames)
        for values, child in list(self._children.items()):
            cumulative, buckets = 0, []
            for le, count in zip(self._les, child.counts, strict=True):
                cumulative += count
                buckets.append((le, float(cumulative)))
            family.add_metric(values, buckets, child.sum)
        yield family
