"""Bounding what a client can repeat as fast as it likes (connections over a quota,
produces beyond a storage quota, throttled requests): :class:`Intervals` lets the first
event of each subject per interval through and counts the rest, :class:`Notices` turns
that into one log line per subject per interval, with the refusals in between counted
into the next line, so a flood of them is a few lines (and a few audit events)."""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable

_MAX_SUBJECTS = 10_000


class Intervals:
    """The first event per subject per ``interval_s`` is due; the others are counted."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._last: dict[Hashable, tuple[float, int]] = {}  # when due, events since

    def due(self, subject: Hashable, now: float | None = None) -> int | None:
        """None when ``subject`` was due within the interval (this one is counted); else
        how many of its events were not due since the last that was."""
        now = time.monotonic() if now is None else now
        last, since = self._last.get(subject, (-self.interval_s, 0))
        if now - last < self.interval_s:
            self._last[subject] = (last, since + 1)
            return None
        if len(self._last) >= _MAX_SUBJECTS:
            self._last = {k: v for k, v in self._last.items() if now - v[0] < self.interval_s}
        self._last[subject] = (now, 0)
        return since


class Notices:
    """At most one WARNING line per subject per ``interval_s``."""

    def __init__(self, logger: logging.Logger, interval_s: float) -> None:
        self.logger = logger
        self.intervals = Intervals(interval_s)

    def warn(self, subject: Hashable, message: str, now: float | None = None) -> None:
        """Log ``message`` unless ``subject`` was logged within the interval (then count it)."""
        since = self.intervals.due(subject, now)
        if since is None:
            return
        more = f" ({since} more like it since the last line)" if since else ""
        self.logger.warning("%s%s", message, more)
