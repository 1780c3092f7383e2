"""The PROXY protocol, version 2 (HAProxy's binary header), as a proxy such as Envoy puts
it before a connection's first byte to say whom it carries: sans I/O, bytes in, a verdict
out.

Only what a TCP proxy in front of Kafka sends is taken: the 12-byte signature, version 2,
the LOCAL command (the proxy's own connection, e.g. a health check: the socket's address
stands) or PROXY over TCP (``AF_INET``/``AF_INET6`` with ``STREAM``), whose source address
is the client's. TLVs after the addresses (Envoy may send some) are skipped within the
declared length; the whole header is at most :data:`MAX_HEADER_BYTES`. Anything else (the
text header of version 1, UDP, UNIX sockets, a wrong signature or version, garbage, a
longer header) is :class:`ProxyHeaderError`, found as soon as the bytes read show it.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from listeners.hosts import unmapped

__all__ = ["MAX_HEADER_BYTES", "SIGNATURE", "ProxyHeader", "ProxyHeaderError",
           "parse_header"]

SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
"""The 12 bytes every version 2 header starts with."""

_FIXED = 16
"""Signature, version and command, family and transport, length of the rest."""

MAX_HEADER_BYTES = 512
"""The longest header taken: the 16 fixed bytes, 36 of IPv6 addresses and room for the
TLVs a proxy adds (Envoy's are a few dozen bytes)."""

_LOCAL, _PROXY = 0x20, 0x21
_TCP4, _TCP6 = 0x11, 0x21
_ADDRESS_BYTES = {_TCP4: 12, _TCP6: 36}


class ProxyHeaderError(ValueError):
    """Bytes that are no PROXY protocol v2 header this listener takes (the message says why,
    for a log line)."""


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """A whole header: its ``length`` in bytes (what follows is the client's stream) and
    the client's ``source`` as ``host:port`` (None: LOCAL, the proxy's own connection)."""

    length: int
    source: str | None


def parse_header(data: bytes | bytearray | memoryview) -> ProxyHeader | None:
    """The header at the start of ``data``; None while more bytes are needed;
    ProxyHeaderError as soon as the bytes read cannot start a header taken here."""
    view = memoryview(data)
    prefix = bytes(view[:len(SIGNATURE)])
    if not SIGNATURE.startswith(prefix):
        raise ProxyHeaderError("no PROXY protocol v2 signature")
    if len(view) < _FIXED:
        return None
    command, family = view[12], view[13]
    if command >> 4 != 2:
        raise ProxyHeaderError(f"PROXY protocol version {command >> 4} (only 2 is taken)")
    if command not in (_LOCAL, _PROXY):
        raise ProxyHeaderError(f"unknown PROXY protocol command {command & 0xF}")
    length = _FIXED + int.from_bytes(view[14:16], "big")
    if length > MAX_HEADER_BYTES:
        raise ProxyHeaderError(f"PROXY protocol header of {length} bytes (at most "
                               f"{MAX_HEADER_BYTES} taken)")
    if command == _PROXY:
        needed = _ADDRESS_BYTES.get(family)
        if needed is None:
            raise ProxyHeaderError(f"PROXY protocol address family and transport "
                                   f"0x{family:02x} (only TCP over IPv4 or IPv6 is taken)")
        if length < _FIXED + needed:
            raise ProxyHeaderError(f"PROXY protocol address block of {length - _FIXED} "
                                   f"bytes is too short for its addresses")
    if len(view) < length:
        return None
    if command == _LOCAL:
        return ProxyHeader(length, None)
    return ProxyHeader(length, _source(view[_FIXED:], family))


def _source(block: memoryview, family: int) -> str:
    """``host:port`` of the source in an address block (an IPv4-mapped IPv6 address by its
    IPv4 spelling, as the listeners show a dual-stack socket's peer)."""
    size = 4 if family == _TCP4 else 16
    host = str(ipaddress.ip_address(bytes(block[:size])))
    port = int.from_bytes(block[2 * size:2 * size + 2], "big")
    return f"{unmapped(host)}:{port}"
