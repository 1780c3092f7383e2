"""The PROXY protocol v2 parser (:mod:`listeners.proxy_protocol`): what Envoy sends is read,
everything else refused as soon as the bytes show it."""

from __future__ import annotations

import pytest

from listeners.proxy_protocol import (
    MAX_HEADER_BYTES,
    SIGNATURE,
    ProxyHeader,
    ProxyHeaderError,
    parse_header,
)
from tests.proxy_headers import tlv, v2_header


def test_an_ipv4_header_names_its_source_and_ends_where_it_says() -> None:
    header = v2_header(("203.0.113.7", 51234))
    assert parse_header(header + b"\x00\x00\x00\x10rest") == ProxyHeader(28, "203.0.113.7:51234")


def test_an_ipv6_header_names_its_source() -> None:
    header = v2_header(("2001:db8::7", 443), ("2001:db8::1", 9092))
    assert parse_header(header) == ProxyHeader(52, "2001:db8::7:443")


def test_an_ipv4_mapped_source_is_shown_as_ipv4() -> None:
    header = v2_header(("::ffff:198.51.100.4", 40000), ("::1", 9092))
    assert parse_header(header) == ProxyHeader(52, "198.51.100.4:40000")


def test_local_keeps_the_sockets_address() -> None:
    assert parse_header(v2_header(None)) == ProxyHeader(16, None)
    with_tlv = v2_header(None, tlvs=tlv(0x04, b""))  # Envoy's health checks: NOOP TLV
    assert parse_header(with_tlv + b"kafka") == ProxyHeader(19, None)


def test_tlvs_after_the_addresses_are_skipped() -> None:
    tlvs = tlv(0x01, b"kafka") + tlv(0x02, b"broker-1.example") + tlv(0xE0, bytes(200))
    header = v2_header(("192.0.2.1", 1000), tlvs=tlvs)
    parsed = parse_header(header + b"\x00\x00\x00\x0a")
    assert parsed == ProxyHeader(len(header), "192.0.2.1:1000")


@pytest.mark.parametrize("cut", [0, 1, 11, 12, 15, 16, 27])
def test_a_truncated_header_waits_for_more(cut: int) -> None:
    assert parse_header(v2_header(("192.0.2.1", 1000))[:cut]) is None


@pytest.mark.parametrize(("data", "why"), [
    (b"PROXY TCP4 192.0.2.1 192.0.2.2 1000 9092\r\n", "signature"),  # version 1
    (b"\x00\x00\x00\x0a\x00\x12\x00\x03", "signature"),  # a Kafka frame
    (b"\x16\x03\x01\x02\x00", "signature"),  # a ClientHello
    (SIGNATURE[:5] + b"X", "signature"),
    (v2_header(("192.0.2.1", 1000), version=1), "version 1"),
    (v2_header(("192.0.2.1", 1000), version=3), "version 3"),
    (SIGNATURE + b"\x22\x11\x00\x0c" + bytes(12), "command 2"),
    (v2_header(("192.0.2.1", 1000), family=0x12), "0x12"),  # UDP over IPv4
    (v2_header(("2001:db8::1", 1000), ("2001:db8::2", 1), family=0x22), "0x22"),  # UDP
    (SIGNATURE + b"\x21\x31\x00\xd8" + bytes(216), "0x31"),  # UNIX stream
    (SIGNATURE + b"\x21\x00\x00\x00", "0x00"),  # PROXY with no address
    (SIGNATURE + b"\x21\x21\x00\x0c" + bytes(12), "too short"),  # IPv6 in 12 bytes
])
def test_what_is_no_header_taken_here_is_refused(data: bytes, why: str) -> None:
    with pytest.raises(ProxyHeaderError, match=why):
        parse_header(data)


def test_garbage_is_refused_at_its_first_wrong_byte() -> None:
    with pytest.raises(ProxyHeaderError):
        parse_header(b"G")


def test_an_oversize_header_is_refused_before_it_is_read() -> None:
    big = v2_header(("192.0.2.1", 1000), tlvs=tlv(0xE0, bytes(MAX_HEADER_BYTES)))
    with pytest.raises(ProxyHeaderError, match="at most 512"):
        parse_header(big[:16])
    largest = v2_header(("192.0.2.1", 1000), tlvs=tlv(0xE0, bytes(MAX_HEADER_BYTES - 31)))
    assert len(largest) == MAX_HEADER_BYTES
    assert parse_header(largest) == ProxyHeader(MAX_HEADER_BYTES, "192.0.2.1:1000")
