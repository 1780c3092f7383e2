"""Log lines about refusals that a client can repeat as fast as it likes (connections over
a quota, produces beyond a storage quota): one line per subject per interval, and the
refusals in between counted into the next line, so a flood of them is a few lines."""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable

_MAX_SUBJECTS = 10_000


class Notices:
    """At most one WARNING line per subject per ``interval_s``."""

    def __init__(self, logger: logging.Logger, interval_s: float) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self._last: dict[Hashable, tuple[float, int]] = {}  # when logged, refusals since

    def warn(self, subject: Hashable, message: str, now: float | None = None) -> None:
        """Log ``message`` unless ``subject`` was logged within the interval (then count it)."""
        now = time.monotonic() if now is None else now
        logged, since = self._last.get(subject, (-self.interval_s, 0))
        if now - logged < self.interval_s:
            self._last[subject] = (logged, since + 1)
            return
        if len(self._last) >= _MAX_SUBJECTS:
            self._last = {k: v for k, v in self._last.items() if now - v[0] < self.interval_s}
        self._last[subject] = (now, 0)
        more = f" ({since} more like it since the last line)" if since else ""
        self.logger.warning("%s%s", message, more)
