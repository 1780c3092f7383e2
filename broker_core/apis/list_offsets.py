"""ListOffsets: earliest, latest, max timestamp and first offset at or after a timestamp.

Timestamp lookups skip ledgers and batches by their max timestamp and decode only the one
batch that holds the answer, to name the exact record as Kafka does; they run in a thread
of their own (one batch may hold a million records). A partition named twice in one
request answers INVALID_REQUEST, as Kafka answers it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from kafka.protocol.consumer import ListOffsetsRequest, ListOffsetsResponse

from broker_core.codec.batch_header import read_header
from broker_core.codec.errors import MalformedBatch
from broker_core.codec.records import record_times
from broker_core.context import Operation, RequestContext
from broker_core.engine import Engine
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.storage import BatchInfo, DatabaseUnavailable, PartitionStore

log = logging.getLogger(__name__)
LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4
LATEST_TIERED = -5
"""The last offset in tiered storage (KIP-1005, v9+): none here, so -1 as Kafka answers
for a topic without remote storage."""
_Topic = ListOffsetsResponse.ListOffsetsTopicResponse
_Partition = _Topic.ListOffsetsPartitionResponse
_NOT_FOUND = (-1, -1)
_LOOKUPS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="offset-lookup")
"""Where lookups by time run: one at a time, whoever asks."""


def _records(info: BatchInfo, start: int) -> list[tuple[int, int]]:
    """(offset, timestamp) of the records of a batch at or after ``start``; a control
    batch (a transaction marker) is its one record, as Kafka's lookups by time and its
    segments' max timestamps count it."""
    first = max(info.base_offset, start)
    if first > info.last_offset:
        return []
    header = read_header(info.batch)
    if header.is_control:
        return [(first, info.max_timestamp)]
    if header.log_append_time:  # every record carries the max timestamp
        return [(first, info.max_timestamp)]
    try:
        times = record_times(info.batch, header)
    except MalformedBatch as exc:  # stored as produced: records are not checked then
        log.warning("batch at offset %d does not parse (%s); answering by its header",
                    info.base_offset, exc)
        return [(first, info.max_timestamp)]
    return [(info.base_offset + delta, timestamp) for delta, timestamp in times
            if info.base_offset + delta >= start]


def _first_at_least(info: BatchInfo, start: int, target: int) -> tuple[int, int] | None:
    """The first record of ``info`` at or after ``start`` stamped ``target`` or later."""
    if info.max_timestamp < target:
        return None
    return next(((offset, timestamp) for offset, timestamp in _records(info, start)
                 if timestamp >= target), None)


def _offset_for_timestamp(partition: PartitionStore, target: int) -> tuple[int, int]:
    """The first batch stamped ``target`` or later, found by the store, almost always
    holds the answer: it is walked. When it holds no such record at or after the log start
    (it straddles the log start), the store is asked again from the batch after it, as
    Kafka's search walks on to the next batch. A transaction marker can be the answer, as
    on Kafka: a consumer seeking there reads on from the records after it."""
    start = partition.log_start_offset
    info = partition.find_first_batch_with_timestamp_at_least(target)
    while info is not None:
        found = _first_at_least(info, start, target)
        if found is not None:
            return found
        info = partition.find_first_batch_with_timestamp_at_least(target, info.last_offset + 1)
    return _NOT_FOUND


def _max_timestamp(partition: PartitionStore) -> tuple[int, int]:
    """The record with the largest timestamp (the first of them), a transaction marker's
    included: as Kafka, whose segments track every batch's max timestamp (a commit marker,
    stamped by the coordinator after the records it ends, is often the answer; skipping it
    answered -1 on a log holding records). When the batch of the largest max timestamp
    straddles the log start, its records from the start on are weighed against the best
    batch after it, which the store finds as it found the first (by its summaries, never
    reading the log on)."""
    start = partition.log_start_offset
    candidate = partition.batch_with_max_timestamp()
    if candidate is None:
        return _NOT_FOUND
    best = _best_record(candidate, start)
    if candidate.base_offset < start and best[1] < candidate.max_timestamp:
        after = partition.batch_with_max_timestamp(candidate.last_offset + 1)
        if after is not None and after.max_timestamp > best[1]:
            best = _best_record(after, start)  # a tie goes to the earlier record
    return best


def _best_record(info: BatchInfo, start: int) -> tuple[int, int]:
    """The first record of ``info`` at or after ``start`` with its largest timestamp."""
    best = _NOT_FOUND
    for offset, timestamp in _records(info, start):
        if timestamp > best[1]:
            best = (offset, timestamp)
    return best


