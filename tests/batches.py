"""Record batches for tests, built with kafka-python's encoder: the one home of the v2
batch builder the storage, protocol and validation tests share."""

from __future__ import annotations

import time
from collections.abc import Sequence

from kafka.record.default_records import DefaultRecordBatchBuilder

Header = tuple[str, bytes | None]
Record = tuple[bytes | None, bytes | None] | tuple[bytes | None, bytes | None, list[Header]]


def build_batch(records: Sequence[Record], *, timestamp: int = 1_000, timestamp_step: int = 1,
                compression: int = 0, producer_id: int = -1, producer_epoch: int = -1,
                base_sequence: int = -1, transactional: bool = False,
                batch_size: int = 1 << 20) -> bytearray:
    """A v2 batch of ``records`` (key, value[, headers]); record i is stamped
    ``timestamp + i * timestamp_step``."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=compression,
                                        is_transactional=transactional,
                                        producer_id=producer_id, producer_epoch=producer_epoch,
                                        base_sequence=base_sequence, batch_size=batch_size)
    for i, record in enumerate(records):
        headers = record[2] if len(record) == 3 else []
        builder.append(i, timestamp=timestamp + i * timestamp_step, key=record[0],
                       value=record[1], headers=headers)
    batch: bytearray = builder.build()
    return batch


def make_batch(count: int, first_timestamp: int = 1_000, size: int = 50,
               producer_id: int = -1) -> bytearray:
    """``count`` records of key ``k`` and ``size`` bytes of value; transactional (epoch 0,
    sequence 0) when ``producer_id`` is given."""
    transactional = producer_id >= 0
    return build_batch([(b"k", b"v" * size)] * count, timestamp=first_timestamp,
                       producer_id=producer_id, producer_epoch=0 if transactional else -1,
                       base_sequence=0 if transactional else -1, transactional=transactional)


def numbered_batch(first: int, count: int, *, ts: int = 1_000, pad: int = 0) -> bytearray:
    """``count`` keyless records whose values are ``b"<first+i>"`` (+ ``pad`` dots)."""
    return build_batch([(None, str(first + i).encode() + b"." * pad) for i in range(count)],
                       timestamp=ts)


def values_batch(values: Sequence[bytes], *, compression: int = 0) -> bytearray:
    """Keyless records of ``values``, all stamped now (a producer's batch)."""
    return build_batch([(None, value) for value in values], timestamp=int(time.time() * 1000),
                       timestamp_step=0, compression=compression)
