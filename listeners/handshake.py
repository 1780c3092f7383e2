"""The TLS handshake of a connection to a TLS listener, done per connection rather than by
the server socket, so that a failed one (a refused client certificate, a client speaking
something else) is reported like any other rejected connection. The connection is counted
(:mod:`listeners.connection_counts`) as it is accepted, before its handshake, and the
handshake has ``tlsHandshakeTimeoutMs`` to complete."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import cast

from listeners.connection_counts import Slot
from listeners.hosts import unmapped

log = logging.getLogger(__name__)


def os_reason(exc: OSError) -> str:
    """A short reason for a socket error: the TLS alert or the error's name."""
    if isinstance(exc, ssl.SSLError):
        return f"TLS error {exc.reason or exc.strerror or type(exc).__name__}"
    return exc.strerror or type(exc).__name__


HANDSHAKE_SECONDS = 10.0
"""How long a TLS handshake may take by default (``tlsHandshakeTimeoutMs``; asyncio's
default of 60 s let a socket that never sends a ClientHello hold a descriptor for a
minute). A TLS 1.2 handshake is two round trips, 1.3 one: seconds even on a poor mobile
link; the Java client gives a whole connection setup 10 s before its first retry
(``socket.connection.setup.timeout.ms``)."""

SHUTDOWN_SECONDS = 2.0
"""How long a TLS connection the broker closes waits for the client's close_notify before
its socket is closed anyway (uvloop's default of 30 s kept the descriptor, and the
connection's slot under ``maxConnectionsPerIp``, for 30 s after a client that never
answered)."""


def peer_address(transport: asyncio.BaseTransport) -> str:
    """``host:port`` of the other end of a connection (an IPv4 client of a dual-stack
    socket by its IPv4 address)."""
    peername = transport.get_extra_info("peername")
    if isinstance(peername, tuple):
        return f"{unmapped(str(peername[0]))}:{peername[1]}"
    return str(peername) if peername else "an unknown address"


class TlsHandshake(asyncio.Protocol):
    """The first protocol of a connection to a TLS listener: it runs the handshake and
    then gives the transport to the protocol ``stream`` makes for the connection's
    :class:`Slot`; a failed handshake is one log line and, but for a peer that just went
    away, a call of ``on_reject``. ``admit`` counts the connection as it is accepted (None:
    it is refused, and closed already).

    uvloop reads once after ``connection_made`` even when it paused the transport: what
    arrives then (a ClientHello) is held here and handed to the TLS protocol, in the loop
    turn that makes the TLS protocol ready and before any other read (``start_tls``
    schedules both within the turn in which it is called). After a PROXY protocol header
    (:mod:`listeners.proxy_stage`) the bytes read with it are put in ``early`` before
    ``connection_made``, and ``peer`` is the client the header named."""

    def __init__(self, context: ssl.SSLContext, listener: str,
                 stream: Callable[[Slot], asyncio.BaseProtocol],
                 on_reject: Callable[[str, str], None] | None,
                 running: set[asyncio.Task[None]],
                 admit: Callable[[asyncio.WriteTransport], Slot | None],
                 timeout_s: float = HANDSHAKE_SECONDS, peer: str | None = None) -> None:
        self.context = context
        self.listener = listener
        self.stream = stream
        self.on_reject = on_reject
        self.running = running
        self.admit = admit
        self.timeout_s = timeout_s
        self.transport: asyncio.Transport | None = None
        self.early = bytearray()
        self.peer = peer
        """The client's ``host:port`` when a PROXY protocol header named it, else None:
        the socket's peer."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        accepted = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it
        slot = self.admit(accepted)
        if slot is None:
            return
        self.transport = accepted
        self.transport.pause_reading()
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._handshake(self.transport,
                                                  self.peer or peer_address(transport), slot))
        self.running.add(task)
        task.add_done_callback(self.running.discard)
        # the task calls start_tls in the next turn; the turn after, once the TLS protocol
        # has its connection_made, it gets the early bytes
        loop.call_soon(loop.call_soon, self._hand_over)

    async def _handshake(self, transport: asyncio.Transport, peer: str, slot: Slot) -> None:
        """Do the handshake; on success the stream protocol takes the connection (and
        its slot), else the slot is given back."""
        stream = self.stream(slot)
        try:
            tls = await asyncio.get_running_loop().start_tls(
                transport, stream, self.context, server_side=True,
                ssl_handshake_timeout=self.timeout_s, ssl_shutdown_timeout=SHUTDOWN_SECONDS)
        except (OSError, TimeoutError) as exc:
            transport.abort()
            slot.release()
            if isinstance(exc, ConnectionError) and not isinstance(
                    exc, ssl.SSLError | ConnectionAbortedError):  # aborted: the timeout
                log.info("connection from %s on %s lost during the TLS handshake: %s",
                         peer, self.listener, os_reason(exc))
                return
            reason = (f"TLS handshake not complete within {self.timeout_s:g} s"
                      if isinstance(exc, TimeoutError | ConnectionAbortedError)
                      else f"TLS handshake failed: {os_reason(exc)}")
            log.warning("closing connection from %s on %s: %s", peer, self.listener, reason)
            if self.on_reject is not None:
                self.on_reject(peer, reason)
        except asyncio.CancelledError:
            transport.abort()
            slot.release()
        else:
            if tls is None or tls.is_closing() or transport.is_closing():
                slot.release()
                log.info("connection from %s on %s lost during the TLS handshake", peer,
                         self.listener)
                return
            stream.connection_made(tls)  # start_tls leaves that to its caller

    def data_received(self, data: bytes) -> None:
        self.early += data
        if self.transport is not None:
            self.transport.pause_reading()

    def _hand_over(self) -> None:
        if self.early and self.transport is not None and not self.transport.is_closing():
            protocol = self.transport.get_protocol()
            if protocol is not self:
                feed(protocol, memoryview(self.early))
        self.early = bytearray()


def feed(protocol: asyncio.BaseProtocol, data: memoryview) -> None:
    """Give ``data`` to ``protocol`` as if the transport had read it (the TLS protocols
    of asyncio and uvloop are buffered protocols)."""
    if not hasattr(protocol, "buffer_updated"):
        cast(asyncio.Protocol, protocol).data_received(bytes(data))
        return
    buffered = cast(asyncio.BufferedProtocol, protocol)
    while data:
        buffer = memoryview(buffered.get_buffer(len(data)))
        size = min(len(buffer), len(data))
        buffer[:size] = data[:size]
        buffered.buffer_updated(size)
        data = data[size:]
