"""Repeated warnings, rate-limited per cause so that one misbehaving client cannot flood
the broker log.

A cause is a logger and a message template (the format string before its arguments are
filled in: "closing connection from %s on %s: %s" is one cause whichever client it
names). Each cause logs at most ``burst`` lines per ``period`` seconds at WARNING and
above; the first line of the next period says how many were suppressed. The filter sits
on the broker's log handler, so it covers every warning a client can trigger, in every
layer, without the call sites knowing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

_Cause = tuple[str, int, str]


@dataclass(slots=True)
class _Window:
    """One cause's current period: when it began, lines let through, lines suppressed."""

    start: float
    passed: int = 1
    suppressed: int = 0


class RepeatedWarningFilter(logging.Filter):
    """Lets at most ``burst`` records of one cause through per ``period`` seconds."""

    def __init__(self, burst: int = 5, period: float = 10.0, level: int = logging.WARNING,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.burst = burst
        self.period = period
        self.level = level
        self.clock = clock
        self._windows: dict[_Cause, _Window] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        """False for a record beyond its cause's burst; the first record of a new period
        carries the count of those suppressed in the last one."""
        if record.levelno < self.level:
            return True
        cause = (record.name, record.levelno, str(record.msg))
        now = self.clock()
        with self._lock:
            window = self._windows.get(cause)
            if window is None or now - window.start >= self.period:
                self._windows[cause] = _Window(now)
                if window is not None and window.suppressed:
                    record.msg = (f"{record.msg} ({window.suppressed} more like this "
                                  f"suppressed since {now - window.start:.0f} s ago)")
                return True
            if window.passed < self.burst:
                window.passed += 1
                return True
            window.suppressed += 1
            return False


def limit_repeated_warnings(logger: logging.Logger | None = None) -> RepeatedWarningFilter:
    """Install one :class:`RepeatedWarningFilter` on every handler of ``logger`` (root)."""
    limiter = RepeatedWarningFilter()
    for handler in (logger or logging.getLogger()).handlers:
        handler.addFilter(limiter)
    return limiter
