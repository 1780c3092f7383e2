"""The PostgreSQL engine's change feed (``feed``): one connection that LISTENs.

The schema's triggers (``pg_schema``, version 3) notify a channel when a change other
brokers act on commits. :class:`PgListener` holds one dedicated connection of its own
(outside the pool: a pooled connection is handed to other statements), LISTENs on every
channel, and waits for notifications in its own thread (asleep until the server sends
something: no wake-up while nothing changes), which calls the subscribers' wake-ups (they
hand them to their event loop). It starts with the first subscription.

A notification sent while the connection is down is lost: the feed is then not
:attr:`~PgListener.live` (subscribers poll at their fast pace), is connected again after a
pause, and wakes every subscriber once it listens again, so that each looks at what it
may have missed. It says so in one log line. :meth:`PgListener.close` shuts the
connection's socket down, which ends the wait at once, even with the database away.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Sequence

import psycopg

from .feed import CHANNELS, Wake
from .pg_database import Conn, connect_listener

log = logging.getLogger(__name__)

RETRY_S = 1.0
"""The pause before connecting again after the connection failed."""
_JOIN_S = 5.0
"""Longest :meth:`PgListener.close` waits for the thread (a connect under way)."""


class PgListener:
    """The change feed of one storage: a thread and its listening connection."""

    def __init__(self, conninfo: str, where: str,
                 channels: Sequence[str] = CHANNELS) -> None:
        self._conninfo = conninfo
        self._where = where
        self._channels = tuple(channels)
        self._wakes: dict[str, list[Wake]] = defaultdict(list)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: Conn | None = None
        self._live = False
        self._lost_at: float | None = None
        """When the connection was lost (None while it listens, or before it first did)."""
        self._cause = ""

    @property
    def live(self) -> bool:
        return self._live

    def subscribe(self, channel: str, wake: Wake) -> None:
        if channel not in self._channels:
            raise ValueError(f"no such channel: {channel}")
        with self._lock:
            self._wakes[channel].append(wake)
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="edge-listener",
                                                daemon=True)
                self._thread.start()

    def close(self) -> None:
        """Stop listening; return once the thread ended (or after ``_JOIN_S``)."""
        with self._lock:
            self._stop.set()
            thread, conn = self._thread, self._conn
        if conn is not None:
            _shut_down(conn)
        if thread is not None:
            thread.join(_JOIN_S)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._listen()
            except Exception as exc:  # psycopg.Error: the connection failed; else a bug
                if self._stop.is_set():
                    break
                if not isinstance(exc, psycopg.Error):
                    log.exception("notifications from %s: listener failed", self._where)
                if self._lost_at is None:
                    self._lost_at = time.monotonic()
                    self._cause = (str(exc).strip().splitlines()
                                   or [type(exc).__name__])[0][:200]
                    self._live = False
                    self._wake_all()  # poll at the fast pace meanwhile
            self._stop.wait(RETRY_S)
        self._live = False

    def _listen(self) -> None:
        """Connect, LISTEN, then hand notifications on until the connection fails."""
        conn = connect_listener(self._conninfo)
        try:
            with self._lock:
                if self._stop.is_set():
                    return
                self._conn = conn
            for channel in self._channels:
                conn.execute(f"LISTEN {channel}".encode())
            self._live = True
            if self._lost_at is not None:
                log.info("notifications from %s: listening again after %.1f s (lost: %s)",
                         self._where, time.monotonic() - self._lost_at, self._cause)
                self._lost_at = None
            self._wake_all()  # what was missed before LISTEN: everyone looks once
            while True:
                for notice in conn.notifies(timeout=0):  # what arrived, without waiting
                    self._wake(notice.channel)
                _until_readable(conn)
        finally:
            with self._lock:
                self._conn = None
            conn.close()

    def _wake(self, channel: str) -> None:
        with self._lock:
            wakes = list(self._wakes.get(channel, ()))
        for wake in wakes:
            wake()

    def _wake_all(self) -> None:
        for channel in self._channels:
            self._wake(channel)


def _until_readable(conn: Conn) -> None:
    """Block until the server sends something on ``conn`` (or the connection fails or is
    shut down: the next read raises). Not ``conn.notifies()``'s own wait, which wakes ten
    times a second to look for a Ctrl-C that only the main thread can get: this thread
    sleeps until there is something to read."""
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    poller.poll()


def _shut_down(conn: Conn) -> None:
    """End whatever waits on ``conn``'s socket now (from another thread)."""
    try:
        sock = socket.socket(fileno=os.dup(conn.fileno()))
    except (OSError, psycopg.Error):
        return  # closed meanwhile
    with sock, contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
