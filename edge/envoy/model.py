"""The Envoy plan: which brokers Envoy fronts, and what the edge does to connections.

A :class:`BrokerRoute` is one broker as Envoy sees it: its stable id, the address given
to clients (``kafkaAdvertisedListeners``, where Envoy listens) and the internal address
of the broker listener Envoy forwards to.  :class:`EdgeOptions` are the policies applied
on every Envoy listener.  :class:`EnvoyPlan` is both, checked for consistency; every
mistake raises :class:`EnvoyConfigError` with a message naming the broker or option.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from listeners.hosts import is_loopback, is_wildcard
from listeners.spec import format_host_port

__all__ = [
    "AccessLog",
    "BrokerRoute",
    "ConnectionRate",
    "EdgeOptions",
    "EnvoyConfigError",
    "EnvoyPlan",
    "MutualTls",
    "TlsTermination",
    "is_ip",
    "parse_host_port",
]

_HOST_RE = re.compile(r"[A-Za-z0-9._-]+")
_MAX_PORT = 65535


class EnvoyConfigError(ValueError):
    """An Envoy option or broker description is wrong; the message says which and why."""


def is_ip(host: str) -> bool:
    """Whether ``host`` is an IPv4 or IPv6 literal (without brackets)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def parse_host_port(text: str, what: str, allow_zero: bool = False) -> tuple[str, int]:
    """``host:port`` (IPv6 in brackets) into its parts; ``what`` names it in errors.

    Port 0 (any free port, for servers) is accepted only with ``allow_zero``.
    """
    text = text.strip()
    if text.startswith("["):
        close = text.find("]")
        host, rest = text[1:close], text[close + 1 :]
        if close < 0 or not rest.startswith(":") or not is_ip(host):
            raise EnvoyConfigError(f"{what} {text!r}: expected [IPv6]:port")
        port_text = rest[1:]
    else:
        host, colon, port_text = text.rpartition(":")
        if not colon or not host or not _HOST_RE.fullmatch(host):
            raise EnvoyConfigError(f"{what} {text!r}: expected host:port")
    lowest = 0 if allow_zero else 1
    if not port_text.isdigit() or not lowest <= int(port_text) <= _MAX_PORT:
        raise EnvoyConfigError(f"{what} {text!r}: port must be {lowest}-{_MAX_PORT}")
    return host, int(port_text)


@dataclass(frozen=True)
class BrokerRoute:
    """One broker behind Envoy: id, the advertised (Envoy) address, the internal address."""

    broker_id: int
    advertised_host: str
    advertised_port: int
    internal_host: str
    internal_port: int

    @classmethod
    def parse(cls, text: str) -> BrokerRoute:
        """Parse ``ID=ADVERTISED_HOST:PORT@INTERNAL_HOST:PORT``.

        For example ``1=kafka-1.example.com:9092@10.0.0.11:9093``.
        """
        ident, eq, rest = text.strip().partition("=")
        advertised, at, internal = rest.partition("@")
        if not eq or not at or not ident.strip().isdigit():
            raise EnvoyConfigError(
                f"broker {text!r}: expected ID=ADVERTISED_HOST:PORT@INTERNAL_HOST:PORT"
            )
        adv_host, adv_port = parse_host_port(advertised, f"broker {text!r}: advertised")
        int_host, int_port = parse_host_port(internal, f"broker {text!r}: internal")
        return cls(int(ident), adv_host, adv_port, int_host, int_port)

    def __post_init__(self) -> None:
        if not 0 <= self.broker_id <= 2**31 - 1:
            raise EnvoyConfigError(f"broker id {self.broker_id} is out of range")
        if is_wildcard(self.advertised_host):
            raise EnvoyConfigError(
                f"broker {self.broker_id}: advertised address {self.advertised_address} is"
                " the nonroutable meta-address (every interface), which clients cannot"
                " connect to; advertise Envoy's host name or IP address"
            )

    @property
    def name(self) -> str:
        """The Envoy listener and cluster name of this broker."""
        return f"kafka-broker-{self.broker_id}"

    @property
    def stat_prefix(self) -> str:
        """The stat prefix of this broker's filters."""
        return f"kafka_broker_{self.broker_id}"

    @property
    def advertised_address(self) -> str:
        return format_host_port(self.advertised_host, self.advertised_port)

    @property
    def internal_address(self) -> str:
        return format_host_port(self.internal_host, self.internal_port)

    def spec(self) -> str:
        """This route as ``ID=ADVERTISED@INTERNAL`` text (``parse`` reads it back)."""
        return f"{self.broker_id}={self.advertised_address}@{self.internal_address}"


