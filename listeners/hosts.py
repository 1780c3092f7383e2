"""Which listener hosts are wildcards, how an IPv6 one binds, and the name a wildcard
listener advertises.

A *wildcard* (the unspecified address: IPv4 ``0.0.0.0``, IPv6 ``::``) is fine to bind
(every interface) and meaningless to connect to: a client told it connects to itself.
:func:`is_wildcard` knows every spelling (``0:0:0:0:0:0:0:0``, ``::ffff:0.0.0.0``, and the
IPv4 shorthands ``0`` or ``0x0`` that the resolver reads as ``0.0.0.0``).

An IPv6 wildcard (``[::]``) binds one dual-stack socket (:func:`dual_stack_socket`), as
Kafka's (Java's) does: it accepts IPv4 clients too, whose IPv4-mapped addresses
(``::ffff:10.0.0.5``) :func:`unmapped` turns back into IPv4 (as Java does), so that ACL
hosts, quotas by IP and logs see the same address on either kind of socket.  asyncio
would bind it IPv6-only (it sets ``IPV6_V6ONLY``), and :mod:`listeners.spec` refuses
``0.0.0.0`` and ``[::]`` on one port, so IPv4 clients could not be served on that port at
all.  Any other host is bound by asyncio as it is; ``[::1]`` is IPv6 only.

A listener bound to a wildcard without an advertised address of its own advertises
:func:`machine_host_name`: as Kafka does (``InetAddress.getLocalHost()
.getCanonicalHostName()``), the host's fully qualified name (:func:`socket.getfqdn`),
unless that is a loopback name (a hosts file mapping the host's name to ``127.0.0.1``
gives ``localhost``, which only local clients can use), then the host's own name
(:func:`socket.gethostname`).
"""

from __future__ import annotations

import functools
import ipaddress
import re
import socket
from collections.abc import Iterable

__all__ = ["dual_stack_socket", "is_loopback", "is_wildcard", "machine_host_name",
           "routable_name", "unmapped"]

_IPV4_SHORTHAND_RE = re.compile(r"[0-9A-Fa-fXx.]+")
_NAME_RE = re.compile(r"[A-Za-z0-9._-]+")


def is_wildcard(host: str) -> bool:
    """Whether ``host`` (without brackets) is the unspecified address, in any spelling."""
    if ":" in host:
        try:
            address = ipaddress.IPv6Address(host)
        except ValueError:
            return False
        mapped = address.ipv4_mapped
        return address.is_unspecified or (mapped is not None and mapped.is_unspecified)
    if not _IPV4_SHORTHAND_RE.fullmatch(host):
        return False
    try:
        return socket.inet_aton(host) == bytes(4)
    except OSError:  # a host name made of hex letters ("cafe", "dead.beef")
        return False


def is_loopback(name: str) -> bool:
    """Whether ``name`` only ever means this machine (``localhost``, ``127.x``, ``::1``)."""
    lowered = name.lower().rstrip(".")
    if lowered == "localhost" or lowered.endswith(".localhost") \
            or lowered.startswith("localhost."):
        return True
    try:
        return ipaddress.ip_address(lowered).is_loopback
    except ValueError:
        return False


def routable_name(candidates: Iterable[str]) -> str | None:
    """The first of ``candidates`` that another machine could use to reach this one: a
    valid host name that is neither a loopback name nor a wildcard; None if none is."""
    for name in candidates:
        if name and _NAME_RE.fullmatch(name) and not is_loopback(name) \
                and not is_wildcard(name):
            return name
    return None


@functools.cache
def machine_host_name() -> str | None:
    """This host's name as a wildcard listener advertises it (see the module docstring),
    looked up once; None if both names are loopback names."""
    return routable_name((socket.getfqdn(), socket.gethostname()))


def dual_stack_socket(host: str, port: int, backlog: int) -> socket.socket | None:
    """A listening socket on ``[::]:port`` that takes IPv4 clients too, when ``host`` is
    the IPv6 wildcard and the system can do that; None otherwise (bind ``host`` as it is).
    Raises OSError when the port cannot be bound."""
    if ":" not in host or not is_wildcard(host) or not socket.has_dualstack_ipv6():
        return None
    return socket.create_server(("::", port), family=socket.AF_INET6, backlog=backlog,
                                dualstack_ipv6=True)


def unmapped(address: str) -> str:
    """A peer's address as the client's host: an IPv4-mapped IPv6 address (a client of a
    dual-stack socket) as its IPv4 address, any other as it is."""
    if not address.lower().startswith("::ffff:"):
        return address
    try:
        mapped = ipaddress.IPv6Address(address).ipv4_mapped
    except ValueError:
        return address
    return address if mapped is None else str(mapped)
