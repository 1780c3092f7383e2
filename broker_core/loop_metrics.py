"""Counters and histograms counted on the event loop's thread only, without a lock.

``prometheus_client`` takes a mutex on every ``inc`` and walks a histogram's bounds in
Python on every ``observe``: about a tenth of the broker's CPU for a small produce
request, which counts itself half a dozen times. The metrics every request touches are
these instead: a child is a plain attribute or list slot added to (the loop's thread is
the only writer; a scrape, on the metrics server's thread, reads numbers that are at
worst one request behind), a histogram's bucket is found with ``bisect``.

A family is exposed exactly as ``prometheus_client`` exposes its own: a counter as
``<name>_total``, a histogram as ``_bucket`` (cumulative, ``le`` formatted alike, ``+Inf``
last), ``_count`` and ``_sum``; without the ``_created`` series. Every family registers
with the default registry when it is made, as ``prometheus_client``'s do.
"""

from __future__ import annotations

from abc import abstractmethod
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar, cast

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

_S = TypeVar("_S", "LoopCounter", "LoopHistogram")
_bound_text = cast(Callable[[float], str], floatToGoString)
"""A bucket bound as ``prometheus_client`` writes it (``le``)."""


class LoopCounter:
    """One series of a counter family."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        """Add ``amount`` (not negative)."""
        self.value += amount


class LoopHistogram:
    """One series of a histogram family: a count per bucket (not cumulative) and the sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf)
        self.total = 0.0

    def observe(self, amount: float) -> None:
        """Count one observation of ``amount``."""
        self.counts[bisect_left(self.bounds, amount)] += 1
        self.total += amount


class _Family(Collector, Generic[_S]):
    """A named family of series by label values, registered with ``registry`` (the
    default one unless a test gives its own); a subclass makes a series and writes the
    family's samples."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._series: dict[tuple[str, ...], _S] = {}
        registry.register(self)

    def labels(self, *values: str) -> _S:
        """The series of ``values`` (made on first use; keep it where a request counts)."""
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, not {values}")
        found = self._series.get(values)
        if found is None:
            found = self._series[values] = self._new()
        return found

    def remove(self, *values: str) -> None:
        """Drop the series of ``values`` (a deleted topic's), if there is one; a series
        kept by a caller counts on unseen, and ``labels`` makes a new one from 0."""
        self._series.pop(values, None)

    def describe(self) -> Iterator[Metric]:
        """The family without its samples (what the registry checks names against)."""
        yield self._family({})

    def collect(self) -> Iterator[Metric]:
        """Every series' samples."""
        yield self._family(dict(self._series))

    @abstractmethod
    def _new(self) -> _S:
        """A new series."""

    @abstractmethod
    def _family(self, series: dict[tuple[str, ...], _S]) -> Metric:
        """The family with the samples of ``series``."""


class CounterFamily(_Family[LoopCounter]):
    """A counter family; without label names, the family is its one series."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (),
                 registry: CollectorRegistry = REGISTRY) -> None:
        super().__init__(name, documentation, labelnames, registry)
        self._single = None if self.labelnames else self.labels()

    def inc(self, amount: float = 1.0) -> None:
        """Add to the family's one series (a family without label names)."""
        if self._single is None:
            raise ValueError(f"{self.name} has labels {self.labelnames}")
        self._single.inc(amount)

    def _new(self) -> LoopCounter:
        return LoopCounter()

    def _family(self, series: dict[tuple[str, ...], LoopCounter]) -> Metric:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in series.items():
            family.add_metric(list(values), child.value)
        return family


class HistogramFamily(_Family[LoopHistogram]):
    """A histogram family with fixed bucket bounds: cumulative buckets, count and sum."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 buckets: Sequence[float], registry: CollectorRegistry = REGISTRY) -> None:
        self.bounds = tuple(sorted(float(bound) for bound in buckets))
        super().__init__(name, documentation, labelnames, registry)

    def _new(self) -> LoopHistogram:
        return LoopHistogram(self.bounds)

    def _family(self, series: dict[tuple[str, ...], LoopHistogram]) -> Metric:
        family = HistogramMetricFamily(self.name, self.documentation,
                                       labels=self.labelnames)
        edges = [_bound_text(bound) for bound in self.bounds] + ["+Inf"]
        for values, child in series.items():
            counts, total = list(child.counts), child.total
            cumulative, buckets = 0, []
            for edge, count in zip(edges, counts, strict=True):
                cumulative += count
                buckets.append((edge, float(cumulative)))
            family.add_metric(list(values), buckets, total)
        return family
