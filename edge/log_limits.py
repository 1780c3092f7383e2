"""Repeated warnings, rate-limited per cause so that one misbehaving client cannot flood
the broker log.

A cause is a logger, a level and the message with its numbers blanked out: "closing
connection from 10.0.0.7:51234 on EXTERNAL: Metadata request before SASL authentication"
is one cause whichever address and port the client comes from, and a different reason is
another cause. Each cause logs at most ``burst`` lines per ``period`` seconds at WARNING
and above; the first line of the next period says how many were suppressed. Messages
carry client-supplied text (names), so a client could invent causes: beyond
``max_causes`` the message template (format string) is the cause, of which there are
few; the windows that ended are forgotten then, and what they suppressed is said in one
line first. The filter sits on the broker's log handler, so it covers every warning a client
can trigger, in every layer, without the call sites knowing.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)
_Cause = tuple[str, int, str]
_NUMBERS = re.compile(r"\d+")
_CAUSE_CHARS = 300


@dataclass(slots=True)
class _Window:
    """One cause's current period: when it began, lines let through, lines suppressed."""

    start: float
    passed: int = 1
    suppressed: int = 0


class RepeatedWarningFilter(logging.Filter):
    """Lets at most ``burst`` records of one cause through per ``period`` seconds."""

    def __init__(self, burst: int = 5, period: float = 10.0, level: int = logging.WARNING,
                 clock: Callable[[], float] = time.monotonic, max_causes: int = 1000) -> None:
        super().__init__()
        self.burst = burst
        self.period = period
        self.level = level
        self.clock = clock
        self.max_causes = max_causes
        self._windows: dict[_Cause, _Window] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        """False for a record beyond its cause's burst; the first record of a new period
        carries the count of those suppressed in the last one."""
        if record.levelno < self.level:
            return True
        with self._lock:
            passes, forgotten = self._admit(record, self.clock())
        if forgotten:  # said before the record, outside the lock: it comes through here
            suppressed, causes = forgotten
            log.warning("%d more warnings of %d causes whose windows ended were suppressed "
                        "(those causes forgotten: more than %d at once)", suppressed, causes,
                        self.max_causes)
        return passes

    def _admit(self, record: logging.LogRecord,
               now: float) -> tuple[bool, tuple[int, int] | None]:
        """Whether the record passes; and what forgotten windows had suppressed."""
        cause, forgotten = self._cause(record, now)
        window = self._windows.get(cause)
        if window is None or now - window.start >= self.period:
            self._windows[cause] = _Window(now)
            if window is not None and window.suppressed:
                record.msg = (f"{record.msg} ({window.suppressed} more like this "
                              f"suppressed since {now - window.start:.0f} s ago)")
            return True, forgotten
        if window.passed < self.burst:
            window.passed += 1
            return True, forgotten
        window.suppressed += 1
        return False, forgotten

    def _cause(self, record: logging.LogRecord,
               now: float) -> tuple[_Cause, tuple[int, int] | None]:
        """The record's message with numbers blanked; its template once causes abound.
        Second: what the ended windows forgotten to make room had suppressed (lines,
        causes), None when nothing."""
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # arguments that do not fit: logging reports it
            message = str(record.msg)
        cause = (record.name, record.levelno, _NUMBERS.sub("#", message[:_CAUSE_CHARS]))
        if cause in self._windows or len(self._windows) < self.max_causes:
            return cause, None
        ended = [k for k, w in self._windows.items() if now - w.start >= self.period]
        lost = [self._windows.pop(key).suppressed for key in ended]
        lost = [count for count in lost if count]
        forgotten = (sum(lost), len(lost)) if lost else None
        if len(self._windows) < self.max_causes:
            return cause, forgotten
        return (record.name, record.levelno, str(record.msg)), forgotten


def limit_repeated_warnings(logger: logging.Logger | None = None) -> RepeatedWarningFilter:
    """Install one :class:`RepeatedWarningFilter` on every handler of ``logger`` (root)."""
    limiter = RepeatedWarningFilter()
    for handler in (logger or logging.getLogger()).handlers:
        handler.addFilter(limiter)
    return limiter