@dataclass(frozen=True)
class TlsTermination:
    """TLS at Envoy: the server certificate chain and key, and optionally a client CA.

    With ``client_ca`` Envoy requires a client certificate signed by it.
    """

    cert_chain: str
    private_key: str
    client_ca: str | None = None


@dataclass(frozen=True)
class MutualTls:
    """One side of a mutual TLS connection between Envoy and the xds-server: its own PEM
    certificate chain and key, and the CA the other side's certificate must chain to."""

    cert_chain: str
    private_key: str
    peer_ca: str


@dataclass(frozen=True)
class ConnectionRate:
    """At most ``connections`` new connections per ``seconds`` on each listener."""

    connections: int
    seconds: int = 1

    @classmethod
    def parse(cls, text: str) -> ConnectionRate:
        """``N`` (per second) or ``N/SECONDS``."""
        count, _, period = text.strip().partition("/")
        if not count.isdigit() or (period and not period.isdigit()):
            raise EnvoyConfigError(f"connection rate {text!r}: expected N or N/SECONDS")
        rate = cls(int(count), int(period or 1))
        if rate.connections < 1 or rate.seconds < 1:
            raise EnvoyConfigError(f"connection rate {text!r}: N and SECONDS must be >= 1")
        return rate


@dataclass(frozen=True)
class AccessLog:
    """Where connection logs go: ``stdout`` or a file path."""

    target: str

    @property
    def to_stdout(self) -> bool:
        return self.target == "stdout"


@dataclass(frozen=True)
class EdgeOptions:
    """What Envoy does on every broker listener.

    ``listen_host`` is the address Envoy binds; None binds the advertised host when it is
    an IP literal and every interface otherwise.  ``sni`` puts every broker on one port
    and routes by TLS server name (the advertised host); without ``tls`` the TLS stream
    passes through to the broker.  ``deny_cidrs`` close connections from those sources,
    ``allow_cidrs`` (when set) close every other source.  ``proxy_protocol`` starts each
    connection to a broker with a PROXY protocol v2 header naming the client.
    """

    listen_host: str | None = None
    tls: TlsTermination | None = None
    sni: bool = False
    deny_cidrs: tuple[str, ...] = ()
    allow_cidrs: tuple[str, ...] = ()
    max_connections: int | None = None
    connection_rate: ConnectionRate | None = None
    access_log: AccessLog | None = None
    kafka_broker_filter: bool = False
    proxy_protocol: bool = False
    connect_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        for cidr in (*self.deny_cidrs, *self.allow_cidrs):
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise EnvoyConfigError(f"{cidr!r} is not a CIDR range") from None
        if self.max_connections is not None and self.max_connections < 1:
            raise EnvoyConfigError("max connections must be >= 1")
        if self.listen_host is not None and not is_ip(self.listen_host):
            raise EnvoyConfigError(f"listen host {self.listen_host!r} must be an IP address")


