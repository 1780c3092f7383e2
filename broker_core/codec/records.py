"""The records inside a v2 batch: validation on produce (``validateRecords``, on by
default), the record timestamps a ListOffsets lookup needs, and the plain batches of keys
and values the broker writes and reads back in its own topics.

The hot path treats a batch as opaque: header, CRC and counts are checked, the records
are not (DESIGN: no per-record work). A client can therefore write a batch whose CRC is
right but whose records do not parse, and librdkafka consumers then stall at that offset
without an error. With ``validateRecords=true`` every record is walked as Kafka's broker
does before it appends: its length must frame it exactly, its fields must fit inside it,
its varints must be no longer than Kafka's reader takes them (5 bytes, 10 for the
timestamp delta: :func:`broker_core.codec.varints.read_varint32`), offset deltas must run
0..n-1 and the count must match the header. A batch that fails
answers INVALID_RECORD and nothing of it is written.

Compressed payloads are inflated with a cap (:mod:`broker_core.codec.compression`), so
that a small batch cannot expand into gigabytes of memory, then walked like uncompressed
ones. Where a batch is admitted, on the event loop, only what costs about what came is
checked (:func:`checked_here`): an uncompressed batch, or a compressed one whose payload
inflates to at most :data:`HERE_RATIO` times its size and :data:`HERE_BYTES`; any other is
inflated and walked in a worker thread (``broker_core.codec.rework``), as a few kilobytes
of zstd may inflate to the 64 MiB cap. A topic whose ``cleanup.policy`` includes
``compact`` also needs every record to carry a key.

Validation walks in C when :mod:`broker_core.codec.record_walk` has loaded the native
walker (see ``python -m bench.record_walk`` for the cost per record), else in Python
(about 3 µs a record). The C walker only finds the failing record; :func:`_walk` words
the error, so both answer with the same message.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from broker_core.codec.batch_header import BATCH_HEADER_SIZE, BatchHeader
from broker_core.codec.compression import inflate, inflate_within
from broker_core.codec.errors import MalformedBatch
from broker_core.codec.record_walk import NATIVE, NativeWalker
from broker_core.codec.varints import Buffer, read_varint, read_varint32
from broker_core.errors import ErrorCode, KafkaApiError


def _skip_sized(buf: Buffer, pos: int, what: str, nullable: bool = True) -> int:
    """Skip a varint-length-prefixed field (-1: null when ``nullable``)."""
    size, pos = read_varint32(buf, pos)
    if size < 0 and not (nullable and size == -1):
        raise MalformedBatch(f"{what} length {size}")
    return pos + max(size, 0)


def _walk(buf: Buffer, pos: int, count: int,
          times: list[tuple[int, int]] | None = None, keyed: bool = False,
          index: int = 0) -> None:
    """Walk the records in ``buf[pos:]``, the first of them record ``index``; collect
    (offset delta, timestamp delta) pairs into ``times`` when given; with ``keyed`` a
    record without a key is malformed."""
    end = len(buf)
    try:
        while pos < end:
            length, pos = read_varint32(buf, pos)
            stop = pos + length
            if length < 6 or stop > end:
                raise MalformedBatch(f"record {index} declares {length} bytes; "
                                     f"{end - pos} remain")
            pos += 1  # attributes
            timestamp_delta, pos = read_varint(buf, pos)
            delta, pos = read_varint32(buf, pos)
            if delta != index:
                raise MalformedBatch(f"record {index} has offset delta {delta}")
            if keyed and read_varint32(buf, pos)[0] == -1:
                raise MalformedBatch(f"record {index} has no key, and a compacted topic "
                                     "keeps the latest record of each key")
            pos = _skip_sized(buf, pos, "key")
            pos = _skip_sized(buf, pos, "value")
            headers, pos = read_varint32(buf, pos)
            if headers < 0:
                raise MalformedBatch(f"record {index} has {headers} headers")
            for _ in range(headers):
                pos = _skip_sized(buf, pos, "header key", nullable=False)
                pos = _skip_sized(buf, pos, "header value")
            if pos != stop:
                raise MalformedBatch(f"record {index}'s fields take {pos - stop + length} "
                                     f"of its {length} bytes")
            if times is not None:
                times.append((delta, timestamp_delta))
            index += 1
    except IndexError as exc:
        raise MalformedBatch("a record runs past the end of the batch") from exc
    if index != count:
        raise MalformedBatch(f"the batch holds {index} records, its header says {count}")


def records_buffer(batch: Buffer, compression: int) -> tuple[Buffer, int]:
    """The records' bytes and where they start: in place, or inflated (MalformedBatch when
    the payload does not inflate)."""
    if compression == 0:
        return batch, BATCH_HEADER_SIZE
    return inflate(compression, bytes(batch[BATCH_HEADER_SIZE:])), 0


def walk_records(buf: Buffer, pos: int, count: int, keyed: bool = False,
                 native: NativeWalker | None = NATIVE) -> None:
    """Raise MalformedBatch unless the ``count`` records in ``buf[pos:]`` parse and, with
    ``keyed``, each has a key: walked by ``native`` when given (and ``buf`` is
    contiguous), else in Python."""
    found = False if native is None else native.walk(buf, pos, count, keyed)
    if found is None:
        return
    if found is False:
        _walk(buf, pos, count, keyed=keyed)
        return
    _walk(buf, found.start, count, keyed=keyed, index=found.record)  # words the error
    raise MalformedBatch(f"record {found.record} does not parse "  # the walkers disagree
                         f"(native walker code {found.code} at byte {found.start})")


def check_walk(records: Buffer, start: int, count: int, keyed: bool = False) -> None:
    """Raise INVALID_RECORD unless the ``count`` records in ``records[start:]`` parse and,
    with ``keyed``, each has a key (see the module doc)."""
    try:
        walk_records(records, start, count, keyed)
    except MalformedBatch as exc:
        raise KafkaApiError(ErrorCode.INVALID_RECORD, f"malformed record: {exc}") from exc


def check_records(batch: Buffer, header: BatchHeader, keyed: bool = False) -> None:
    """Raise INVALID_RECORD unless every record of ``batch`` parses and, with ``keyed``,
    has a key (see the module doc)."""
    try:
        records, start = records_buffer(batch, header.compression)
    except MalformedBatch as exc:
        raise KafkaApiError(ErrorCode.INVALID_RECORD, f"malformed record: {exc}") from exc
    check_walk(records, start, header.record_count, keyed)


HERE_RATIO = 16
"""A compressed batch is checked where it is admitted only if its payload inflates to at
most this many times its size (then the work on the event loop is bounded by the bytes that
came, as an uncompressed batch's walk is; common codecs on real records stay under it)..."""
HERE_BYTES = 64 * 1024
"""... and to at most this many bytes."""


def checked_here(batch: Buffer, header: BatchHeader) -> bool:
    """:func:`check_records` for a batch whose check costs about what came (see the module
    doc): True once checked (INVALID_RECORD raised if it fails), False when the payload
    inflates past the bound, unchecked: to check in a worker thread. The outcome is the one
    :func:`check_records` gives."""
    if header.compression == 0:
        check_records(batch, header)
        return True
    payload = bytes(batch[BATCH_HEADER_SIZE:])
    try:
        records = inflate_within(header.compression, payload,
                                 min(HERE_BYTES, HERE_RATIO * len(payload)))
    except MalformedBatch as exc:
        raise KafkaApiError(ErrorCode.INVALID_RECORD, f"malformed record: {exc}") from exc
    if records is None:
        return False
    check_walk(records, 0, header.record_count)
    return True


def record_times(batch: Buffer, header: BatchHeader) -> list[tuple[int, int]]:
    """(offset delta, timestamp) of every record of a data batch; MalformedBatch when the
    records do not parse (a batch stored without ``validateRecords`` may not)."""
    records, start = records_buffer(batch, header.compression)
    times: list[tuple[int, int]] = []
    _walk(records, start, header.record_count, times)
    return [(delta, header.base_timestamp + timestamp_delta) for delta, timestamp_delta in times]


def encode_batch(records: Sequence[tuple[bytes, bytes | None]], timestamp: int) -> bytearray:
    """One uncompressed v2 batch of ``records``."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 30)
    for delta, (key, value) in enumerate(records):
        builder.append(delta, timestamp=timestamp, key=key, value=value, headers=[])
    return bytearray(builder.build())


def key_values(batch: Buffer, start: int = -1) -> Iterator[tuple[bytes, bytes | None]]:
    """Key and value of each keyed record of ``batch`` at offset ``start`` or later (the
    broker's own topics: every record has a key)."""
    for record in DefaultRecordBatch(bytes(batch)):
        if record.offset >= start and record.key is not None:
            yield bytes(record.key), None if record.value is None else bytes(record.value)
