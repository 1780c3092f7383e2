"""Listener specifications: parse ``kafkaListeners`` and friends into ``ListenerSpec`` values.

This module owns the syntax and the consistency rules of the three listener settings,
following Kafka-on-Pulsar (KoP):

``listeners``
    ``NAME://host:port`` entries separated by commas (whitespace around entries is
    tolerated, empty entries are not).  ``host`` may be a host name, an IPv4 address,
    an IPv6 literal in brackets (``[::1]:9092``, kept in its short form: ``::1``) or
    empty, meaning every interface (bound as ``0.0.0.0``).  Port 0 asks the OS for a free
    port; the server reports the real one through :meth:`ListenerSpec.with_bound_port`.

``protocol_map``
    ``NAME:PROTOCOL`` entries separated by commas.  When it is non-empty, the scheme of
    each listener is a *listener name* that must appear in the map.  When it is empty,
    the scheme must itself be a security protocol (``PLAINTEXT``, ``SSL``,
    ``SASL_PLAINTEXT``, ``SASL_SSL``).  Names that the listeners do not use may appear.

``advertised``
    Same syntax as ``listeners`` and the same names.  An advertised name without a
    listener is an error, and so is an advertised host that is empty or a wildcard
    (``0.0.0.0``, ``[::]``, in any spelling: :func:`listeners.hosts.is_wildcard`), which
    clients cannot connect to (Kafka refuses ``0.0.0.0`` too).  A listener without an
    advertised entry advertises its bind address, except that a listener bound to every
    interface advertises this host's name (:func:`listeners.hosts.machine_host_name`, as
    Kafka does) rather than the wildcard.

Listener names and protocol names are case-insensitive (as in Kafka) and are kept
upper-case.  Two listeners may not share a non-zero port on the same host, nor on any
host when one of them binds a wildcard address.  Every mistake raises
:class:`ListenerConfigError` naming the offending entry and which setting it came from.
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from listeners.hosts import is_wildcard, machine_host_name

__all__ = [
    "ListenerConfigError",
    "ListenerSpec",
    "SecurityProtocol",
    "format_host_port",
    "parse_listeners",
    "parse_protocol_map",
    "select_advertised",
]

ALL_INTERFACES = "0.0.0.0"
"""The bind host used for an entry written with an empty host (``PLAINTEXT://:9092``)."""

_NAME_RE = re.compile(r"[A-Za-z0-9_-]+")
_HOSTNAME_RE = re.compile(r"[A-Za-z0-9._-]+")
_PORT_RE = re.compile(r"[0-9]+")
_MAX_PORT = 65535

Source = Literal["listeners", "protocol_map", "advertised"]


class ListenerConfigError(ValueError):
    """A listener setting is malformed or inconsistent.

    ``source`` says which of the three settings holds the mistake, so that callers can
    name their own configuration key in messages.
    """

    def __init__(self, message: str, source: Source = "listeners") -> None:
        super().__init__(message)
        self.source: Source = source


class SecurityProtocol(enum.Enum):
    """The Kafka security protocols a listener can speak."""

    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"

    @property
    def uses_tls(self) -> bool:
        """Whether connections on this protocol are wrapped in TLS."""
        return self in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)

    @property
    def uses_sasl(self) -> bool:
        """Whether clients must authenticate with SASL on this protocol."""
        return self in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)

    @classmethod
    def from_name(cls, name: str) -> SecurityProtocol | None:
        """The protocol called ``name`` (case-insensitive), or None if there is none."""
        return cls.__members__.get(name.strip().upper())


@dataclass(frozen=True)
class ListenerSpec:
    """One listener: where to bind, what to speak and what address to give clients.

    ``advertised_defaulted`` is true when no advertised entry named this listener, so
    the advertised address was copied from the bind address (and follows the real port
    in :meth:`with_bound_port`).
    """

    name: str
    protocol: SecurityProtocol
    host: str
    port: int
    advertised_host: str
    advertised_port: int
    advertised_defaulted: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            raise ListenerConfigError("listener name must not be empty")
        for label, port in (("port", self.port), ("advertised port", self.advertised_port)):
            if not 0 <= port <= _MAX_PORT:
                raise ListenerConfigError(
                    f"listener {self.name!r}: {label} {port} is out of range 0-{_MAX_PORT}"
                )

    def with_bound_port(self, port: int) -> ListenerSpec:
        """A copy bound to ``port``; a defaulted advertised port follows it."""
        advertised_port = port if self.advertised_defaulted else self.advertised_port
        return dataclasses.replace(self, port=port, advertised_port=advertised_port)

    @property
    def bind_address(self) -> str:
        """``host:port`` to bind, with IPv6 hosts in brackets."""
        return format_host_port(self.host, self.port)

    @property
    def advertised_address(self) -> str:
        """``host:port`` given to clients, with IPv6 hosts in brackets."""
        return format_host_port(self.advertised_host, self.advertised_port)


