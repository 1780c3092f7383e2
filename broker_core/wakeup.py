"""A poller's pause, cut short when the storage's change feed says something changed.

Work that follows other brokers' changes (the storage refresh, the marker relay, the
cluster's reconcile) waits on a :class:`Wakeup` between rounds: until the feed notifies
its channel, or until its pace runs out: ``slow_s`` while the feed is live (a safety net
for a lost notification), ``fast_s`` while it is not (the feed's connection is down, or
the engine has no feed: the old polling pace). The feed calls from its own thread; the
wake-up is handed to the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib

from broker_core.storage.feed import ChangeFeed


class Wakeup:
    """Woken by ``channel`` of ``feed`` or by :meth:`set`; create it on the event loop."""

    def __init__(self, feed: ChangeFeed, channel: str) -> None:
        self._feed = feed
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        feed.subscribe(channel, self._from_thread)

    def _from_thread(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            self._loop.call_soon_threadsafe(self._event.set)

    def set(self) -> None:
        """Wake the waiter now (on the event loop)."""
        self._event.set()

    async def wait(self, fast_s: float | None, slow_s: float | None) -> bool:
        """Until woken, or the pace runs out (None: no pace while the feed is live, or
        while it is not); whether it was woken. Clears the wake-up."""
        timeout = slow_s if self._feed.live else fast_s
        woken = True
        if timeout is None:
            await self._event.wait()
        else:
            try:
                await asyncio.wait_for(self._event.wait(), timeout)
            except TimeoutError:
                woken = False
        self._event.clear()
        return woken
