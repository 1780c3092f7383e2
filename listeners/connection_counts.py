"""Connections counted from the moment they are accepted, before a TLS handshake, as
Kafka's ``ConnectionQuotas`` counts them in its Acceptor: each listener's cap
(``maxConnectionsPerListener``) and a cap per client address across the broker's listeners
(``maxConnectionsPerIp``, with ``maxConnectionsPerIpOverrides``: Kafka's
``max.connections.per.ip`` and ``max.connections.per.ip.overrides``).

A connection still in its TLS handshake holds a file descriptor as surely as one logged
in: counting it only after the handshake let idle sockets exhaust the broker's
descriptors. A connection beyond a cap is refused at once, before anything is read (the
listener closes it, with one log line and an audit event).

A connection from a trusted proxy (:mod:`listeners.proxy_stage`) counts against its
listener's cap from its accept, as any other, but against the cap of the client address
its PROXY protocol header carries, once that is read (:meth:`ConnectionCounts.assign`):
the proxy's own address is not capped, or every client behind it would share one cap.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping


def parse_ip_overrides(entries: Iterable[str]) -> dict[str, int]:
    """``address:count`` entries (an IPv6 address as written, ``::1:500``; the count is
    after the last colon) as a map of the address's canonical spelling to its cap;
    ValueError names a bad entry. Only addresses: Kafka also takes host names, which it
    resolves once at start, an address the operator can as well write."""
    caps: dict[str, int] = {}
    for entry in entries:
        host, sep, count = entry.strip().rpartition(":")
        host = host.strip().removeprefix("[").removesuffix("]")
        try:
            if not sep:
                raise ValueError
            address = str(ipaddress.ip_address(host))
            cap = int(count.strip())
            if cap < 0:
                raise ValueError
        except ValueError:
            raise ValueError(f"expected ADDRESS:COUNT (an IP address and a count >= 0), "
                             f"not {entry!r}") from None
        caps[address] = cap
    return caps


class Slot:
    """One accepted connection's place in the counts, held until it closes
    (:meth:`release`, idempotent)."""

    __slots__ = ("_counts", "_held", "host", "listener")

    def __init__(self, counts: ConnectionCounts, listener: str, host: str | None) -> None:
        self._counts = counts
        self.listener = listener
        self.host = host
        self._held = True

    def release(self) -> None:
        """The connection is closed: give its place back (once)."""
        if self._held:
            self._held = False
            self._counts.released(self)


class ConnectionCounts:
    """Open connections per listener and per client address, shared by a broker's
    listeners (``per_ip``: the cap of an address without an override)."""

    def __init__(self, per_ip: int, overrides: Mapping[str, int] | None = None) -> None:
        self.per_ip = per_ip
        self.overrides = dict(overrides or {})
        self._listeners: dict[str, int] = {}
        self._hosts: dict[str, int] = {}

    def open(self, listener: str) -> int:
        """The connections of ``listener`` open now, handshakes under way included."""
        return self._listeners.get(listener, 0)

    def cap(self, host: str) -> int:
        """How many connections ``host`` may hold at once."""
        return self.overrides.get(host, self.per_ip)

    def admit(self, listener: str, listener_cap: int, host: str | None) -> Slot | str:
        """Count a connection accepted on ``listener`` from ``host`` (None: from a trusted
        proxy, its client's address counted by :meth:`assign`): its slot, or why it is
        refused (the end of a log line)."""
        if self.open(listener) >= listener_cap:
            return f"{listener_cap} connections is the limit"
        refused = None if host is None else self._host_refusal(host)
        if refused is not None:
            return refused
        self._listeners[listener] = self._listeners.get(listener, 0) + 1
        if host is not None:
            self._hosts[host] = self._hosts.get(host, 0) + 1
        return Slot(self, listener, host)

    def assign(self, slot: Slot, host: str) -> str | None:
        """Count the connection of ``slot`` (admitted without a host) against ``host``'s
        cap too: None, or why it is refused (the slot is then unchanged)."""
        refused = self._host_refusal(host)
        if refused is None:
            slot.host = host
            self._hosts[host] = self._hosts.get(host, 0) + 1
        return refused

    def _host_refusal(self, host: str) -> str | None:
        host_cap = self.cap(host)
        if self._hosts.get(host, 0) >= host_cap:
            return f"{host_cap} connections from {host} is the limit (maxConnectionsPerIp)"
        return None

    def released(self, slot: Slot) -> None:
        """What :meth:`Slot.release` calls."""
        for counts, key in ((self._listeners, slot.listener), (self._hosts, slot.host)):
            if key is None:
                continue
            left = counts[key] - 1
            if left:
                counts[key] = left
            else:
                del counts[key]
