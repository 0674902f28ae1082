"""The event-loop counters and histograms are exposed exactly as prometheus_client's own."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from gateway.telemetry.loop_metrics import LoopCounter, LoopHistogram

BUCKETS = (0.005, 0.01, 0.1, 1.0, 2.5)
LABELS = st.sampled_from([("m", "llama.cpp", "d1"), ("m", "vllm", "d2"), ("x", "echo", "x")])


def _exposition(registry: CollectorRegistry) -> list[str]:
    # prometheus_client adds `_created` series unless disabled process-wide; ours never have them
    return [
        line for line in generate_latest(registry).decode().splitlines() if "_created" not in line
    ]


@settings(deadline=None, max_examples=100)
@given(
    st.lists(
        st.tuples(
            LABELS,
            st.floats(0, 10, allow_nan=False) | st.sampled_from(BUCKETS),
            st.integers(0, 50),
        ),
        max_size=40,
    )
)
def test_same_exposition_as_prometheus_client(
    observations: list[tuple[tuple[str, str, str], float, int]],
) -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    names = ("model_name", "engine", "deployment")
    h1 = Histogram("vllm:t_seconds", "Doc", names, registry=theirs, buckets=BUCKETS)
    c1 = Counter("vllm:toks", "Doc", names, registry=theirs)
    h2 = LoopHistogram("vllm:t_seconds", "Doc", names, ours, buckets=BUCKETS)
    c2 = LoopCounter("vllm:toks", "Doc", names, ours)
    for labels, value, count in observations:
        h1.labels(*labels).observe(value)
        h2.labels(*labels).observe(value)
        c1.labels(*labels).inc(count)
        c2.labels(*labels).inc(count)
    assert _exposition(ours) == _exposition(theirs)


def test_unlabelled_histogram_and_label_count() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    Histogram("overhead_seconds", "Doc", registry=theirs, buckets=BUCKETS).observe(0.02)
    LoopHistogram("overhead_seconds", "Doc", (), ours, buckets=BUCKETS).observe(0.02)
    assert _exposition(ours) == _exposition(theirs)
    counter = LoopCounter("c", "Doc", ("a", "b"), ours)
    with pytest.raises(ValueError, match="takes 2 label values"):
        counter.labels("only-one")
