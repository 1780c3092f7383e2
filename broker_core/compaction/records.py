"""A v2 batch's records as the log cleaner reads them, and the batches it writes back.

A cleaned batch keeps its base offset, lastOffsetDelta, producer id, epoch and base
sequence, codec and timestamp type, and each kept record keeps its bytes (so its offset
delta, hence its offset): only the record count, the payload, the length and the CRC
change. Offsets of removed records become gaps inside the batch, as in Kafka, and the
batch still covers its offsets; one left with no record is written uncompressed with no
payload, as Kafka writes one. KIP-534's *delete horizon* is written as Kafka writes it:
attribute bit 6 set and the base timestamp holding the horizon, with the records'
timestamp deltas rewritten against it. Whole runs of removed batches are covered by a
*filler*: an empty batch (no records, no producer) spanning their offsets, which clients
skip as they skip the empty batches Kafka's cleaner leaves.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from broker_core.codec.batch_header import (
    ATTRIBUTES_AT,
    BASE_TIMESTAMP_AT,
    BATCH_HEADER_SIZE,
    BATCH_LENGTH_AT,
    BATCH_LENGTH_OVERHEAD,
    CODEC_BITS,
    HEADER,
    RECORD_BATCH_MAGIC,
    RECORD_COUNT_AT,
    BatchHeader,
    seal,
)
from broker_core.codec.compression import deflate
from broker_core.codec.errors import MalformedBatch
from broker_core.codec.records import records_buffer
from broker_core.codec.varints import Buffer, read_varint, zigzag_varint

DELETE_HORIZON = 0x40
"""The attributes bit saying the base timestamp is the batch's delete horizon (KIP-534)."""
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_MAX_DELTA = 2**31 - 1


@dataclass(slots=True)
class Record:
    """One record of a batch: where it lies in the records' bytes and what the cleaner
    looks at (not frozen: a frozen dataclass is several times slower to build, and the
    cleaner builds one per record it reads)."""

    offset_delta: int
    timestamp_delta: int
    key: bytes | None
    tombstone: bool
    """Its value is null (a delete, for a compacted topic)."""
    start: int
    """Position of its length field."""
    attributes_at: int
    fields: int
    """Position just after its offset delta (the key's length)."""
    end: int


def read_records(batch: Buffer, header: BatchHeader) -> tuple[Buffer, list[Record]]:
    """The records' bytes (inflated when compressed) and the records in them;
    MalformedBatch when they do not parse."""
    buf, pos = records_buffer(batch, header.compression)
    out: list[Record] = []
    end = len(buf)
    try:
        while pos < end:
            start = pos
            length, pos = read_varint(buf, pos)
            stop, attributes_at = pos + length, pos
            pos += 1
            timestamp_delta, pos = read_varint(buf, pos)
            offset_delta, pos = read_varint(buf, pos)
            fields = pos
            key_length, pos = read_varint(buf, pos)
            key = bytes(buf[pos:pos + key_length]) if key_length >= 0 else None
            pos += max(key_length, 0)
            value_length, pos = read_varint(buf, pos)
            out.append(Record(offset_delta, timestamp_delta, key, value_length < 0, start,
                              attributes_at, fields, stop))
            pos = stop
    except IndexError as exc:
        raise MalformedBatch("a record runs past the end of the batch") from exc
    return buf, out


def delete_horizon(header: BatchHeader) -> int | None:
    """The batch's delete horizon (ms), or None when it has none yet."""
    return header.base_timestamp if header.attributes & DELETE_HORIZON else None


def rebuilt(batch: Buffer, header: BatchHeader, buf: Buffer, kept: list[Record],
            horizon: int | None) -> bytes:
    """``batch`` with only the ``kept`` records (in their order), and with ``horizon`` as
    its delete horizon when given (timestamp deltas then rewritten against it)."""
    view = memoryview(buf)
    parts: list[bytes | memoryview] = []
    for record in kept:
        if horizon is None:
            parts.append(view[record.start:record.end])
            continue
        timestamp = header.base_timestamp + record.timestamp_delta
        body = b"".join((view[record.attributes_at:record.attributes_at + 1],
                         zigzag_varint(timestamp - horizon), zigzag_varint(record.offset_delta),
                         view[record.fields:record.end]))
        parts += [zigzag_varint(len(body)), body]
    attributes = header.attributes | (DELETE_HORIZON if horizon is not None else 0)
    if kept:
        payload = deflate(header.compression, b"".join(parts))
    else:  # written as Kafka writes an empty batch: no codec, no payload (librdkafka
        payload = b""  # aborts on a compressed batch whose payload inflates to nothing)
        attributes &= ~CODEC_BITS
    out = bytearray(BATCH_HEADER_SIZE + len(payload))
    out[:BATCH_HEADER_SIZE] = memoryview(batch)[:BATCH_HEADER_SIZE]
    out[BATCH_HEADER_SIZE:] = payload
    _INT32.pack_into(out, BATCH_LENGTH_AT, len(out) - BATCH_LENGTH_OVERHEAD)
    _INT32.pack_into(out, RECORD_COUNT_AT, len(kept))
    _INT16.pack_into(out, ATTRIBUTES_AT, attributes)
    if horizon is not None:
        _INT64.pack_into(out, BASE_TIMESTAMP_AT, horizon)
    seal(out)
    return bytes(out)


def stamped(batch: Buffer, header: BatchHeader, horizon: int) -> bytes:
    """``batch`` (a control batch, kept whole) with ``horizon`` as its delete horizon."""
    buf, records = read_records(batch, header)
    return rebuilt(batch, header, buf, records, horizon)


def fillers(first: int, end: int) -> list[bytes]:
    """Empty batches covering offsets ``[first, end)`` (one per 2**31 offsets)."""
    out = []
    while first < end:
        delta = min(end - first, _MAX_DELTA + 1) - 1
        batch = bytearray(HEADER.pack(first, BATCH_HEADER_SIZE - BATCH_LENGTH_OVERHEAD, -1,
                                      RECORD_BATCH_MAGIC, 0, 0, delta, -1, -1, -1, -1, -1, 0))
        seal(batch)
        out.append(bytes(batch))
        first += delta + 1
    return out
