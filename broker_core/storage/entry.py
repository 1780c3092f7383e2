"""The ledger entry header: broker entry metadata written in front of each record batch.

On disk an entry is (big-endian)::

    magic int8 (=1) | index int64 | broker_timestamp int64 | batch_length int32 |
    header_crc uint32 | batch bytes

``index`` is the batch's base offset, ``broker_timestamp`` the wall-clock ms at which the
broker appended it, and ``header_crc`` the CRC32C of the 21 bytes before it (so that a
torn or zero-filled header is recognised).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c

ENTRY_MAGIC = 1
_PREFIX = struct.Struct(">bqqi")
_CRC = struct.Struct(">I")
_HEADER = struct.Struct(">bqqiI")
ENTRY_HEADER_STRUCT = _HEADER
"""The whole header as one struct: (magic, index, broker_timestamp, batch_length, crc)."""
ENTRY_HEADER_SIZE = _HEADER.size
"""Bytes of entry header in front of every batch (25)."""


@dataclass(frozen=True, slots=True)
class EntryHeader:
    """A decoded entry header."""

    index: int
    broker_timestamp: int
    batch_length: int


def encode_entry_header(index: int, broker_timestamp: int, batch_length: int) -> bytes:
    """Encode an entry header (with its CRC)."""
    prefix = _PREFIX.pack(ENTRY_MAGIC, index, broker_timestamp, batch_length)
    return prefix + _CRC.pack(crc32c.crc32c(prefix))


def decode_entry_header(buf: bytes | bytearray | memoryview, at: int = 0) -> EntryHeader | None:
    """Decode the header at ``buf[at:]``; None if it is short, has a bad magic, CRC or length."""
    if len(buf) - at < ENTRY_HEADER_SIZE:
        return None
    magic, index, broker_ts, length, crc = _HEADER.unpack_from(buf, at)
    if magic != ENTRY_MAGIC or length < 0:
        return None
    if crc != crc32c.crc32c(memoryview(buf)[at : at + _PREFIX.size]):
        return None
    return EntryHeader(index, broker_ts, length)
