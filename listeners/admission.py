"""Admission of login work: at most ``limit`` requests of connections that have not
logged in are being served at once, across the listeners sharing one :class:`LoginGate`.

A storm of a thousand logins otherwise puts a thousand ApiVersions, SaslHandshake and
SaslAuthenticate steps in the event loop's queue at once, and a logged-in client's request
waits behind all of them (``bench.logins``: a producer's p99 went from 8 ms to 270 ms).
With the gate, a connection that has not logged in takes a permit once a frame of it has
been read, and gives it back when that request's dispatch stage has returned; the others
wait, their frames read and their transports paused by their small read buffers. No
permit is held while waiting for a client (for its next frame, or for it to read a
response), so a client that connects and sends nothing, or sends slowly, holds none: the
unauthenticated timeouts stay what they were.

The waiters form three queues, each FIFO, served in this order: the next request of a
login under way (a connection's second to ``EARLY_FRAMES``-th), then a new connection's
first, then any later one. So a login under way (ApiVersions, SaslHandshake,
SaslAuthenticate) finishes before new ones start, and logins complete one after another
rather than all at the storm's end; a connection that keeps sending requests without
logging in queues behind new ones and cannot hold the gate for itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

EARLY_FRAMES = 4
"""Requests of one connection served as a login under way (a login takes three, four with
an OAUTHBEARER error exchange)."""


class LoginGate:
    """Permits for serving requests of connections not logged in."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.free = limit
        # under way, new, later: served in this order
        self._queues: tuple[deque[asyncio.Future[None]], ...] = (deque(), deque(), deque())

    @property
    def waiting(self) -> int:
        """Requests waiting for a permit."""
        return sum(len(queue) for queue in self._queues)

    async def enter(self, served: int) -> None:
        """Take a permit for a request of a connection of which ``served`` requests went
        through the gate before, waiting for one if none is free."""
        if self.free > 0 and not self.waiting:
            self.free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._queues[1 if served == 0 else 0 if served < EARLY_FRAMES else 2]
        queue.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.leave()  # handed a permit as it was cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):  # leave() may have dropped it
                    queue.remove(waiter)
            raise

    def leave(self) -> None:
        """Give a permit back: to the next waiter, if any."""
        for queue in self._queues:
            while queue:
                waiter = queue.popleft()
                if not waiter.done():
                    waiter.set_result(None)
                    return
        self.free += 1
