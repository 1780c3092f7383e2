"""Field positions of the Kafka v2 record batch header, and the few checks storage needs.

The storage layer treats a record batch as opaque bytes except for these fields: it
patches the base offset and reads the length, magic, CRC, last offset delta and max
timestamp.
"""

from __future__ import annotations

import struct

import crc32c

BATCH_HEADER_SIZE = 61
"""Size of the v2 record batch header."""
BATCH_LENGTH_OVERHEAD = 12
"""Bytes before the batchLength field's span: baseOffset (8) + batchLength (4)."""

BASE_OFFSET_AT = 0
BATCH_LENGTH_AT = 8
MAGIC_AT = 16
CRC_AT = 17
ATTRIBUTES_AT = 21
LAST_OFFSET_DELTA_AT = 23
MAX_TIMESTAMP_AT = 35

RECORD_BATCH_MAGIC = 2

HEAD_FIELDS = struct.Struct(">qi4xbIhi")
"""The first 27 bytes in one unpack: baseOffset, batchLength, magic, crc, attributes,
lastOffsetDelta (for loops over many batches)."""

_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")


def set_base_offset(batch: bytearray, base_offset: int) -> None:
    """Write ``base_offset`` into bytes 0..8 (outside the CRC)."""
    _INT64.pack_into(batch, BASE_OFFSET_AT, base_offset)


def base_offset(buf: bytes | bytearray | memoryview, at: int = 0) -> int:
    """The baseOffset field of the batch starting at ``at``."""
    value: int = _INT64.unpack_from(buf, at + BASE_OFFSET_AT)[0]
    return value


def last_offset_delta(buf: bytes | bytearray | memoryview, at: int = 0) -> int:
    """The lastOffsetDelta field of the batch starting at ``at``."""
    value: int = _INT32.unpack_from(buf, at + LAST_OFFSET_DELTA_AT)[0]
    return value


def max_timestamp(buf: bytes | bytearray | memoryview, at: int = 0) -> int:
    """The maxTimestamp field of the batch starting at ``at``."""
    value: int = _INT64.unpack_from(buf, at + MAX_TIMESTAMP_AT)[0]
    return value


def shape_problem(batch: bytes | bytearray | memoryview) -> str | None:
    """Why ``batch`` is not a well-formed v2 batch (length field and magic), else None."""
    if len(batch) < BATCH_HEADER_SIZE:
        return f"batch of {len(batch)} bytes is shorter than the {BATCH_HEADER_SIZE}-byte header"
    length: int = _INT32.unpack_from(batch, BATCH_LENGTH_AT)[0]
    if length + BATCH_LENGTH_OVERHEAD != len(batch):
        return f"batchLength {length} does not match the {len(batch)} bytes given"
    if batch[MAGIC_AT] != RECORD_BATCH_MAGIC:
        return f"record batch magic {batch[MAGIC_AT]} is not {RECORD_BATCH_MAGIC}"
    return None


def check_append(batch: bytes | bytearray | memoryview, delta: int) -> None:
    """ValueError unless ``batch`` is well formed and ``delta`` is its lastOffsetDelta
    (what every engine checks before it stores a batch)."""
    problem = shape_problem(batch)
    if problem is not None:
        raise ValueError(problem)
    if delta < 0 or delta != last_offset_delta(batch):
        raise ValueError(
            f"last_offset_delta {delta} does not match the batch header "
            f"({last_offset_delta(batch)})"
        )


def crc_matches(batch: bytes | bytearray | memoryview) -> bool:
    """Whether the stored CRC32C equals the CRC32C of bytes 21..end."""
    stored: int = _UINT32.unpack_from(batch, CRC_AT)[0]
    view = memoryview(batch)
    return stored == crc32c.crc32c(view[ATTRIBUTES_AT:])
