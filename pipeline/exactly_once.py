"""Exactly-once streaming writes: each Spark task of a micro-batch writes its rows in one
Kafka transaction that also records the batch id, so a replayed batch is not written twice.

Spark's commit protocol for a Python streaming writer: the driver plans micro-batch ``N``
(its offsets go to the checkpoint's offset log), each task calls ``write()`` on an
executor with its Spark partition's rows, the driver's ``commit(messages, N)`` runs once
every task returned, and only then does Spark record ``N`` in the checkpoint's commit log.
A driver that dies anywhere before that record is followed, on restart, by a replay of
``N`` with the same offsets, hence (for a query without nondeterministic shuffles) the
same rows in the same Spark partitions. Committing a transaction per task in ``write()``
alone would write the tasks that had committed before the crash a second time; holding
the transactions open for the driver to commit is impossible, since a Kafka transaction
belongs to the producer that opened it and the task's producer is gone by then.

So each task (query ``Q``, Spark partition ``p``, batch ``N``) does, with transactional
id and marker group both ``<prefix>-<p>`` (the prefix is ``transactionalIdPrefix``, else
``edgekafka-<Q's id>``; the query id is the checkpoint's, stable across restarts):

1. ``init_transactions``: the coordinator aborts the open transaction of any earlier
   incarnation of ``(Q, p)`` (a killed task, or a driver killed mid-batch) and fences it,
   so it can never commit afterwards;
2. reads the marker group's committed offset (``require_stable``): the last batch of
   ``(Q, p)`` whose transaction committed, plus one. If it is past ``N``, this task's rows
   of batch ``N`` are already in the topic: it writes nothing;
3. otherwise begins a transaction, produces its rows, adds the marker offset ``N + 1``
   (``send_offsets_to_transaction`` to the marker group, on partition 0 of the first row's
   topic, the batch id also in its metadata) and commits. Rows and marker become visible
   together or not at all.

A read_committed reader therefore sees each task's share of a batch all or nothing, and,
once the query has run past a crash, every batch exactly once. Between a crash and the
restart, the tasks of the interrupted batch that had committed are visible and the others
are not; a query whose batches must appear whole writes through one Spark partition
(``coalesce(1)``), one transaction per batch. The marker is a committed group offset, so
it lasts as long as the broker keeps the offsets of an idle group.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain

import confluent_kafka
from pyspark import TaskContext
from pyspark.sql import Row

from pipeline import clients
from pipeline.options import KafkaOptions
from pipeline.produce import produce_all, topic_of

log = logging.getLogger(__name__)

TIMEOUT_SECONDS = 120.0
BATCH_ID_PROPERTY = "streaming.sql.batchId"
"""The task-local property in which Spark's micro-batch execution names the batch."""
QUERY_ID_PROPERTY = "sql.streaming.queryId"
"""The task-local property holding the query's id (kept in its checkpoint)."""


@dataclass(frozen=True)
class TaskScope:
    """Which micro-batch task writes: the transactional id / marker group and the batch."""

    name: str
    batch_id: int

    @classmethod
    def of_task(cls, options: KafkaOptions) -> TaskScope:
        """The scope of the running Spark task (on an executor)."""
        context = TaskContext.get()
        if context is None:
            raise RuntimeError("edgekafka sink: a streaming write runs outside a Spark task")
        batch = context.getLocalProperty(BATCH_ID_PROPERTY)
        query = context.getLocalProperty(QUERY_ID_PROPERTY)
        if batch is None or (query is None and options.transactional_id_prefix is None):
            raise RuntimeError("edgekafka sink: Spark gave the task no micro-batch id or "
                               "query id")
        prefix = options.transactional_id_prefix or f"edgekafka-{query}"
        return cls(f"{prefix}-{context.partitionId()}", int(batch))


class Marker:
    """The batch marker of a task scope: its group's committed offset, one past the last
    batch whose transaction committed."""

    def __init__(self, options: KafkaOptions, scope: TaskScope, topic: str) -> None:
        self.scope = scope
        self.where = confluent_kafka.TopicPartition(topic, 0)
        self.consumer = clients.consumer(options, isolation_level="read_committed",
                                         group=scope.name)

    def committed(self) -> bool:
        """Whether the scope's batch is committed already (read with require_stable)."""
        found = self.consumer.committed([self.where], timeout=TIMEOUT_SECONDS)[0]
        if found.error is not None:
            raise RuntimeError(f"edgekafka sink: reading the batch marker of "
                               f"{self.scope.name}: {found.error}")
        return int(found.offset) > self.scope.batch_id

    def offset(self, records: int) -> confluent_kafka.TopicPartition:
        """The marker of the scope's batch, to commit with its records."""
        return confluent_kafka.TopicPartition(
            self.where.topic, 0, self.scope.batch_id + 1,
            metadata=json.dumps({"batch": self.scope.batch_id, "records": records}))

    def group_metadata(self) -> object:
        """The marker group's metadata (a standalone member) for the transaction."""
        return self.consumer.consumer_group_metadata()

    def close(self) -> None:
        self.consumer.close()


def write_once(options: KafkaOptions, scope: TaskScope, rows: Iterator[Row]) -> tuple[int, bool]:
    """Write ``rows`` as ``scope``'s transaction unless an earlier run committed it;
    the number of records written and whether the batch was skipped as already written."""
    first = next(rows, None)
    if first is None:
        return 0, False
    marker = Marker(options, scope, topic_of(first, options))
    try:
        producer = clients.producer(options, transactional_id=scope.name)
        producer.init_transactions(TIMEOUT_SECONDS)
        if marker.committed():
            log.info("edgekafka sink: batch %d of %s was committed by an earlier run: "
                     "skipped", scope.batch_id, scope.name)
            for _row in rows:  # Spark streams the rest to this worker: take it in
                pass
            return 0, True
        producer.begin_transaction()
        try:
            count = produce_all(producer, options, chain([first], rows))
            producer.send_offsets_to_transaction([marker.offset(count)],
                                                 marker.group_metadata(), TIMEOUT_SECONDS)
            producer.commit_transaction(TIMEOUT_SECONDS)
        except BaseException:
            try:
                producer.abort_transaction(TIMEOUT_SECONDS)
            except confluent_kafka.KafkaException as exc:  # fenced or fatal: nothing to do
                log.warning("edgekafka sink: aborting the transaction of %s: %s",
                            scope.name, exc)
            raise
        return count, False
    finally:
        marker.close()
