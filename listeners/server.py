"""Asyncio servers for listeners: framing, in-order pipelining, limits and graceful stop.

Requests of one connection take effect in the order they arrived, and their responses
leave in that order, as Kafka requires. Kafka gets both by handling one request per
connection at a time; here each request has two stages (:class:`Request`): its
``answer`` coroutine is the *dispatch stage*, run strictly one request after another: the
next frame is not even prepared until the dispatch stage before it has returned, however
many awaits it holds. What it returns may be a *waiting stage* (an awaitable giving the
response), and only waiting stages overlap with later requests: a produce waiting for its
commit, a long-poll fetch, a group member waiting for its group. Responses leave in
request order: the read loop writes one itself when nothing is queued before it (most
requests, with no task of their own), a write loop sends the others. What a frame means,
and what belongs to which stage, is the connection handler's business; this module only
knows sizes, order and timeouts.

Memory is bounded twice. Per connection: before a request starts, its handler says how
large its response may grow (:attr:`Request.response_bound`), and the request is started
only when that, the bounds of the requests still running and the responses finished but
not yet written fit in ``max_pending_response_bytes`` together, or when nothing else is
held (so one request larger than the limit still runs, alone). Until then the connection
is not read: a client that pipelines fetches and never reads, or parks long polls that
wake together, stops being read instead of filling the broker.

Per server: a connection whose handler reports a frame limit (one that has not logged
in) may send frames up to that limit only. Such a connection is read one small piece at a
time and not at all while its request runs; a frame of up to ``SMALL_FRAME_BYTES`` (any
real login) is read as it is, a larger one draws on one :class:`ReadBudget` shared by the
broker's listeners as its bytes arrive, so that nobody can fill the budget by declaring
sizes, and a full budget never stops a login. The requests of such connections are served
a few at a time across the broker's listeners (:class:`LoginGate`,
:mod:`listeners.admission`), so that a login storm does not queue ahead of logged-in
clients' requests.

A handler may mute its connection until a moment (``muted_until``, a client throttled by
a quota, KIP-219): until then no frame is read or started and the transport is paused, so
the client's requests wait in its socket, whether it honours ``throttle_time_ms`` or not.

A connection is counted from the moment it is accepted, before its TLS handshake, against
the listener's ``max_connections`` and the cap of its client address
(:mod:`listeners.connection_counts`, shared by the broker's listeners): one beyond either
is closed at once, before anything is read, with one log line and ``on_reject``.
``on_accept`` may refuse a new connection too (:class:`ConnectionRefused`, a quota on new
connections of its address): it is closed before anything is read, before its TLS
handshake (after its PROXY protocol header, which names the address).

On a TLS listener each connection does its handshake in :mod:`listeners.handshake`,
within ``handshake_seconds``. On a listener behind a proxy (``trusted_proxies``) each
connection first sends a PROXY protocol header (:mod:`listeners.proxy_stage`), within
``handshake_seconds`` too, before its handshake or first frame: the client it names is
the connection's peer.

An IPv6 wildcard host (``[::]``) binds a dual-stack socket (:mod:`listeners.hosts`).

The handler contract is in :mod:`listeners.frames`, one connection's loops in
:mod:`listeners.connection`; this module holds the listening socket. The contract's names
are importable from here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from functools import partial

from listeners.admission import LoginGate
from listeners.connection import Connection, log_lost, tls_usable
from listeners.connection_counts import ConnectionCounts, Slot
from listeners.frames import (
    SMALL_FRAME_BYTES,
    Answer,
    ConnectionHandler,
    ConnectionInfo,
    ConnectionRefused,
    FrameError,
    HandlerFactory,
    Limits,
    ReadBudget,
    Request,
    Response,
    response_size,
)
from listeners.handshake import HANDSHAKE_SECONDS, TlsHandshake, feed, peer_address
from listeners.hosts import dual_stack_socket
from listeners.pacing import TurnPacer
from listeners.protocol import FrameProtocol
from listeners.proxy_stage import ProxyStage, TrustedProxies
from listeners.reader import ConnectionReader

__all__ = ["SMALL_FRAME_BYTES", "Answer", "ConnectionCounts", "ConnectionHandler",
           "ConnectionInfo", "ConnectionRefused",
           "FrameError", "HandlerFactory", "Limits", "ListenerServer", "LoginGate", "ReadBudget",
           "Request", "Response", "response_size"]

log = logging.getLogger(__name__)


LISTEN_BACKLOG = 4096
"""Connections the kernel holds for accepting (capped by ``net.core.somaxconn``). With
asyncio's default of 100, a thousand clients connecting at once lost most of their SYNs
and came back 1, 3, 7, 15 s later: a storm of 1,000 logins took 28 s instead of about
one (``bench.logins``)."""

CLOSES_PER_TURN = 32
"""Connections of a listener torn down per turn of the event loop at most
(:mod:`listeners.pacing`: a thousand clients closing at once made turns of 10-25 ms)."""


LATE_SECONDS = 5.0
"""How long a stop waits for the connections it aborted after the grace period to end."""


class ListenerServer:
    """One listening socket and the connections it accepted."""

    def __init__(self, name: str, host: str, port: int, factory: HandlerFactory,
                 limits: Limits, tls_context: Callable[[], ssl.SSLContext] | None = None,
                 on_reject: Callable[[str, str], None] | None = None,
                 budget: ReadBudget | None = None, gate: LoginGate | None = None,
                 counts: ConnectionCounts | None = None,
                 handshake_seconds: float = HANDSHAKE_SECONDS,
                 trusted_proxies: TrustedProxies | None = None,
                 on_accept: Callable[[str], None] | None = None) -> None:
        self.name = name
        self.host = host
        self.port = port
        self.factory = factory
        self.limits = limits
        self.tls_context = tls_context
        """The server context for a connection accepted now (TLS listeners; read per
        connection: :class:`listeners.tls_source.TlsContextSource` rebuilds it when its files
        change)."""
        self.on_reject = on_reject
        self.budget = budget or ReadBudget(limits.max_frame_bytes)
        self.gate = gate
        self.counts = counts or ConnectionCounts(limits.max_connections)
        """Open connections, counted from their accept (shared by a broker's listeners)."""
        self.handshake_seconds = handshake_seconds
        self.trusted_proxies = trusted_proxies
        """Where PROXY protocol headers come from; None: the listener takes none."""
        self.on_accept = on_accept
        """Told the client of each connection as it is accepted (after its PROXY protocol
        header, before its TLS handshake); raises ConnectionRefused to refuse it."""
        self.closing = TurnPacer(CLOSES_PER_TURN)
        self._server: asyncio.Server | None = None
        self._connections: set[Connection] = set()
        self._tasks: set[asyncio.Task[object]] = set()
        self._handshakes: set[asyncio.Task[None]] = set()
        self._headers: set[ProxyStage] = set()

    async def start(self) -> int:
        """Bind and listen; return the bound port (useful with port 0)."""
        loop = asyncio.get_running_loop()
        factory: Callable[[], asyncio.BaseProtocol] = (
            self._stream if self.tls_context is None else self._tls_handshake)
        trusted = self.trusted_proxies
        if trusted is not None:
            factory = partial(ProxyStage, self.name, self.limits.max_connections, trusted,
                              self.counts, self._proxied, self.on_reject, self._headers,
                              self.handshake_seconds)
        sock = dual_stack_socket(self.host, self.port, LISTEN_BACKLOG)
        if sock is None:
            self._server = await loop.create_server(factory, self.host or None, self.port,
                                                    backlog=LISTEN_BACKLOG)
        else:
            try:
                self._server = await loop.create_server(factory, sock=sock,
                                                        backlog=LISTEN_BACKLOG)
            except BaseException:
                sock.close()
                raise
        sockets = self._server.sockets
        self.port = int(sockets[0].getsockname()[1])
        return self.port

    def _stream(self, slot: Slot | None = None, peer: str | None = None) -> FrameProtocol:
        """The protocol of a connection ready for Kafka frames (after TLS or a PROXY
        protocol header, if any: then with the ``slot`` the connection was counted in at
        its accept; ``peer``: the client a PROXY protocol header named)."""
        return FrameProtocol(ConnectionReader(SMALL_FRAME_BYTES),
                             partial(self._accept, slot, peer))

    def _tls_handshake(self, peer: str | None = None,
                       admit: Callable[[asyncio.WriteTransport], Slot | None] | None = None
                       ) -> TlsHandshake:
        """The first protocol of a TLS connection (``peer``, ``admit``: after a PROXY
        protocol header, the client it named and the connection's slot)."""
        assert self.tls_context is not None
        return TlsHandshake(self.tls_context(), self.name, partial(self._stream, peer=peer),
                            self.on_reject, self._handshakes, admit or self.admit,
                            self.handshake_seconds, peer)

    def _proxied(self, transport: asyncio.Transport, slot: Slot, peer: str,
                 early: bytes) -> None:
        """Hand a connection whose PROXY protocol header is read (reading paused) to its
        TLS handshake or Kafka framing, with the bytes read after the header."""
        if self._refused(peer):
            slot.release()
            transport.abort()
            return
        if self.tls_context is not None:
            handshake = self._tls_handshake(peer, lambda _transport: slot)
            handshake.early += early
            transport.set_protocol(handshake)
            handshake.connection_made(transport)
            return
        stream = self._stream(slot, peer)
        transport.set_protocol(stream)
        stream.connection_made(transport)
        transport.resume_reading()  # before the feed: the reader may pause it again
        if early:
            feed(stream, memoryview(early))

    def admit(self, transport: asyncio.WriteTransport) -> Slot | None:
        """Count a connection just accepted; None: it is over a cap, and closed (one log
        line, ``on_reject``)."""
        peer = peer_address(transport)
        verdict = self.counts.admit(self.name, self.limits.max_connections,
                                    peer.rsplit(":", 1)[0])
        if isinstance(verdict, Slot):
            if not self._refused(peer):
                return verdict
            verdict.release()
            transport.abort()
            return None
        log.warning("refusing connection from %s on %s: %s", peer, self.name, verdict)
        transport.abort()
        if self.on_reject is not None:
            self.on_reject(peer, f"connection refused: {verdict}")
        return None

    def _refused(self, peer: str) -> bool:
        """Whether ``on_accept`` refuses a connection of ``peer`` (it says why itself)."""
        if self.on_accept is None:
            return False
        try:
            self.on_accept(peer)
        except ConnectionRefused:
            return True
        return False

    async def _accept(self, slot: Slot | None, peer: str | None, reader: ConnectionReader,
                      writer: asyncio.StreamWriter) -> None:
        if slot is None:  # plain TCP: counted now, in the turn after its accept
            slot = self.admit(writer.transport)
            if slot is None:
                return
        try:
            await self._serve(reader, writer, peer or peer_address(writer.transport))
        finally:
            slot.release()

    async def _serve(self, reader: ConnectionReader, writer: asyncio.StreamWriter,
                     peer: str) -> None:
        tls = writer.get_extra_info("ssl_object")
        if writer.transport.is_closing() or (tls is not None and not tls_usable(tls)):
            # lost already (garbage right after the handshake): say why, once
            lost: OSError | None = None
            try:
                await reader.read()  # until the transport tells the reader why it closed
            except OSError as exc:
                lost = exc
            log_lost(peer, self.name, lost)
            writer.close()
            return
        info = ConnectionInfo(self.name, peer, tls)
        try:
            handler = self.factory(info)
        except ConnectionRefused:  # a client certificate refused: the factory said why
            writer.close()
            return
        connection = Connection(reader, writer, handler, info, self.limits,
                                self.budget, self.on_reject, self.gate, self.closing)
        self._connections.add(connection)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await connection.serve()
        except asyncio.CancelledError:
            pass  # stopped after the grace period (a TLS peer that ignores close_notify)
        finally:
            self._connections.discard(connection)
            if task is not None:
                self._tasks.discard(task)

    async def stop(self, grace_seconds: float = 10.0) -> None:
        """Stop accepting, answer the requests already read of the connections logged in
        (those not logged in are dropped at once), then close every connection."""
        if self._server is not None:
            self._server.close()
        for handshake in list(self._handshakes):
            handshake.cancel()
        for header in list(self._headers):
            header.abort()
        for connection in list(self._connections):
            if connection.logged_in:
                connection.stop_reading()
            else:  # owed nothing (Kafka's broker closes every channel at its stop)
                connection.drop()
        if self._tasks:
            _done, late = await asyncio.wait(set(self._tasks), timeout=grace_seconds)
            if late:  # a client that reads nothing holds its answers: dropped, unsent
                for connection in list(self._connections):
                    connection.abort()
                for task in late:
                    task.cancel()
                _done, late = await asyncio.wait(late, timeout=LATE_SECONDS)
                if late:
                    log.warning("%d connection(s) of %s did not end within %.0f s of their "
                                "abort", len(late), self.name, LATE_SECONDS)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
