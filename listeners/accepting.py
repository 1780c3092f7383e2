"""Listening sockets whose connections are accepted a slice at a time.

The event loop's own server (``loop.create_server``, asyncio's and uvloop's alike) accepts
every connection waiting in the kernel's queue in one callback, and sets each one up in
the next turns of the loop: during a storm of a thousand logins at once that is a
thousand transports, protocols and first steps of their tasks with nothing else run in
between (``bench.logins``: the loop stalled 100-200 ms at each storm's start while a
logged-in producer waited). Here a listening socket that is ready gives at most
``ACCEPT_SLICE`` connections per turn of the loop; the rest wait in the kernel's queue
(``backlog`` long) for the next turns, between which other clients' work runs.

Running out of file descriptors (or kernel memory) pauses accepting on that socket for
``PAUSE_SECONDS`` with one log line, as asyncio's server does, rather than spinning.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable

log = logging.getLogger("listeners.server")

ACCEPT_SLICE = 16
"""Connections accepted per listening socket per turn of the loop."""
PAUSE_SECONDS = 1.0
"""How long accepting pauses when the process is out of file descriptors."""


def listening_sockets(host: str | None, port: int, backlog: int) -> list[socket.socket]:
    """Bound, listening, non-blocking sockets for ``host`` (None: every interface) and
    ``port``, one per address it resolves to (as ``loop.create_server`` binds them)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _name, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class SlicedAcceptor:
    """Accepts the connections of ``sockets`` into transports of ``factory``'s protocols,
    ``ACCEPT_SLICE`` per socket per turn of the loop."""

    def __init__(self, sockets: list[socket.socket],
                 factory: Callable[[], asyncio.BaseProtocol], name: str) -> None:
        self.sockets = sockets
        self.factory = factory
        self.name = name
        self._loop = asyncio.get_running_loop()
        self._connecting: set[asyncio.Task[None]] = set()
        self._paused: dict[int, asyncio.TimerHandle] = {}

    def start(self) -> None:
        """Start accepting."""
        for sock in self.sockets:
            self._loop.add_reader(sock.fileno(), self._ready, sock)

    def _ready(self, sock: socket.socket) -> None:
        for _ in range(ACCEPT_SLICE):
            try:
                conn, _address = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue  # the client gave up while it waited in the queue
            except OSError as exc:  # out of descriptors (or anything else): no spinning
                log.warning("accepting on %s paused for %.0f s: %s", self.name, PAUSE_SECONDS,
                            exc.strerror or type(exc).__name__)
                self._loop.remove_reader(sock.fileno())
                self._paused[sock.fileno()] = self._loop.call_later(
                    PAUSE_SECONDS, self._resume, sock)
                return
            conn.setblocking(False)
            task = self._loop.create_task(self._connect(conn))
            self._connecting.add(task)
            task.add_done_callback(self._connecting.discard)

    def _resume(self, sock: socket.socket) -> None:
        del self._paused[sock.fileno()]
        self._loop.add_reader(sock.fileno(), self._ready, sock)

    async def _connect(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self.factory, conn)
        except OSError as exc:
            log.info("connection on %s lost as it was accepted: %s", self.name,
                     exc.strerror or type(exc).__name__)
            conn.close()
        except asyncio.CancelledError:
            conn.close()
            raise

    def close(self) -> None:
        """Stop accepting and close the listening sockets (connections accepted stay)."""
        for timer in self._paused.values():
            timer.cancel()
        for sock in self.sockets:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(sock.fileno())
            sock.close()
        self._paused.clear()
        for task in list(self._connecting):
            task.cancel()
