"""The broker's own view of a request's time: its Prometheus latency histogram scraped
before and after a phase, and the quantile the difference gives.

A Prometheus histogram holds cumulative counts per bucket bound, so a quantile is known
only as the bound of the bucket it falls in: "p99 <= 1 ms" is exact when 1 ms is a bound
(it is one of ``kop_server_request_latency_seconds``'s).
"""

from __future__ import annotations

import math
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

REQUEST_LATENCY = "kop_server_request_latency_seconds"
Buckets = dict[float, float]
"""Cumulative count of observations at most each bound (seconds; ``inf`` for all)."""


def scrape(port: int, metric: str, api: str, timeout: float = 10.0) -> Buckets:
    """``metric``'s buckets for ``api`` on the metrics endpoint at 127.0.0.1:``port``;
    empty when that API was not served yet (its series appear once it is)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as reply:
        text = reply.read().decode("utf-8")
    buckets: Buckets = {}
    for family in text_string_to_metric_families(text):
        if family.name != metric:
            continue
        for sample in family.samples:
            if sample.name == f"{metric}_bucket" and sample.labels.get("api") == api:
                buckets[float(sample.labels["le"])] = float(sample.value)
    return buckets


def between(before: Buckets, after: Buckets) -> Buckets:
    """The observations made between two scrapes, per bound."""
    return {bound: count - before.get(bound, 0.0) for bound, count in after.items()}


def count(buckets: Buckets) -> float:
    """How many observations the buckets hold."""
    return buckets.get(math.inf, 0.0)


def share_at_most(buckets: Buckets, bound: float) -> float | None:
    """The share of observations at most ``bound`` (one of the buckets' bounds); None
    without observations."""
    total = count(buckets)
    if total <= 0 or bound not in buckets:
        return None
    return buckets[bound] / total


def quantile_bound(buckets: Buckets, quantile: float) -> float | None:
    """The smallest bucket bound at or below which ``quantile`` of the observations fall
    (``inf`` when only the last bucket holds them); None without observations."""
    total = count(buckets)
    if total <= 0:
        return None
    for bound in sorted(buckets):
        if buckets[bound] >= quantile * total:
            return bound
    return math.inf
