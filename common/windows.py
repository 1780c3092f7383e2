"""Reports bounded per subject: at most so many per window, the ones beyond counted and
told once when the window ends. The one home of that rule, for every layer: authorization
denials and failed logins (``edge.denials``), admin refusals (``broker_core.admin_refusals``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

_MAX_WINDOWS = 10_000
"""Windows kept open at once (beyond, the oldest is closed early: its count reported)."""

_S = TypeVar("_S", bound=Hashable)


@dataclass(slots=True)
class Window:
    """One subject's reports since its window began."""

    ends: float
    written: int = 0
    left_out: int = 0
    listener: str = ""
    client: str = ""
    """Where the last left-out one came from (for the event that counts them)."""
    tenant: str | None = None
    """The tenant every left-out one named (None: none named, or they named several)."""


class Windows(Generic[_S]):
    """At most ``per_window`` reports per subject per window of ``window_s``; the ones
    beyond are counted, and ``left_out`` is told the subject and its window when the window
    ends with some left out (a timer, else the subject's next report, else
    :meth:`close_all`)."""

    def __init__(self, per_window: int, window_s: float,
                 left_out: Callable[[_S, Window], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.per_window = per_window
        self.window_s = window_s
        self.left_out = left_out
        self.clock = clock
        self._windows: dict[_S, Window] = {}

    def take(self, subject: _S, listener: str, client: str, count: int = 1,
             tenant: str | None = None) -> bool:
        """Whether one more report of ``subject`` (from ``client`` on ``listener``, naming
        ``tenant``) is made; False: it is counted instead (as ``count`` reports: one that
        sums others)."""
        now = self.clock()
        window = self._windows.get(subject)
        if window is not None and now >= window.ends:  # no timer closed it (no loop)
            self._close(subject, window)
            window = None
        if window is None:
            window = self._open(subject, now)
        if window.written < self.per_window:
            window.written += 1
            return True
        first = not window.left_out
        window.left_out += count
        window.listener, window.client = listener, client
        window.tenant = tenant if first or window.tenant == tenant else None
        if first:
            # without an event loop (a tool) the next report closes it
            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().call_later(window.ends - now, self._close,
                                                      subject, window)
        return False

    def _open(self, subject: _S, now: float) -> Window:
        if len(self._windows) >= _MAX_WINDOWS:
            for other, window in list(self._windows.items()):
                if now >= window.ends:
                    self._close(other, window)
            if len(self._windows) >= _MAX_WINDOWS:
                oldest = next(iter(self._windows))
                self._close(oldest, self._windows[oldest])
        window = self._windows[subject] = Window(now + self.window_s)
        return window

    def _close(self, subject: _S, window: Window) -> None:
        """End ``window`` (if it is still the subject's): tell what it left out."""
        if self._windows.get(subject) is not window:
            return
        del self._windows[subject]
        if window.left_out:
            self.left_out(subject, window)

    def close_all(self) -> None:
        """Tell what every open window left out (the broker stops)."""
        for subject, window in list(self._windows.items()):
            self._close(subject, window)

    def share(self) -> str:
        """The bound, as the events that count left-out reports word it."""
        return f"{self.per_window} reported per {self.window_s:g} s"
