"""A rate measured over a sliding window of samples, and the throttle time of a quota on
it, computed as Kafka computes them (its ``Rate`` over ``quota.window.num`` samples of
``quota.window.size.seconds``, and ``QuotaUtils.throttleTime``).

The rate is the sum of the samples over the time they span, counted as at least
``samples - 1`` whole windows: a new client is measured over the full window from its
first request, so a short burst at start is not throttled unless it exceeds what the
whole window allows. A caller over its quota ``Q`` at rate ``R`` is delayed by
``(R - Q) / Q * window``: the time after which the rate, without new traffic, is back at
the quota.

A :class:`TokenBucket` measures what KIP-599's ``controller_mutation_rate`` limits
(partitions created or deleted), as Kafka's ``TokenBucket`` stat does: credits refill at
the quota per second up to a burst of quota x ``samples`` x ``size_s``; the quota is
exhausted while the credits are below zero, and the wait is the time they take to climb
back to zero. A burst is paid off as soon as the credits allow, where a sliding rate would
hold it until its sample left the window.
"""

from __future__ import annotations

import math
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


class TokenBucket:
    """Credits of one quota'd quantity (partition mutations), refilled continuously.

    A new bucket is full. Each call passes the quota in force then (a changed quota
    applies at once: a lower one also lowers the burst the credits may hold)."""

    __slots__ = ("_credits", "_quota", "last_used", "window")

    def __init__(self, window: Window) -> None:
        self.window = window
        self._credits: float | None = None  # None: full
        self._quota = 0.0
        self.last_used = 0.0

    def _refill(self, quota: float, now: float) -> float:
        burst = quota * self.window.span_s
        if self._credits is None:
            credits = burst
        else:
            credits = min(burst, self._credits + quota * max(now - self.last_used, 0.0))
        self._credits, self._quota, self.last_used = credits, quota, now
        return credits

    def exhausted(self, quota: float, now: float) -> bool:
        """Whether the credits are below zero (the quota is exceeded)."""
        return self._refill(quota, now) < 0

    def take(self, amount: float, quota: float, now: float) -> None:
        """Spend ``amount`` credits (the balance may go below zero)."""
        self._credits = self._refill(quota, now) - amount

    def throttle_ms(self, quota: float, now: float) -> int:
        """How long until the credits are back at zero (0 when they are not below),
        rounded up, at most :data:`MAX_THROTTLE_MS`."""
        credits = self._refill(quota, now)
        if credits >= 0:
            return 0
        return min(math.ceil(-credits / quota * 1000), MAX_THROTTLE_MS)

    def full(self, now: float) -> bool:
        """Whether the bucket would be full again by ``now`` (it may be forgotten), read
        without changing it."""
        if self._credits is None:
            return True
        burst = self._quota * self.window.span_s
        return self._credits + self._quota * (now - self.last_used) >= burst
