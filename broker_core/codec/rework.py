"""Produce-time work on the records of a batch, done off the event loop (the engine runs
:func:`rework` in an executor thread) because it costs CPU in proportion to the records.

Three things need it. A compressed batch whose payload inflates to much more than came
(:func:`broker_core.codec.records.checked_here`), with ``validateRecords``, is inflated
and every record walked here (a few kilobytes of a hostile client's payload may inflate to
the 64 MiB cap of :mod:`broker_core.codec.compression`: work no other client's request may
wait for on the event loop; other batches are walked where they are admitted, their cost
bounded by the bytes that came: :data:`WALKING`). A topic whose ``compression.type`` names
a codec stores every batch in that codec: a batch that arrives in another one is inflated
and compressed again, as Kafka's broker does (``producer``, the default, stores every
batch as it came, and a batch already in the topic's codec is kept as it came too). Only
the codec bits of the attributes, the batch length and the CRC change: the records' bytes
are the same, so base offset, partition leader epoch, producer id and epoch, base
sequence, the transactional flag, the timestamp type and every timestamp are kept. And a
topic whose ``cleanup.policy`` includes ``compact`` refuses records without a key, so each
record's key is looked at (with ``validateRecords`` the whole record is walked in the same
pass).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace

from broker_core.codec.batch_header import (
    ATTRIBUTES_AT,
    BATCH_HEADER_SIZE,
    BATCH_LENGTH_AT,
    BATCH_LENGTH_OVERHEAD,
    CODEC_BITS,
    MIN_RECORD_SIZE,
    BatchHeader,
    seal,
)
from broker_core.codec.compression import deflate
from broker_core.codec.errors import MalformedBatch
from broker_core.codec.records import check_walk, records_buffer
from broker_core.codec.varints import Buffer
from broker_core.errors import ErrorCode, KafkaApiError

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class Rework:
    """What a produced batch needs done to its records before it is appended."""

    codec: int | None
    """Compress the records again with this codec (None: keep the payload as it came)."""
    walk: bool
    """Check that every record parses (``validateRecords``)."""
    keyed: bool
    """Refuse a record without a key (a compacted topic)."""

    @classmethod
    def needed(cls, header: BatchHeader, codec: int | None, keyed: bool,
               walk: bool) -> Rework | None:
        """The work a batch with ``header`` needs in a topic storing ``codec`` (None: the
        producer's) and requiring keys when ``keyed``, its records walked when ``walk``
        (``validateRecords``); None when it goes in as it came (and is checked, if at all,
        where it is admitted, or then :data:`WALKING`)."""
        recode = codec is not None and codec != header.compression
        if not (recode or keyed):
            return None
        return cls(codec if recode else None, walk, keyed)


WALKING = Rework(None, True, False)
"""The work of a batch in a topic that keeps it as it came, too costly to walk where it is
admitted: its records inflated and walked (``validateRecords``)."""


def _invalid(exc: MalformedBatch) -> KafkaApiError:
    return KafkaApiError(ErrorCode.INVALID_RECORD, f"malformed record: {exc}")


def rework(batch: Buffer, header: BatchHeader,
           plan: Rework) -> tuple[bytearray, BatchHeader] | None:
    """Do ``plan`` to ``batch`` (whose header is ``header``): the batch compressed again and
    its header as it now is, or None when its bytes stay as they came. INVALID_RECORD for
    records that do not parse (as far as the plan looks) or lack a key the plan requires;
    nothing is changed then."""
    try:
        records, start = records_buffer(batch, header.compression)
    except MalformedBatch as exc:
        raise _invalid(exc) from exc
    if plan.walk or plan.keyed:
        check_walk(records, start, header.record_count, plan.keyed)
    if plan.codec is None:
        return None
    plain = bytes(memoryview(records)[start:])
    if header.record_count * MIN_RECORD_SIZE > len(plain):
        raise _invalid(MalformedBatch(f"batch claims {header.record_count} records in "
                                      f"{len(plain)} bytes"))
    payload = deflate(plan.codec, plain)
    out = bytearray(BATCH_HEADER_SIZE + len(payload))
    out[:BATCH_HEADER_SIZE] = memoryview(batch)[:BATCH_HEADER_SIZE]
    out[BATCH_HEADER_SIZE:] = payload
    _INT32.pack_into(out, BATCH_LENGTH_AT, len(out) - BATCH_LENGTH_OVERHEAD)
    attributes = (header.attributes & ~CODEC_BITS) | plan.codec
    _INT16.pack_into(out, ATTRIBUTES_AT, attributes)
    crc = seal(out)
    return out, replace(header, batch_length=len(out) - BATCH_LENGTH_OVERHEAD,
                        attributes=attributes, crc=crc)
