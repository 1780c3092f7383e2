"""Transaction markers: the control batches a transaction's end writes into each partition.

A marker is a v2 batch with the control and transactional attributes set, the producer's
id and epoch, and one record whose key holds (version 0, type: 0 abort / 1 commit) and
whose value holds (version 0, coordinator epoch). It takes one offset, so offsets stay
continuous.
"""

from __future__ import annotations

import struct

import crc32c
from kafka.record.default_records import DefaultRecordBatch

from broker_core.codec.varints import zigzag_varint as _varint
from broker_core.storage.batch_header import ATTRIBUTES_AT, CRC_AT

ABORT = 0
COMMIT = 1
_CONTROL_TRANSACTIONAL = 0x20 | 0x10
_BATCH_HEADER = struct.Struct(">qiiBIhiqqqhii")


def marker_batch(producer_id: int, producer_epoch: int, commit: bool, timestamp: int,
                 coordinator_epoch: int = 0) -> bytearray:
    """A complete control batch (base offset 0, to be patched by the log)."""
    key = struct.pack(">hh", 0, COMMIT if commit else ABORT)
    value = struct.pack(">hi", 0, coordinator_epoch)
    body = (b"\x00" + _varint(0) + _varint(0) + _varint(len(key)) + key
            + _varint(len(value)) + value + _varint(0))
    record = _varint(len(body)) + body
    size = _BATCH_HEADER.size + len(record)
    batch = bytearray(_BATCH_HEADER.pack(
        0, size - 12, 0, 2, 0, _CONTROL_TRANSACTIONAL, 0, timestamp, timestamp,
        producer_id, producer_epoch, -1, 1))
    batch += record
    struct.pack_into(">I", batch, CRC_AT, crc32c.crc32c(memoryview(batch)[ATTRIBUTES_AT:]))
    return batch


def marker_type(batch: bytes | bytearray | memoryview) -> int:
    """ABORT or COMMIT, read from the key of a control batch's single record."""
    for record in DefaultRecordBatch(bytes(batch)):
        return int(record.type)
    raise ValueError("control batch without a record")
