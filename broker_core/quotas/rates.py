"""A rate measured over a sliding window of samples, and the throttle time of a quota on
it, computed as Kafka computes them (its ``Rate`` over ``quota.window.num`` samples of
``quota.window.size.seconds``, and ``QuotaUtils.throttleTime``).

The rate is the sum of the samples over the time they span, counted as at least
``samples - 1`` whole windows: a new client is measured over the full window from its
first request, so a short burst at start is not throttled unless it exceeds what the
whole window allows. A caller over its quota ``Q`` at rate ``R`` is delayed by
``(R - Q) / Q * window``: the time after which the rate, without new traffic, is back at
the quota.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

MAX_THROTTLE_MS = 2**31 - 1
"""The longest throttle: what a response's INT32 ``throttle_time_ms`` holds."""


@dataclass(frozen=True, slots=True)
class Window:
    """How rates are measured: ``samples`` windows of ``size_s`` seconds."""

    samples: int = 11
    size_s: float = 1.0

    @property
    def span_s(self) -> float:
        """The whole window: the longest throttle time."""
        return self.samples * self.size_s


class SlidingRate:
    """One measured quantity (bytes, seconds of handling time) per second."""

    __slots__ = ("_samples", "last_used", "window")

    def __init__(self, window: Window) -> None:
        self.window = window
        self._samples: deque[list[float]] = deque(maxlen=window.samples)  # [start, total]
        self.last_used = 0.0

    def record(self, amount: float, now: float) -> None:
        """Add ``amount`` at time ``now`` (seconds, monotonic); negative takes it back."""
        self.last_used = now
        if not self._samples or now - self._samples[-1][0] >= self.window.size_s:
            self._samples.append([now, 0.0])
        self._samples[-1][1] += amount

    def rate(self, now: float) -> float:
        """The measured amount per second."""
        span = self.window.span_s
        while self._samples and now - self._samples[0][0] >= span:
            self._samples.popleft()
        if not self._samples:
            return 0.0
        return sum(total for _, total in self._samples) / self._elapsed(now)

    def peek(self, now: float) -> float:
        """The measured amount per second, read without changing anything (from another
        thread: a metrics scrape)."""
        samples = list(self._samples)
        span = self.window.span_s
        total = sum(amount for start, amount in samples if now - start < span)
        first = next((start for start, _ in samples if now - start < span), None)
        return 0.0 if first is None else total / self._elapsed_since(first, now)

    def throttle_ms(self, quota: float, now: float) -> int:
        """How long a caller over ``quota`` must wait (0 when within it), at most the
        whole window and at most :data:`MAX_THROTTLE_MS`."""
        rate = self.rate(now)
        if rate <= quota:
            return 0
        elapsed = self._elapsed(now)
        delay = (rate - quota) / quota * elapsed
        # the answers' throttle_time_ms is an INT32: a window of 3600 samples of 3600 s
        # spans more milliseconds than it holds
        return min(int(min(delay, self.window.span_s) * 1000), MAX_THROTTLE_MS)

    def _elapsed(self, now: float) -> float:
        """The time the samples span, at least ``samples - 1`` whole windows."""
        return self._elapsed_since(self._samples[0][0] if self._samples else now, now)

    def _elapsed_since(self, first: float, now: float) -> float:
        """The time from ``first`` to ``now``, at least ``samples - 1`` whole windows."""
        elapsed = now - first
        full = int(elapsed / self.window.size_s)
        if full < self.window.samples - 1:
            elapsed += (self.window.samples - 1 - full) * self.window.size_s
        return elapsed
