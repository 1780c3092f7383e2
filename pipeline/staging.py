"""``atomicity=batch``, the streaming sink's default: a micro-batch's tasks stage their
rows in ``<prefix>-staging`` (:func:`stage_rows`, on executors) and the driver copies
exactly the staged ranges of the batch to their targets in one transaction with the batch
marker (:func:`copy_batch`). Why and how: :mod:`pipeline.exactly_once`."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain

import confluent_kafka
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import Row
from pyspark.sql.datasource import WriterCommitMessage

from pipeline import clients
from pipeline.exactly_once import (
    TIMEOUT_SECONDS,
    Marker,
    in_transaction,
    query_prefix,
    running_task,
    task_query_id,
)
from pipeline.options import KafkaOptions
from pipeline.produce import Header, Record, produce_records, record_of

log = logging.getLogger(__name__)

STAGING_PARTITIONS = 4
"""Partitions of a staging topic the sink creates (task ``p`` writes to ``p % count``)."""
STAGING_CONFIG = {"cleanup.policy": "delete", "retention.ms": str(24 * 3600 * 1000)}
TOPIC_HEADER = "edgekafka.topic"
"""The first header of a staged record: its target topic."""
PARTITION_HEADER = "edgekafka.partition"
"""The second header of a staged record: its target partition (-1: by key)."""

Range = tuple[int, int, int]
"""Staging ``(partition, first offset, last offset)``, both ends included."""


@dataclass(frozen=True)
class Staged(WriterCommitMessage):
    """What one task staged: its query's prefix and id, and the ranges the broker
    acknowledged."""

    prefix: str
    query: str
    ranges: tuple[Range, ...]
    records: int


def staging_topic(prefix: str) -> str:
    """The staging topic of a query."""
    return f"{prefix}-staging"


_partition_counts: dict[str, int] = {}
"""Staging topics this process found or created, with their partition counts."""


def _partition_count(admin: AdminClient, topic: str) -> int | None:
    """The topic's partition count; None when the broker does not know it (yet)."""
    found = admin.list_topics(topic, timeout=TIMEOUT_SECONDS).topics.get(topic)
    if found is None or (found.error is not None and found.error.code()
                         == confluent_kafka.KafkaError.UNKNOWN_TOPIC_OR_PART):
        return None
    if found.error is not None:
        raise RuntimeError(f"edgekafka sink: staging topic {topic}: {found.error}")
    return len(found.partitions) or None


def ensure_staging(options: KafkaOptions, topic: str) -> int:
    """Create the staging topic unless it exists; its partition count."""
    known = _partition_counts.get(topic)
    if known is not None:
        return known
    admin = clients.admin(options)
    count = _partition_count(admin, topic)
    if count is None:
        future = admin.create_topics([NewTopic(topic, STAGING_PARTITIONS,
                                                config=STAGING_CONFIG)])[topic]
        try:
            future.result(TIMEOUT_SECONDS)
            log.info("edgekafka sink: created the staging topic %s", topic)
        except confluent_kafka.KafkaException as exc:
            error = exc.args[0]
            if error.code() != confluent_kafka.KafkaError.TOPIC_ALREADY_EXISTS:
                raise RuntimeError(f"edgekafka sink: creating the staging topic {topic}: "
                                   f"{error}") from None
        deadline = time.monotonic() + TIMEOUT_SECONDS
        while (count := _partition_count(admin, topic)) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"edgekafka sink: staging topic {topic} not in the "
                                   f"metadata {TIMEOUT_SECONDS:.0f} s after its creation")
            time.sleep(0.2)
    _partition_counts[topic] = count
    return count


@dataclass
class RangeCollector:
    """Acknowledged offsets, in order, folded into ranges of consecutive offsets."""

    ranges: list[Range] = field(default_factory=list)

    def add(self, message: confluent_kafka.Message) -> None:
        partition, offset = message.partition(), message.offset()
        assert partition is not None and offset is not None
        if self.ranges:
            last_partition, first, last = self.ranges[-1]
            if last_partition == partition and offset == last + 1:
                self.ranges[-1] = (partition, first, offset)
                return
        self.ranges.append((partition, offset, offset))


def to_staging(record: Record, topic: str, partition: int) -> Record:
    """``record`` as staged in ``topic``-``partition``: its target in the first headers."""
    target: list[Header] = [(TOPIC_HEADER, record.topic.encode()),
                            (PARTITION_HEADER, str(record.partition).encode())]
    return Record(topic, partition, record.key, record.value, target + (record.headers or []))


def from_staging(message: confluent_kafka.Message) -> Record:
    """The record a staged message stands for (target and headers restored)."""
    headers = message.headers() or []
    if isinstance(headers, dict):  # confluent-kafka returns a list; its stubs allow a dict
        headers = list(headers.items())
    if (len(headers) < 2 or headers[0][0] != TOPIC_HEADER
            or headers[1][0] != PARTITION_HEADER):
        raise RuntimeError(f"edgekafka sink: {message.topic()}-{message.partition()} offset "
                           f"{message.offset()} is not a staged record")
    topic, partition = (value.decode() if isinstance(value, bytes) else str(value)
                        for _name, value in headers[:2])
    return Record(topic, int(partition), message.key(), message.value(),
                  list(headers[2:]) or None)


