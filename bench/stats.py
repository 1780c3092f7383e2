"""Percentiles (nearest rank) of latency samples."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(ordered: Sequence[float], pct: float) -> float:
    """The nearest-rank ``pct`` percentile of already sorted samples (0 if none)."""
    if not ordered:
        return 0.0
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def summarize_ms(samples_s: Sequence[float]) -> dict[str, float]:
    """p50 / p90 / p99 / p99.9 / max / mean of samples in seconds, as milliseconds."""
    ordered = sorted(samples_s)
    mean = sum(ordered) / len(ordered) if ordered else 0.0
    return {
        "p50_ms": percentile(ordered, 50) * 1e3,
        "p90_ms": percentile(ordered, 90) * 1e3,
        "p99_ms": percentile(ordered, 99) * 1e3,
        "p999_ms": percentile(ordered, 99.9) * 1e3,
        "max_ms": (ordered[-1] if ordered else 0.0) * 1e3,
        "mean_ms": mean * 1e3,
    }
