"""The v2 record batch header: its layout, reading it once, the checks a produced batch
passes without decoding a single record, and the few fields the broker writes.

A batch stays opaque on the hot path: the 61-byte header is read once into a
:class:`BatchHeader`, the CRC32C checked (the ``crc32c`` package releases the GIL), and
the header travels with the batch down to storage, which patches the base offset (outside
the CRC). Storage reads the fields of batches it stores (base offset, last offset delta,
max timestamp) with the accessors here.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace

import crc32c

from broker_core.codec.compression import MAX_INFLATED_BYTES
from broker_core.codec.varints import Buffer
from broker_core.errors import ErrorCode, KafkaApiError

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
BASE_TIMESTAMP_AT = 27
MAX_TIMESTAMP_AT = 35
RECORD_COUNT_AT = 57

RECORD_BATCH_MAGIC = 2
MIN_RECORD_SIZE = 7
"""The smallest v2 record: a 1-byte length, then attributes, timestamp delta, offset delta,
key length, value length and header count of one byte each."""
MAX_COMPRESSED_RECORDS = MAX_INFLATED_BYTES // MIN_RECORD_SIZE
"""The most records a compressed batch can hold: its payload inflates to at most
:data:`~broker_core.codec.compression.MAX_INFLATED_BYTES`."""

CODEC_BITS = 0x07
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20

HEADER = struct.Struct(">qiiBIhiqqqhii")
"""The whole header in one struct: baseOffset, batchLength, partitionLeaderEpoch, magic,
crc, attributes, lastOffsetDelta, baseTimestamp, maxTimestamp, producerId, producerEpoch,
baseSequence, recordCount."""

HEAD_FIELDS = struct.Struct(">qi4xbIhi")
"""The first 27 bytes in one unpack: baseOffset, batchLength, magic, crc, attributes,
lastOffsetDelta (for loops over many batches)."""

_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")
_UINT32 = struct.Struct(">I")


def set_base_offset(batch: bytearray, base_offset: int) -> None:
    """Write ``base_offset`` into bytes 0..8 (outside the CRC)."""
    _INT64.pack_into(batch, BASE_OFFSET_AT, base_offset)


BASE_OFFSET_END = BASE_OFFSET_AT + _INT64.size
"""Where the bytes after the baseOffset field begin."""


def base_offset_bytes(base_offset: int) -> bytes:
    """The baseOffset field holding ``base_offset``: written before a batch's bytes from
    ``BASE_OFFSET_END`` on, it stores the batch at that offset without copying it."""
    return _INT64.pack(base_offset)


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


def record_count(buf: bytes | bytearray | memoryview, at: int = 0) -> int:
    """The recordCount field of the batch starting at ``at``."""
    value: int = _INT32.unpack_from(buf, at + RECORD_COUNT_AT)[0]
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


def crc_matches(batch: bytes | bytearray | memoryview) -> bool:
    """Whether the stored CRC32C equals the CRC32C of bytes 21..end."""
    stored: int = _UINT32.unpack_from(batch, CRC_AT)[0]
    view = memoryview(batch)
    return stored == crc32c.crc32c(view[ATTRIBUTES_AT:])


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
        return self.attributes & CODEC_BITS

    @property
    def log_append_time(self) -> bool:
        """True when the broker stamped the batch (its records all carry max_timestamp)."""
        return bool(self.attributes & TIMESTAMP_TYPE_BIT)

    @property
    def is_control(self) -> bool:
        """True for transaction marker batches."""
        return bool(self.attributes & CONTROL_BIT)

    @property
    def is_transactional(self) -> bool:
        """True for batches written inside a transaction."""
        return bool(self.attributes & TRANSACTIONAL_BIT)


def read_header(buf: bytes | bytearray | memoryview) -> BatchHeader:
    """Unpack the batch header at the start of ``buf`` (which must hold 61 bytes)."""
    fields = HEADER.unpack_from(buf, 0)
    # skip baseOffset (patched by the log) and partitionLeaderEpoch
    return BatchHeader(fields[1], *fields[3:])


def marked_transactional(records: bytes | bytearray | memoryview | None) -> bool:
    """Whether ``records`` starts with a v2 batch marked transactional (its magic and
    attributes read, nothing else checked: as much as Kafka's ``hasTransactionalRecords``
    looks at)."""
    return records is not None and len(records) > ATTRIBUTES_AT + 1 and \
        records[MAGIC_AT] == RECORD_BATCH_MAGIC and \
        bool(records[ATTRIBUTES_AT + 1] & TRANSACTIONAL_BIT)


def transactional_header(records: bytes | bytearray | memoryview | None
                         ) -> BatchHeader | None:
    """The header of a batch :func:`marked_transactional` and long enough to hold one
    (nothing else checked), or None."""
    if records is None or len(records) < BATCH_HEADER_SIZE or \
            not marked_transactional(records):
        return None
    return read_header(records)


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
    magic = records[MAGIC_AT]
    if magic != RECORD_BATCH_MAGIC:
        # Kafka: a magic byte out of 0..2 (signed) is a corrupt record set, v0 and v1
        # batches are refused by ProduceRequest.validateRecords from Produce v3 on
        raise KafkaApiError(
            ErrorCode.INVALID_RECORD if magic < RECORD_BATCH_MAGIC else
            ErrorCode.CORRUPT_MESSAGE,
            f"record batch magic {magic if magic < 128 else magic - 256} is not supported "
            f"(only v{RECORD_BATCH_MAGIC})",
        )
    if header.batch_length + BATCH_LENGTH_OVERHEAD != size:
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
    if header.compression != 0 and header.record_count > MAX_COMPRESSED_RECORDS:
        # the same bound for a compressed batch (unchecked when validateRecords is off):
        # by the most its payload may inflate to
        raise KafkaApiError(
            ErrorCode.INVALID_RECORD,
            f"compressed batch claims {header.record_count} records, more than "
            f"{MAX_COMPRESSED_RECORDS} fit in the {MAX_INFLATED_BYTES} bytes it may "
            "inflate to",
        )
    if header.producer_id >= 0 and header.base_sequence < 0:
        # Kafka's LogValidator.validateBatch: an idempotent batch needs a sequence
        raise KafkaApiError(
            ErrorCode.INVALID_RECORD,
            f"invalid sequence number {header.base_sequence} in record batch with "
            f"producerId {header.producer_id}",
        )
    return header


def seal(batch: bytearray) -> int:
    """Write the CRC32C of bytes 21..end into the header (after any change to them);
    return it."""
    crc: int = crc32c.crc32c(memoryview(batch)[ATTRIBUTES_AT:])
    _UINT32.pack_into(batch, CRC_AT, crc)
    return crc


def stamp_log_append_time(batch: bytearray, header: BatchHeader, now_ms: int) -> BatchHeader:
    """Mark ``batch`` (whose header is ``header``) as LogAppendTime with ``now_ms`` as its
    max timestamp and seal it again; return its header as it now is."""
    attributes = header.attributes | TIMESTAMP_TYPE_BIT
    _INT16.pack_into(batch, ATTRIBUTES_AT, attributes)
    _INT64.pack_into(batch, MAX_TIMESTAMP_AT, now_ms)
    return replace(header, attributes=attributes, max_timestamp=now_ms, crc=seal(batch))


def same_batch(stored: Buffer, sent: Buffer) -> bool:
    """Whether ``sent`` (a batch as a producer sends it) is the batch ``stored``, compared
    from its attributes on: the base offset, length and leader epoch before them are set by
    the append. When ``stored`` was stamped LogAppendTime (``stamp_log_append_time``), its
    timestamp-type bit and max timestamp are the broker's and the rest is compared."""
    mine, theirs = memoryview(stored), memoryview(sent)
    if len(mine) != len(theirs) or len(mine) < BATCH_HEADER_SIZE:
        return False
    attributes = _INT16.unpack_from(mine, ATTRIBUTES_AT)[0]
    if not attributes & TIMESTAMP_TYPE_BIT:
        return mine[CRC_AT:] == theirs[CRC_AT:]
    sent_attributes = _INT16.unpack_from(theirs, ATTRIBUTES_AT)[0]
    between = slice(LAST_OFFSET_DELTA_AT, MAX_TIMESTAMP_AT)
    after = slice(MAX_TIMESTAMP_AT + _INT64.size, None)
    return (attributes == sent_attributes | TIMESTAMP_TYPE_BIT
            and mine[between] == theirs[between] and mine[after] == theirs[after])


def check_append(batch: bytes | bytearray | memoryview, header: BatchHeader) -> None:
    """ValueError unless ``header`` says ``batch`` is a well-formed v2 batch of its length
    with a lastOffsetDelta of 0 or more: what every engine checks before it stores a batch,
    from the header read once where the batch came in (its bytes are not read again)."""
    if len(batch) < BATCH_HEADER_SIZE:
        raise ValueError(f"batch of {len(batch)} bytes is shorter than the "
                         f"{BATCH_HEADER_SIZE}-byte header")
    if header.batch_length + BATCH_LENGTH_OVERHEAD != len(batch):
        raise ValueError(f"batchLength {header.batch_length} does not match the "
                         f"{len(batch)} bytes given")
    if header.magic != RECORD_BATCH_MAGIC:
        raise ValueError(f"record batch magic {header.magic} is not {RECORD_BATCH_MAGIC}")
    if header.last_offset_delta < 0:
        raise ValueError(f"last_offset_delta {header.last_offset_delta} is negative")