def stage_rows(options: KafkaOptions, rows: Iterator[Row]) -> Staged:
    """Phase 1, a task: produce its rows to the staging topic; the ranges they got."""
    prefix, query = query_prefix(options), task_query_id()
    first = next(rows, None)
    if first is None:
        return Staged(prefix, query, (), 0)
    topic = staging_topic(prefix)
    partition = running_task().partitionId() % ensure_staging(options, topic)
    ranges = RangeCollector()
    count = produce_records(
        clients.producer(options),
        (to_staging(record_of(row, options), topic, partition) for row in chain([first], rows)),
        ranges.add)
    return Staged(prefix, query, tuple(ranges.ranges), count)


def merge(ranges: Iterable[Range]) -> dict[int, deque[tuple[int, int]]]:
    """Ranges by partition, sorted, adjacent ones joined; overlapping ones refused."""
    by_partition: dict[int, list[tuple[int, int]]] = {}
    for partition, first, last in ranges:
        by_partition.setdefault(partition, []).append((first, last))
    merged: dict[int, deque[tuple[int, int]]] = {}
    for partition, spans in by_partition.items():
        joined: deque[tuple[int, int]] = deque()
        for first, last in sorted(spans):
            if joined and first <= joined[-1][1]:
                raise RuntimeError(f"edgekafka sink: staged ranges overlap in partition "
                                   f"{partition} at offset {first}")
            if joined and first == joined[-1][1] + 1:
                joined[-1] = (joined[-1][0], last)
            else:
                joined.append((first, last))
        merged[partition] = joined
    return merged


def read_staged(consumer: confluent_kafka.Consumer, topic: str,
                wanted: dict[int, deque[tuple[int, int]]], stall_ms: int) -> Iterator[Record]:
    """Exactly the records of ``wanted`` (consumed: emptied), each partition in offset
    order, as the records to produce; fails when one is gone or nothing comes for
    ``stall_ms``."""
    consumer.assign([confluent_kafka.TopicPartition(topic, partition, spans[0][0])
                     for partition, spans in wanted.items()])
    deadline = time.monotonic() + stall_ms / 1000
    while wanted:
        messages = consumer.consume(500, 1.0)
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    continue
                raise RuntimeError(f"edgekafka sink: reading staged records of {topic}: "
                                   f"{error}")
            partition, offset = message.partition(), message.offset()
            assert partition is not None and offset is not None
            spans = wanted.get(partition)
            if spans is None or offset < spans[0][0]:
                continue  # another attempt's, or a partition already done
            first, last = spans[0]
            if offset > first:
                raise RuntimeError(f"edgekafka sink: staged records {topic}-{partition} "
                                   f"[{first}, {offset}) are gone")
            yield from_staging(message)
            deadline = time.monotonic() + stall_ms / 1000
            if offset < last:
                spans[0] = (offset + 1, last)
            elif len(spans) > 1:
                spans.popleft()
            else:
                del wanted[partition]
        if wanted and time.monotonic() > deadline:
            raise RuntimeError(f"edgekafka sink: no staged record of {topic} came in "
                               f"{stall_ms} ms (partitions {sorted(wanted)})")


def paced(records: Iterator[Record], pause_ms: int) -> Iterator[Record]:
    """``records``, each after a pause of ``pause_ms`` (the test-only ``copyPauseMs``)."""
    for record in records:
        if pause_ms:
            time.sleep(pause_ms / 1000)
        yield record


def copy_batch(options: KafkaOptions, messages: Sequence[WriterCommitMessage | None],
               batch_id: int) -> tuple[int, bool]:
    """Phase 2, the driver: copy the batch's staged records to their targets in one
    transaction with its marker, unless an earlier run did; the number of records copied
    and whether the batch was skipped as already written."""
    staged = [m for m in messages if isinstance(m, Staged)]
    records = sum(m.records for m in staged)
    if not records:
        return 0, False
    queries = {(m.prefix, m.query) for m in staged}
    if len(queries) != 1:
        raise RuntimeError(f"edgekafka sink: batch {batch_id} has tasks of several queries "
                           f"({', '.join(sorted(map(str, queries)))})")
    prefix, query = queries.pop()
    topic = staging_topic(prefix)
    marker = Marker(options, prefix, prefix, query, batch_id)
    try:
        producer = clients.producer(options, transactional_id=prefix)
        producer.init_transactions(TIMEOUT_SECONDS)
        if marker.written(topic):
            log.info("edgekafka sink: batch %d of %s was committed by an earlier run: "
                     "skipped", batch_id, prefix)
            return 0, True
        wanted = merge(chain.from_iterable(m.ranges for m in staged))

        def write() -> int:
            copied = produce_records(producer, paced(
                read_staged(marker.consumer, topic, wanted, options.poll_timeout_ms),
                options.copy_pause_ms))
            if copied != records:  # read_staged yields every wanted offset or fails
                raise RuntimeError(f"edgekafka sink: copied {copied} of {records} staged "
                                   f"records of batch {batch_id}")
            marker.commit(producer, topic, copied)
            return copied

        return in_transaction(producer, prefix, write), False
    finally:
        marker.close()
