"""Varints: the protocol's unsigned ones (compact lengths, tagged fields) and the zigzag
signed ones of record fields.

Readers say where they stopped. :func:`read_uvarint` reads a request (a truncated or
overlong varint is a :class:`ProtocolError`); :func:`read_varint` and
:func:`read_varint32` read records (an overlong varint is a :class:`MalformedBatch`; one
cut short raises IndexError, which the record walkers turn into MalformedBatch with the
record's place). Kafka reads a record's timestamp delta as a 64-bit varint (at most 10
bytes) and its other varints (length, offset delta, key, value and header lengths, header
count) as 32-bit ones (at most 5 bytes: the Java client refuses a longer one, "Varint is too
long"); :func:`read_varint32` also refuses a 5th byte whose bits do not fit 32 bits, which
Kafka's reader would drop.
"""

from __future__ import annotations

from broker_core.codec.errors import MalformedBatch, ProtocolError

Buffer = bytes | bytearray | memoryview
"""Any buffer a batch or a request may be held in."""


def read_uvarint(buf: memoryview, pos: int) -> tuple[int, int]:
    """Decode an unsigned varint at ``pos``; return ``(value, new_pos)``."""
    value = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise ProtocolError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise ProtocolError("varint too long")


def read_varint(buf: Buffer, pos: int) -> tuple[int, int]:
    """The zigzag varint at ``pos`` and the position after it."""
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise MalformedBatch("a varint runs over 10 bytes")


def read_varint32(buf: Buffer, pos: int) -> tuple[int, int]:
    """The 32-bit zigzag varint at ``pos`` (at most 5 bytes, its value within 32 bits) and
    the position after it."""
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            if shift == 28 and byte > 0x0F:
                raise MalformedBatch("a 32-bit varint holds more than 32 bits")
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 28:
            raise MalformedBatch("a 32-bit varint runs over 5 bytes")


def uvarint(value: int) -> bytes:
    """Encode an unsigned varint (the protocol's compact lengths, and records' zigzag)."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def zigzag_varint(value: int) -> bytes:
    """Encode a signed varint the way record fields are (zigzag, then unsigned)."""
    return uvarint((value << 1) ^ (value >> 63))