def format_host_port(host: str, port: int) -> str:
    """``host:port``, putting an IPv6 literal host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class _Entry:
    """One ``NAME://host:port`` entry as written, after syntax checks."""

    text: str
    scheme: str
    host: str
    port: int


def _split_entries(value: str, what: str, source: Source) -> list[str]:
    """The comma-separated, stripped entries of ``value``; [] for a blank value."""
    if not value.strip():
        return []
    entries = [part.strip() for part in value.split(",")]
    if "" in entries:
        raise ListenerConfigError(f"empty entry in {what} {value!r}", source)
    return entries


def _parse_host(host_text: str, entry: str, source: Source) -> str:
    """The host of ``entry`` without brackets, checked; '' stays '' here."""
    if host_text.startswith("["):
        literal = host_text[1:-1]
        try:
            return str(ipaddress.IPv6Address(literal))
        except ValueError:
            raise ListenerConfigError(
                f"listener {entry!r}: {literal!r} is not an IPv6 address", source
            ) from None
    if ":" in host_text:
        raise ListenerConfigError(
            f"listener {entry!r}: an IPv6 host must be written in brackets, e.g. [::1]:9092",
            source,
        )
    if host_text and not _HOSTNAME_RE.fullmatch(host_text):
        raise ListenerConfigError(f"listener {entry!r}: invalid host {host_text!r}", source)
    return host_text


def _parse_entry(entry: str, source: Source) -> _Entry:
    """Check the syntax of one ``NAME://host:port`` entry."""
    scheme, sep, address = entry.partition("://")
    if not sep:
        raise ListenerConfigError(
            f"listener {entry!r}: expected NAME://host:port", source
        )
    if not _NAME_RE.fullmatch(scheme):
        raise ListenerConfigError(
            f"listener {entry!r}: invalid listener name {scheme!r}"
            " (letters, digits, '_' and '-' only)",
            source,
        )
    if address.startswith("["):
        close = address.find("]")
        if close < 0:
            raise ListenerConfigError(f"listener {entry!r}: unclosed '[' in host", source)
        host_text, port_part = address[: close + 1], address[close + 1 :]
        if not port_part.startswith(":"):
            raise ListenerConfigError(f"listener {entry!r}: missing ':port'", source)
        port_text = port_part[1:]
    else:
        host_text, colon, port_text = address.rpartition(":")
        if not colon:
            raise ListenerConfigError(f"listener {entry!r}: missing ':port'", source)
    if not _PORT_RE.fullmatch(port_text):
        raise ListenerConfigError(f"listener {entry!r}: invalid port {port_text!r}", source)
    port = int(port_text)
    if port > _MAX_PORT:
        raise ListenerConfigError(
            f"listener {entry!r}: port {port} is out of range 0-{_MAX_PORT}", source
        )
    host = _parse_host(host_text, entry, source)
    return _Entry(text=entry, scheme=scheme.upper(), host=host, port=port)


def parse_protocol_map(protocol_map: str) -> dict[str, SecurityProtocol]:
    """Parse ``NAME:PROTOCOL,...`` into upper-case listener names and protocols."""
    result: dict[str, SecurityProtocol] = {}
    for item in _split_entries(protocol_map, "protocol map", "protocol_map"):
        name, sep, protocol_text = (part.strip() for part in item.partition(":"))
        if not sep or not name or ":" in protocol_text:
            raise ListenerConfigError(
                f"protocol map entry {item!r}: expected NAME:PROTOCOL", "protocol_map"
            )
        if not _NAME_RE.fullmatch(name):
            raise ListenerConfigError(
                f"protocol map entry {item!r}: invalid listener name {name!r}", "protocol_map"
            )
        protocol = SecurityProtocol.from_name(protocol_text)
        if protocol is None:
            raise ListenerConfigError(
                f"protocol map entry {item!r}: unknown security protocol {protocol_text!r}"
                f" (expected one of {_protocol_names()})",
                "protocol_map",
            )
        key = name.upper()
        if key in result:
            raise ListenerConfigError(
                f"protocol map entry {item!r}: listener name {key!r} is mapped twice",
                "protocol_map",
            )
        result[key] = protocol
    return result


def _protocol_names() -> str:
    return ", ".join(SecurityProtocol.__members__)


def _resolve_protocol(
    entry: _Entry, protocols: dict[str, SecurityProtocol], source: Source
) -> SecurityProtocol:
    """The security protocol of a listener entry, from the map or from its scheme."""
    if protocols:
        found = protocols.get(entry.scheme)
        if found is None:
            raise ListenerConfigError(
                f"listener {entry.text!r}: listener name {entry.scheme!r}"
                " is not in the protocol map",
                source,
            )
        return found
    protocol = SecurityProtocol.from_name(entry.scheme)
    if protocol is None:
        raise ListenerConfigError(
            f"listener {entry.text!r}: {entry.scheme!r} is not a security protocol"
            f" (expected one of {_protocol_names()}, or set a protocol map)",
            source,
        )
    return protocol


