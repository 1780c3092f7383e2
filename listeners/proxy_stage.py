"""The first stage of a connection to a listener behind a proxy that speaks the PROXY
protocol v2 (:mod:`listeners.proxy_protocol`; Envoy's upstream ``proxy_protocol``
transport socket): before a TLS handshake or a Kafka frame, the proxy says whom the
connection carries, and that client's address is the connection's peer from then on
(``ConnectionInfo.peer``, ``on_reject``, the per-address cap).

Only the listener's trusted addresses (``proxyProtocolTrustedAddresses``) may send the
header: a connection from anywhere else is closed at once, with one log line and
``on_reject``, before anything is read (else any client could claim any address). A
trusted sender has ``timeout_s`` to send a whole header; a header that is not one, or
does not come in time, closes the connection the same way. The header is read alone: the
bytes after it (a ClientHello, a first frame) go, unread, to the next stage with the
transport.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Callable, Iterable
from typing import cast

from listeners.connection_counts import ConnectionCounts, Slot
from listeners.handshake import peer_address
from listeners.proxy_protocol import ProxyHeaderError, parse_header

__all__ = ["ProxyStage", "TrustedProxies", "parse_trusted_proxies"]

log = logging.getLogger(__name__)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

NextStage = Callable[[asyncio.Transport, Slot, str, bytes], None]
"""What takes a connection after its header: the transport (reading paused), its slot,
the client's ``host:port`` and the bytes read after the header."""


class TrustedProxies:
    """The addresses a listener takes PROXY protocol headers from."""

    def __init__(self, networks: Iterable[Network]) -> None:
        self.networks = tuple(networks)

    def __contains__(self, host: str) -> bool:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address.version == n.version and address in n for n in self.networks)

    def __str__(self) -> str:
        return "+".join(str(n) for n in self.networks)


def parse_trusted_proxies(entries: Iterable[str]) -> dict[str, TrustedProxies]:
    """``NAME:ADDRESS+ADDRESS`` entries (an address or a CIDR range, IPv6 as written or in
    brackets) as upper-case listener names and their trusted proxies; ValueError names a
    bad entry."""
    result: dict[str, TrustedProxies] = {}
    for entry in entries:
        name, sep, addresses = (part.strip() for part in entry.strip().partition(":"))
        networks: list[Network] = []
        try:
            if not sep or not name or not addresses:
                raise ValueError
            for text in addresses.split("+"):
                bare = text.strip().removeprefix("[").replace("]", "", 1)
                networks.append(ipaddress.ip_network(bare, strict=False))
        except ValueError:
            raise ValueError(f"expected NAME:ADDRESS+ADDRESS (a listener name and IP "
                             f"addresses or CIDR ranges), not {entry!r}") from None
        if name.upper() in result:
            raise ValueError(f"listener {name.upper()!r} is named twice")
        result[name.upper()] = TrustedProxies(networks)
    return result


class ProxyStage(asyncio.Protocol):
    """The protocol of a connection until its PROXY protocol header is read; then
    ``next_stage`` takes the transport. The connection counts against the listener's cap
    from its accept and against its client's address once the header names it (a LOCAL
    header, the proxy's own connection: against nobody's)."""

    def __init__(self, listener: str, listener_cap: int, trusted: TrustedProxies,
                 counts: ConnectionCounts, next_stage: NextStage,
                 on_reject: Callable[[str, str], None] | None,
                 pending: set[ProxyStage], timeout_s: float) -> None:
        self.listener = listener
        self.listener_cap = listener_cap
        self.trusted = trusted
        self.counts = counts
        self.next_stage = next_stage
        self.on_reject = on_reject
        self.pending = pending
        self.timeout_s = timeout_s
        self.transport: asyncio.Transport | None = None
        self.peer = "an unknown address"
        self.slot: Slot | None = None
        self.read = bytearray()
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        accepted = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it
        self.peer = peer_address(accepted)
        host = self.peer.rsplit(":", 1)[0]
        if host not in self.trusted:
            self._refuse(accepted, f"{host} is not a trusted proxy "
                                   f"(proxyProtocolTrustedAddresses)")
            return
        verdict = self.counts.admit(self.listener, self.listener_cap, None)
        if not isinstance(verdict, Slot):
            self._refuse(accepted, verdict, "refusing")
            return
        self.transport, self.slot = accepted, verdict
        self.pending.add(self)
        self.timer = asyncio.get_running_loop().call_later(self.timeout_s, self._late)

    def data_received(self, data: bytes) -> None:
        if self.slot is None:
            return
        self.read += data
        try:
            header = parse_header(self.read)
        except ProxyHeaderError as exc:
            self._close(str(exc))
            return
        if header is None:
            return
        transport, slot = self._detach()
        transport.pause_reading()
        client = header.source or self.peer
        if header.source is not None:
            refused = self.counts.assign(slot, client.rsplit(":", 1)[0])
            if refused is not None:
                slot.release()
                self.peer = client
                self._refuse(transport, refused, "refusing")
                return
        self.next_stage(transport, slot, client, bytes(self.read[header.length:]))

    def eof_received(self) -> bool:
        return False  # the transport closes: connection_lost says so

    def connection_lost(self, exc: Exception | None) -> None:
        if self.slot is not None:
            _transport, slot = self._detach()
            slot.release()
            log.info("connection from %s on %s lost before its PROXY protocol header",
                     self.peer, self.listener)

    def abort(self) -> None:
        """Close the connection (the listener stops)."""
        if self.transport is not None:
            self.transport.abort()

    def _late(self) -> None:
        self._close(f"PROXY protocol header not complete within {self.timeout_s:g} s")

    def _close(self, reason: str) -> None:
        """Close a connection whose header is wrong or late."""
        if self.slot is not None:
            transport, slot = self._detach()
            slot.release()
            self._refuse(transport, reason)

    def _detach(self) -> tuple[asyncio.Transport, Slot]:
        """The header is read, or never will be: the stage lets go of the connection
        (its transport and slot, returned)."""
        transport, slot = self.transport, self.slot
        assert transport is not None and slot is not None
        if self.timer is not None:
            self.timer.cancel()
        self.timer = None
        self.pending.discard(self)
        self.transport = self.slot = None
        return transport, slot

    def _refuse(self, transport: asyncio.Transport, reason: str, verb: str = "closing") -> None:
        """Close the connection: one log line (``verb``: "refusing" for a cap, as
        :meth:`listeners.server.ListenerServer.admit` says it) and ``on_reject``."""
        log.warning("%s connection from %s on %s: %s", verb, self.peer, self.listener, reason)
        transport.abort()
        if self.on_reject is not None:
            self.on_reject(self.peer, reason)