@dataclass(frozen=True)
class EnvoyPlan:
    """The brokers and the edge options, checked together."""

    brokers: tuple[BrokerRoute, ...]
    options: EdgeOptions = field(default_factory=EdgeOptions)

    def __post_init__(self) -> None:
        if not self.brokers:
            raise EnvoyConfigError("no brokers to put behind Envoy")
        ids = [b.broker_id for b in self.brokers]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise EnvoyConfigError(f"broker id {duplicates[0]} is described twice")
        for broker in self.brokers:
            self._check_not_itself(broker)
        if self.options.sni:
            self._check_sni()
        else:
            self._check_listen_addresses()

    def listen_host(self, broker: BrokerRoute) -> str:
        """The address Envoy binds for ``broker`` (SNI hosts are names: every interface)."""
        if self.options.listen_host is not None:
            return self.options.listen_host
        return broker.advertised_host if is_ip(broker.advertised_host) else "0.0.0.0"

    def _check_not_itself(self, broker: BrokerRoute) -> None:
        """Refuse a broker whose internal address Envoy's own listener for it would take:
        the same port at the same host, or Envoy listening on every interface (or the
        broker bound to every interface) at the port of a broker on Envoy's host (a
        loopback internal address, as for a broker bound to every interface).  Envoy
        would forward to itself, or could not bind."""
        if broker.internal_port != broker.advertised_port:
            return
        listen, internal = self.listen_host(broker), broker.internal_host
        if _same_host(listen, internal) or is_wildcard(internal) or (
                is_wildcard(listen) and is_loopback(internal)):
            raise EnvoyConfigError(
                f"broker {broker.broker_id}: Envoy would listen for it on"
                f" {format_host_port(listen, broker.advertised_port)}, which is the broker's"
                f" own listener {broker.internal_address}; advertise Envoy's address"
                " (another port, or another host) instead"
            )

    def _check_listen_addresses(self) -> None:
        """Refuse two brokers whose Envoy listeners share a port at overlapping hosts:
        the same address, or either on every interface (a wildcard).  Envoy binds a
        specific address and a wildcard on one port both, and gives a connection to the
        specific one: every client of the broker listening on the wildcard that reaches
        the specific address (a host name resolving to it, ``localhost``) would be routed
        to the other broker."""
        by_port: dict[int, list[tuple[str, BrokerRoute]]] = {}
        for broker in self.brokers:
            host = self.listen_host(broker)
            seen = by_port.setdefault(broker.advertised_port, [])
            for other_host, other in seen:
                if not _overlapping(host, other_host):
                    continue
                if broker.advertised_address.lower() == other.advertised_address.lower():
                    raise EnvoyConfigError(
                        f"brokers {other.broker_id} and {broker.broker_id} both advertise"
                        f" {broker.advertised_address}; without SNI each broker needs its"
                        " own port")
                raise EnvoyConfigError(
                    f"brokers {other.broker_id} and {broker.broker_id} both take port"
                    f" {broker.advertised_port}: Envoy would listen for broker"
                    f" {other.broker_id} on {format_host_port(other_host, other.advertised_port)}"
                    f" and for broker {broker.broker_id} on"
                    f" {format_host_port(host, broker.advertised_port)}, which overlap (the"
                    " same address, or every interface), so clients of one would reach the"
                    " other; without SNI each broker needs its own port")
            seen.append((host, broker))

    def _check_sni(self) -> None:
        ports = {b.advertised_port for b in self.brokers}
        if len(ports) != 1:
            raise EnvoyConfigError(
                "SNI routing puts every broker on one port: advertise the same port"
                f" for all brokers (got {sorted(ports)})"
            )
        names: set[str] = set()
        for broker in self.brokers:
            host = broker.advertised_host.lower()
            if is_ip(host):
                raise EnvoyConfigError(
                    f"broker {broker.broker_id}: SNI routing needs a host name, not"
                    f" {broker.advertised_host}"
                )
            if host in names:
                raise EnvoyConfigError(
                    f"broker {broker.broker_id}: host name {host} is used by another broker"
                )
            names.add(host)


def _same_listen_host(first: str, second: str) -> bool:
    """Whether two hosts Envoy listens on (IP literals) are one address, in any spelling
    (an IPv4-mapped IPv6 address as its IPv4 address)."""
    return _listen_address(first) == _listen_address(second)


def _listen_address(host: str) -> str:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host.lower()
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return str(mapped or address)


def _overlapping(first: str, second: str) -> bool:
    """Whether Envoy listeners on two hosts (at one port) can take the same connections:
    the same address, or either a wildcard (of either family: a host name a client
    resolves may give an address of either)."""
    return is_wildcard(first) or is_wildcard(second) or _same_listen_host(first, second)


_LOOPBACK_NAMED = frozenset({"127.0.0.1", "::1"})
"""The addresses a loopback name (``localhost``) stands for."""


def _same_host(first: str, second: str) -> bool:
    """Whether two hosts of an Envoy route name the same address: the same spelling, or a
    loopback name (``localhost``) and the address it stands for."""
    first, second = first.lower(), second.lower()
    if first == second:
        return True
    if not is_ip(first) and is_loopback(first):
        return second in _LOOPBACK_NAMED or (not is_ip(second) and is_loopback(second))
    if not is_ip(second) and is_loopback(second):
        return first in _LOOPBACK_NAMED
    return False