def _parse_entries(
    value: str, protocols: dict[str, SecurityProtocol], source: Source
) -> dict[str, tuple[_Entry, SecurityProtocol]]:
    """Entries of one listener list keyed by name, each with its protocol."""
    what = "listeners" if source == "listeners" else "advertised listeners"
    result: dict[str, tuple[_Entry, SecurityProtocol]] = {}
    for text in _split_entries(value, what, source):
        entry = _parse_entry(text, source)
        protocol = _resolve_protocol(entry, protocols, source)
        if entry.scheme in result:
            raise ListenerConfigError(
                f"listener {text!r}: duplicate listener name {entry.scheme!r} in {what}",
                source,
            )
        result[entry.scheme] = (entry, protocol)
    return result


def _check_ports(specs: Sequence[ListenerSpec]) -> None:
    """Reject two listeners that would bind the same address."""
    for index, first in enumerate(specs):
        for second in specs[index + 1 :]:
            if first.port == 0 or first.port != second.port:
                continue
            if first.host == second.host or is_wildcard(first.host) \
                    or is_wildcard(second.host):
                raise ListenerConfigError(
                    f"listeners {first.name!r} and {second.name!r} both bind"
                    f" {first.bind_address} / {second.bind_address}"
                )


def _check_routable(entry: _Entry) -> None:
    """Refuse an advertised entry whose host is empty or a wildcard: every client told it
    would connect to itself."""
    if not entry.host:
        raise ListenerConfigError(
            f"listener {entry.text!r}: an advertised listener needs a host (an empty host"
            f" means every interface, {ALL_INTERFACES}, which clients cannot connect to);"
            " give a host name or IP address that clients can reach",
            "advertised",
        )
    if is_wildcard(entry.host):
        raise ListenerConfigError(
            f"listener {entry.text!r}: advertised listeners cannot use the nonroutable"
            f" meta-address {entry.host} (every interface), which clients cannot connect to;"
            " give a host name or IP address that clients can reach",
            "advertised",
        )


def _default_advertised_host(entry: _Entry, host: str) -> str:
    """What a listener without an advertised entry advertises: its bind host, or this
    host's name when it binds every interface."""
    if not is_wildcard(host):
        return host
    name = machine_host_name()
    if name is None:
        raise ListenerConfigError(
            f"listener {entry.text!r} binds every interface and has no advertised address,"
            " and this host's name only reaches this machine (localhost): set an advertised"
            f" address for {entry.scheme}",
            "advertised",
        )
    return name


def parse_listeners(listeners: str, protocol_map: str, advertised: str) -> list[ListenerSpec]:
    """Parse and cross-check the listener settings; see the module docstring for rules.

    Returns one spec per listener, in the order written.  Raises
    :class:`ListenerConfigError` on any mistake.
    """
    protocols = parse_protocol_map(protocol_map)
    bound = _parse_entries(listeners, protocols, "listeners")
    if not bound:
        raise ListenerConfigError("no listeners configured")
    published = _parse_entries(advertised, protocols, "advertised")
    for name, (adv_entry, _) in published.items():
        if name not in bound:
            raise ListenerConfigError(
                f"listener {adv_entry.text!r}: advertised listener {name!r}"
                " has no listener of that name",
                "advertised",
            )
    specs: list[ListenerSpec] = []
    for name, (entry, protocol) in bound.items():
        host = entry.host or ALL_INTERFACES
        advert = published.get(name)
        if advert is None:
            shown = _default_advertised_host(entry, host)
            specs.append(
                ListenerSpec(name, protocol, host, entry.port, shown, entry.port, True)
            )
            continue
        adv_entry = advert[0]
        _check_routable(adv_entry)
        if adv_entry.port == 0:
            raise ListenerConfigError(
                f"listener {adv_entry.text!r}: an advertised listener needs a non-zero port",
                "advertised",
            )
        specs.append(
            ListenerSpec(name, protocol, host, entry.port, adv_entry.host, adv_entry.port)
        )
    _check_ports(specs)
    return specs


def select_advertised(specs: Sequence[ListenerSpec], listener_name: str | None) -> ListenerSpec:
    """The spec named ``listener_name`` (case-insensitive), else the first one.

    This is the address given to a client that connected through ``listener_name``.
    """
    if not specs:
        raise ListenerConfigError("no listeners configured")
    if listener_name is not None:
        wanted = listener_name.upper()
        for spec in specs:
            if spec.name == wanted:
                return spec
    return specs[0]
