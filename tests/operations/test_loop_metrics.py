"""The lock-free metrics of the request path (``broker_core.loop_metrics``) are exposed
exactly as ``prometheus_client``'s own counters and histograms fed the same values
(without the ``_created`` series): dashboards and the bench's histogram reader see no
difference."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from broker_core.loop_metrics import CounterFamily, HistogramFamily

BUCKETS = (0.00005, 0.0005, 0.001, 0.0025, 1, 5)
VALUES = (0.0, 0.00005, 0.00004, 0.0005, 0.0007, 0.001, 0.003, 1.0, 4.99, 5.0, 7.5, 1e9)


def _exposed(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines()
            if "_created" not in line]


def test_the_exposition_is_prometheus_clients() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    their_histogram = Histogram("t_latency_seconds", "Latency.", ["api"], buckets=BUCKETS,
                                registry=theirs)
    their_counter = Counter("t_requests", "Requests.", ["api"], registry=theirs)
    their_single = Counter("t_errors", "Errors.", registry=theirs)
    our_histogram = HistogramFamily("t_latency_seconds", "Latency.", ["api"], BUCKETS,
                                    registry=ours)
    our_counter = CounterFamily("t_requests", "Requests.", ["api"], registry=ours)
    our_single = CounterFamily("t_errors", "Errors.", registry=ours)
    for api in ("Produce", "Fetch"):
        for value in VALUES:
            their_histogram.labels(api).observe(value)
            our_histogram.labels(api).observe(value)
            their_counter.labels(api).inc(value)
            our_counter.labels(api).inc(value)
    their_single.inc(3)
    our_single.inc(3)
    assert _exposed(ours) == _exposed(theirs)


def test_label_values_must_match_the_label_names() -> None:
    registry = CollectorRegistry()
    family = CounterFamily("t_bytes", "Bytes.", ["tenant", "direction"], registry=registry)
    with pytest.raises(ValueError):
        family.labels("acme")
    with pytest.raises(ValueError):
        family.inc()
    assert family.labels("acme", "in") is family.labels("acme", "in")
