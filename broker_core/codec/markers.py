"""Transaction markers: the control batches a transaction's end writes into each partition.

A marker is a v2 batch with the control and transactional attributes set, the producer's
id and epoch, and one record whose key holds (version 0, type: 0 abort / 1 commit) and
whose value holds (version 0, coordinator epoch). It takes one offset, so offsets stay
continuous.
"""

from __future__ import annotations

import struct

from kafka.record.default_records import DefaultRecordBatch

from broker_core.codec.batch_header import (
    BATCH_LENGTH_OVERHEAD,
    CONTROL_BIT,
    HEADER,
    RECORD_BATCH_MAGIC,
    TRANSACTIONAL_BIT,
    seal,
)
from broker_core.codec.varints import zigzag_varint as _varint

ABORT = 0
COMMIT = 1
_CONTROL_TRANSACTIONAL = CONTROL_BIT | TRANSACTIONAL_BIT
_VALUE = struct.Struct(">hi")
"""A marker's value: version 0, the coordinator epoch."""


def marker_batch(producer_id: int, producer_epoch: int, commit: bool, timestamp: int,
                 coordinator_epoch: int = 0) -> bytearray:
    """A complete control batch (base offset 0, to be patched by the log)."""
    key = struct.pack(">hh", 0, COMMIT if commit else ABORT)
    value = _VALUE.pack(0, coordinator_epoch)
    body = (b"\x00" + _varint(0) + _varint(0) + _varint(len(key)) + key
            + _varint(len(value)) + value + _varint(0))
    record = _varint(len(body)) + body
    size = HEADER.size + len(record)
    batch = bytearray(HEADER.pack(
        0, size - BATCH_LENGTH_OVERHEAD, 0, RECORD_BATCH_MAGIC, 0, _CONTROL_TRANSACTIONAL, 0,
        timestamp, timestamp, producer_id, producer_epoch, -1, 1))
    batch += record
    seal(batch)
    return batch


def marker_type(batch: bytes | bytearray | memoryview) -> int:
    """ABORT or COMMIT, read from the key of a control batch's single record."""
    return read_marker(batch)[0]


def read_marker(batch: bytes | bytearray | memoryview) -> tuple[int, int]:
    """ABORT or COMMIT, and the coordinator epoch its value holds (-1 when it holds none),
    read from a control batch's single record."""
    for record in DefaultRecordBatch(bytes(batch)):
        value = record.value
        epoch = -1
        if value is not None and len(value) >= _VALUE.size:
            epoch = _VALUE.unpack_from(value)[1]
        return int(record.type), epoch
    raise ValueError("control batch without a record")