def _lookup(partition: PartitionStore, target: int) -> tuple[int, int]:
    """The offset (and timestamp) ``target`` names, but LATEST (``_looked_up``)."""
    if target in (EARLIEST, EARLIEST_LOCAL):
        return partition.log_start_offset, -1
    if target == LATEST_TIERED:
        return _NOT_FOUND
    if target == MAX_TIMESTAMP:
        return _max_timestamp(partition)
    if target < 0:
        raise KafkaApiError(ErrorCode.INVALID_REQUEST, f"unsupported timestamp {target}")
    return _offset_for_timestamp(partition, target)


async def _looked_up(partition: PartitionStore, target: int,
                     limit: Callable[[], int]) -> tuple[int, int]:
    """The offset ``target`` names for a reader whose last fetchable offset is ``limit()``
    when the answer is made (the high watermark, or for read_committed the last stable
    offset): LATEST is that offset, and an offset found by time lies below it, as Kafka
    answers. A lookup by time (which may walk a whole batch's records, inflated) runs in
    the lookups' own thread, so neither the event loop nor the fsyncs of the default
    executor wait for it; a log start that moved meanwhile (retention or DeleteRecords:
    the walk may have stopped at a dropped segment) has it looked up again, there too (on
    PostgreSQL a lookup is SQL)."""
    if target == LATEST:
        return limit(), -1
    if target in (EARLIEST, EARLIEST_LOCAL, LATEST_TIERED):
        return _lookup(partition, target)
    loop = asyncio.get_running_loop()
    start = partition.log_start_offset
    found = await loop.run_in_executor(_LOOKUPS, _lookup, partition, target)
    if partition.log_start_offset != start:
        found = await loop.run_in_executor(_LOOKUPS, _lookup, partition, target)
    return found if found[0] < limit() else _NOT_FOUND


def _duplicates(request: ListOffsetsRequest) -> set[tuple[str, int]]:
    """The partitions a request names more than once (Kafka answers each INVALID_REQUEST)."""
    seen: set[tuple[str, int]] = set()
    twice: set[tuple[str, int]] = set()
    for topic in request.topics:
        for part in topic.partitions:
            key = (topic.name, part.partition_index)
            (twice if key in seen else seen).add(key)
    return twice


async def handle_list_offsets(engine: Engine, ctx: RequestContext,
                              request: ListOffsetsRequest) -> ListOffsetsResponse:
    """Answer ListOffsets for every requested partition."""
    committed = request.version >= 2 and request.isolation_level == 1
    await engine.leadership.ready_named(
        ctx, ((t.name, (p.partition_index for p in t.partitions)) for t in request.topics))
    duplicates = _duplicates(request)
    topics = []
    for topic in request.topics:
        partitions = []
        for part in topic.partitions:
            code = ErrorCode.NONE
            offset, timestamp = _NOT_FOUND
            epoch = -1
            try:
                if (topic.name, part.partition_index) in duplicates:
                    raise KafkaApiError(ErrorCode.INVALID_REQUEST,
                                        f"{topic.name}-{part.partition_index} named twice")
                internal = engine.tenancy.internal_name(ctx, topic.name)
                if not engine.tenancy.allowed(ctx, Operation.DESCRIBE, internal):
                    raise KafkaApiError(ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                        f"not allowed to describe {topic.name}")
                partition = engine.partition(internal, part.partition_index)
                leadership = engine.leadership.leader_error(internal, part.partition_index,
                                                            part.current_leader_epoch)
                if leadership != ErrorCode.NONE:
                    raise KafkaApiError(leadership, f"{topic.name}-{part.partition_index}")
                epoch = engine.leadership.serves(internal, part.partition_index) or 0
                offset, timestamp = await _looked_up(
                    partition, part.timestamp,
                    partial(engine.stable_offset, internal, part.partition_index) if committed
                    else partial(engine.flusher.high_watermark, partition))
            except KafkaApiError as error:
                code = error.code
            except DatabaseUnavailable:  # retriable, as Kafka answers a failing log dir
                code = ErrorCode.KAFKA_STORAGE_ERROR
            partitions.append(_Partition(partition_index=part.partition_index, error_code=code,
                                         timestamp=timestamp, offset=offset, leader_epoch=epoch))
        topics.append(_Topic(name=topic.name, partitions=partitions))
    return ListOffsetsResponse(version=request.version, throttle_time_ms=0, topics=topics)
