"""PROXY protocol v2 headers as a proxy (Envoy) writes them, for tests of the listeners
that take them (:mod:`listeners.proxy_protocol`)."""

from __future__ import annotations

import ipaddress

from listeners.proxy_protocol import SIGNATURE


def v2_header(source: tuple[str, int] | None, destination: tuple[str, int] = ("10.0.0.9", 9092),
              tlvs: bytes = b"", family: int | None = None, version: int = 2) -> bytes:
    """A header carrying ``source`` (None: LOCAL, the proxy's own connection) and the TLVs
    given; ``family`` overrides the family and transport byte."""
    if source is None:
        return SIGNATURE + bytes([version << 4 | 0, family or 0]) + \
            len(tlvs).to_bytes(2, "big") + tlvs
    src, dst = ipaddress.ip_address(source[0]), ipaddress.ip_address(destination[0])
    block = src.packed + dst.packed + source[1].to_bytes(2, "big") + \
        destination[1].to_bytes(2, "big") + tlvs
    byte = family if family is not None else (0x11 if src.version == 4 else 0x21)
    return SIGNATURE + bytes([version << 4 | 1, byte]) + len(block).to_bytes(2, "big") + block


def tlv(kind: int, value: bytes) -> bytes:
    """One type-length-value entry."""
    return bytes([kind]) + len(value).to_bytes(2, "big") + value
