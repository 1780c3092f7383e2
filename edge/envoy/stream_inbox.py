"""What one ADS stream's serving thread has to do next, bounded.

A reader thread takes an Envoy's requests off the gRPC stream and puts them here; the
serving thread takes them out, answers, and sends what a new snapshot changed.  While the
serving thread cannot send (the peer reads no answers) it takes nothing out: at most
:data:`MAX_WAITING_REQUESTS` requests wait here, the reader then waits too, gRPC stops
reading the stream, and HTTP/2 flow control stops the peer.  So a stream holds a bounded
amount of memory whatever its peer sends (each request is bounded by the server's receive
limit).  A snapshot change is one flag (however many came meanwhile, the serving thread
sends the newest version once), and the end of the stream another: neither waits, so the
thread publishing a snapshot never waits on a stalled stream.
"""

from __future__ import annotations

import threading
from collections import deque
from enum import Enum

from envoy.service.discovery.v3 import discovery_pb2

__all__ = ["MAX_WAITING_REQUESTS", "Signal", "StreamInbox"]

MAX_WAITING_REQUESTS = 4
"""Requests of one stream read and not yet handled (an Envoy has about one per resource
type outstanding: a subscription, then an ACK or NACK of each answer)."""


class Signal(Enum):
    """What :meth:`StreamInbox.next` gives besides a request."""

    REFRESH = "refresh"
    """The snapshot changed since the last REFRESH."""
    CLOSED = "closed"
    """The stream ended (the peer's requests ended, or gRPC ended the call)."""
    IDLE = "idle"
    """Nothing came within the time given."""


class StreamInbox:
    """Requests waiting (at most ``bound``), a pending refresh, the end (thread-safe)."""

    def __init__(self, bound: int = MAX_WAITING_REQUESTS) -> None:
        self.bound = bound
        self._changed = threading.Condition()
        self._requests: deque[discovery_pb2.DiscoveryRequest] = deque()
        self._refresh = False
        self._closed = False

    def put(self, request: discovery_pb2.DiscoveryRequest) -> bool:
        """Queue ``request``, waiting while ``bound`` requests wait; False (the request
        dropped) once the stream is closed."""
        with self._changed:
            self._changed.wait_for(lambda: self._closed or len(self._requests) < self.bound)
            if self._closed:
                return False
            self._requests.append(request)
            self._changed.notify_all()
            return True

    def refresh(self) -> None:
        """Note a snapshot change (never waits)."""
        with self._changed:
            self._refresh = True
            self._changed.notify_all()

    def close(self) -> None:
        """End the stream: :meth:`next` gives CLOSED, :meth:`put` stops waiting."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def next(self, timeout: float | None = None
             ) -> discovery_pb2.DiscoveryRequest | Signal:
        """The next thing to do: CLOSED first, then the oldest request, then REFRESH;
        IDLE when nothing came within ``timeout`` seconds (None: wait for it)."""
        with self._changed:
            if not self._changed.wait_for(
                    lambda: self._closed or self._requests or self._refresh, timeout):
                return Signal.IDLE
            if self._closed:
                return Signal.CLOSED
            if self._requests:
                request = self._requests.popleft()
                self._changed.notify_all()
                return request
            self._refresh = False
            return Signal.REFRESH
