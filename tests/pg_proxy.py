"""A TCP proxy between a broker and the test session's PostgreSQL that can lose the
database's answers, as a network that drops a connection after a statement was sent:
:meth:`PgProxy.hold` keeps every answer from then on, :meth:`PgProxy.cut` closes the
connections whose answers it holds (what they sent ran, their answers are lost: a commit
whose outcome the broker cannot know), :meth:`PgProxy.release` lets answers through
again. Connections that hold nothing are left alone. A connection opened while answers
are held completes its start-up (up to the server's first ReadyForQuery) and is held
from then on: the broker's pool can still grow, so a statement is not refused for want
of a connection when the background's own statements wait on held answers."""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

_CHUNK = 1 << 16
_READY_FOR_QUERY = b"Z\x00\x00\x00\x05"
"""The server's ReadyForQuery message (its status byte follows)."""


class _Link:
    """One proxied connection: the broker's socket, the server's, the answers held."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.held: list[bytes] = []
        self.closed = False
        self.ready = False
        """Whether the server has said ReadyForQuery once (its start-up is over)."""

    def close(self) -> None:
        self.closed = True
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):  # closed by its peer already
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class PgProxy:
    """Listens on a 127.0.0.1 port of its own and forwards to the server of ``url``."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        assert parts.hostname is not None and parts.port is not None, url
        self._target = (parts.hostname, parts.port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        port = self._listener.getsockname()[1]
        netloc = f"{parts.username}@127.0.0.1:{port}" if parts.username else \
            f"127.0.0.1:{port}"
        self.url = urlunsplit(parts._replace(netloc=netloc))
        """The URL to give the broker: the same database, through the proxy."""
        self._lock = threading.Lock()
        self._links: list[_Link] = []
        self._holding = False
        self._stopped = False
        threading.Thread(target=self._accept, daemon=True, name="pg-proxy").start()

    def __enter__(self) -> PgProxy:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def hold(self) -> None:
        """Keep the server's answers from now on (the statements still reach it)."""
        with self._lock:
            self._holding = True

    def cut(self) -> int:
        """Close every connection holding an answer (both ends); how many. Answers go on
        being held."""
        with self._lock:
            cut = [link for link in self._links if link.held]
            for link in cut:
                link.close()
                self._links.remove(link)
            return len(cut)

    def release(self) -> None:
        """Deliver what is held and let answers through again."""
        with self._lock:
            self._holding = False
            for link in list(self._links):
                try:
                    for data in link.held:
                        link.client.sendall(data)
                except OSError:
                    link.close()
                    self._links.remove(link)
                link.held.clear()

    def close(self) -> None:
        """Stop listening and close every connection."""
        with self._lock:
            self._stopped = True
            for link in self._links:
                link.close()
            self._links.clear()
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                server = socket.create_connection(self._target)
            except OSError:
                client.close()
                continue
            link = _Link(client, server)
            with self._lock:
                if self._stopped:
                    link.close()
                    return
                self._links.append(link)
            threading.Thread(target=self._upstream, args=(link,), daemon=True).start()
            threading.Thread(target=self._downstream, args=(link,), daemon=True).start()

    def _upstream(self, link: _Link) -> None:
        """The broker's bytes to the server, always."""
        try:
            while data := link.client.recv(_CHUNK):
                link.server.sendall(data)
        except OSError:
            pass
        self._drop(link)

    def _downstream(self, link: _Link) -> None:
        """The server's answers to the broker, or held."""
        try:
            while data := link.server.recv(_CHUNK):
                with self._lock:
                    if link.closed:
                        return
                    if self._holding and link.ready:
                        link.held.append(data)
                    else:
                        link.client.sendall(data)
                        link.ready = link.ready or _READY_FOR_QUERY in data
        except OSError:
            pass
        self._drop(link)

    def _drop(self, link: _Link) -> None:
        with self._lock:
            if link in self._links:
                self._links.remove(link)
            if not link.closed:
                link.close()
