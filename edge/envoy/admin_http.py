"""The xds-server's admin HTTP server, bounded: a thread per connection, but few of them.

:class:`ThreadingHTTPServer` starts a thread for every connection before its handler
reads a byte (so before any token check) and waits on a silent client forever: idle
connections would pile up threads without end.  :class:`BoundedHTTPServer` gives each
connection's socket a timeout (a connection silent that long is closed) and serves at
most ``max_connections`` at once; one more is answered 503 and closed at once, from the
accepting thread, without a thread of its own.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["ADMIN_TIMEOUT_S", "MAX_ADMIN_CONNECTIONS", "BoundedHTTPServer"]

log = logging.getLogger("edge.envoy.xds")

ADMIN_TIMEOUT_S = 10.0
"""An admin connection silent this long (while the server waits to read) is closed."""
MAX_ADMIN_CONNECTIONS = 16
"""Admin connections served at once (an operator's scripts need one or two)."""

_BUSY_BODY = b'{"error": "too many admin connections at once"}\n'
_BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
         b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY))

_Address = tuple[str, int]


class BoundedHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server with a socket timeout and a cap on connections served."""

    daemon_threads = True

    def __init__(self, address: _Address, handler: type[BaseHTTPRequestHandler],
                 max_connections: int = MAX_ADMIN_CONNECTIONS,
                 timeout_s: float = ADMIN_TIMEOUT_S) -> None:
        super().__init__(address, handler)
        self.max_connections = max_connections
        self.timeout_s = timeout_s
        self._slots = threading.BoundedSemaphore(max_connections)

    def process_request(self, request: socket.socket | tuple[bytes, socket.socket],
                        client_address: _Address | str) -> None:
        assert isinstance(request, socket.socket)
        if not self._slots.acquire(blocking=False):
            log.warning("xds admin: refusing a connection from %.100s: %d are served"
                        " already", client_address, self.max_connections)
            self._refuse(request)
            return
        request.settimeout(self.timeout_s)
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: socket.socket | tuple[bytes, socket.socket],
                               client_address: _Address | str) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: socket.socket | tuple[bytes, socket.socket],
                     client_address: _Address | str) -> None:
        """One line for a connection that failed (say, timed out while its answer was
        written), not socketserver's traceback on stderr."""
        error = sys.exc_info()[1]
        log.warning("xds admin: connection from %.100s failed: %.200r", client_address, error)

    def _refuse(self, request: socket.socket) -> None:
        """Answer 503 without waiting (a fresh socket's buffer takes it) and close."""
        request.setblocking(False)
        with contextlib.suppress(OSError):
            request.send(_BUSY)
        self.shutdown_request(request)
