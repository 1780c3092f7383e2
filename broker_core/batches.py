"""The v2 record batch header: what produce validates without decoding a single record.

A batch stays opaque on the hot path: the 61-byte header is read, the CRC32C checked
(the ``crc32c`` package releases the GIL), and the base offset is patched by the log.
Only features that truly need records (timestamp lookups) decode them, through
``kafka.record``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c

from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.storage.batch_header import (
    ATTRIBUTES_AT,
    BATCH_HEADER_SIZE,
    CRC_AT,
    MAX_TIMESTAMP_AT,
    crc_matches,
)

MIN_RECORD_SIZE = 7
"""The smallest v2 record: a 1-byte length, then attributes, timestamp delta, offset delta,
key length, value length and header count of one byte each."""
_HEADER = struct.Struct(">qiiBIhiqqqhii")
_ATTR_COMPRESSION_MASK = 0x07
_ATTR_TIMESTAMP_TYPE = 0x08
_ATTR_TRANSACTIONAL = 0x10
_ATTR_CONTROL = 0x20


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The fields of a v2 record batch header that the broker acts on."""

    batch_length: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def compression(self) -> int:
        """The compression codec id: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd."""
        return self.attributes & _ATTR_COMPRESSION_MASK

    @property
    def log_append_time(self) -> bool:
        """True when the broker stamped the batch (its records all carry max_timestamp)."""
        return bool(self.attributes & _ATTR_TIMESTAMP_TYPE)

    @property
    def is_control(self) -> bool:
        """True for transaction marker batches."""
        return bool(self.attributes & _ATTR_CONTROL)

    @property
    def is_transactional(self) -> bool:
        """True for batches written inside a transaction."""
        return bool(self.attributes & _ATTR_TRANSACTIONAL)


def read_header(buf: bytes | bytearray | memoryview) -> BatchHeader:
    """Unpack the batch header at the start of ``buf`` (which must hold 61 bytes)."""
    fields = _HEADER.unpack_from(buf, 0)
    # skip baseOffset (patched by the log) and partitionLeaderEpoch
    return BatchHeader(fields[1], *fields[3:])


def validate_produced(records: bytes | bytearray | memoryview) -> BatchHeader:
    """Check that ``records`` is exactly one well-formed v2 batch a client may produce.

    Raises :class:`KafkaApiError` with the code a Kafka broker gives for the defect.
    """
    size = len(records)
    if size < BATCH_HEADER_SIZE:
        raise KafkaApiError(
            ErrorCode.CORRUPT_MESSAGE, f"record set of {size} bytes is shorter than a batch header"
        )
    header = read_header(records)
    if header.magic != 2:
        raise KafkaApiError(
            ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT,
            f"record batch magic {header.magic} is not supported (only v2)",
        )
    if header.batch_length + 12 != size:
        raise KafkaApiError(
            ErrorCode.INVALID_RECORD,
            "a produce request must carry exactly one record batch per partition",
        )
    if not crc_matches(records):
        raise KafkaApiError(ErrorCode.CORRUPT_MESSAGE, "record batch CRC32C does not match")
    if header.compression > 4:
        raise KafkaApiError(
            ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
            f"unknown compression codec {header.compression}",
        )
    if header.is_control:
        raise KafkaApiError(ErrorCode.INVALID_RECORD, "clients may not produce control batches")
    if header.record_count < 1 or header.last_offset_delta != header.record_count - 1:
        raise KafkaApiError(
            ErrorCode.INVALID_RECORD,
            f"batch of {header.record_count} records declares last offset delta "
            f"{header.last_offset_delta}",
        )
    if header.compression == 0 and header.record_count * MIN_RECORD_SIZE > size - BATCH_HEADER_SIZE:
        # O(1), records unread: a header may not claim more records than the bytes can
        # hold, or one small batch could take up billions of offsets
        raise KafkaApiError(
            ErrorCode.INVALID_RECORD,
            f"batch claims {header.record_count} records in {size - BATCH_HEADER_SIZE} bytes",
        )
    return header


def stamp_log_append_time(batch: bytearray, now_ms: int) -> None:
    """Mark ``batch`` as LogAppendTime with ``now_ms`` as its max timestamp; recompute its CRC."""
    (attributes,) = struct.unpack_from(">h", batch, ATTRIBUTES_AT)
    struct.pack_into(">h", batch, ATTRIBUTES_AT, attributes | _ATTR_TIMESTAMP_TYPE)
    struct.pack_into(">q", batch, MAX_TIMESTAMP_AT, now_ms)
    struct.pack_into(">I", batch, CRC_AT, crc32c.crc32c(memoryview(batch)[ATTRIBUTES_AT:]))
