"""Exactly-once streaming writes: every micro-batch is written in Kafka transactions that
also record the batch id (the *batch marker*), so a replayed batch is not written twice.
Two modes, chosen by the sink option ``atomicity``.

Spark's commit protocol for a Python streaming writer: the driver plans micro-batch ``N``
(its offsets go to the checkpoint's offset log), each task calls ``write()`` on an
executor with its Spark partition's rows, the driver's ``commit(messages, N)`` runs once
every task returned (with the messages of the task attempts Spark kept, never those of
failed or losing speculative attempts), and only then does Spark record ``N`` in the
checkpoint's commit log. A driver that dies anywhere before that record is followed, on
restart, by a replay of ``N`` with the same offsets: its tasks run again, then
``commit``. A Kafka transaction belongs to the producer that opened it, so the tasks'
transactions cannot be left open for the driver to commit: either the tasks commit
(``partition``) or the driver writes (``batch``).

The prefix of names is ``transactionalIdPrefix``, else ``edgekafka-<Q>`` for query ``Q``
(the query id is the checkpoint's, stable across restarts). A marker is the committed
offset ``N + 1`` of a marker group (batch id, record count and query id in its metadata),
committed with ``send_offsets_to_transaction`` in the transaction that writes the
records, so both become visible together or not at all; it is read back with
``require_stable`` (librdkafka asks for it at read_committed), after
``init_transactions`` under the same transactional id has aborted and fenced whatever an
earlier incarnation left open. A marker at ``N + 1`` means ``N`` is written: skip it. A
marker naming another query means two queries share the prefix (a new checkpoint with an
old ``transactionalIdPrefix``, or two queries at once, which would fence each other): the
write fails rather than skip batches it never wrote. A marker past ``N + 1`` (the
checkpoint is older than the output) fails too. Markers without a query id (written
before markers named it) count as the query's own. The marker lasts as long as the
broker keeps the offsets of an idle group.

``atomicity=batch`` (default, :mod:`pipeline.staging`): a whole micro-batch becomes
visible at once, in two phases.

1. Each task produces its rows to the staging topic ``<prefix>-staging`` (created by the
   first task that finds it missing, ``cleanup.policy=delete``, one day of retention) with
   an idempotent, acks=all producer, into partition ``task partition % partitions``, each
   record carrying its target topic and partition as its first two headers. The task
   returns the staging offset ranges the broker acknowledged for it.
2. The driver's ``commit`` opens one transaction with transactional id ``<prefix>``,
   whose ``init_transactions`` fences every earlier incarnation of the query's driver
   and aborts its open copy. If the marker (group ``<prefix>``, on partition 0 of the
   staging topic) says ``N`` is written, it stops. Otherwise it reads exactly the
   ranges of the messages Spark handed it, produces each record to its target (headers
   restored), adds the marker and commits.

A crash during phase 1 leaves staging records nobody copies (a replay stages its rows
again, at new offsets); a crash during phase 2 leaves an open transaction that the
restarted driver aborts; a crash after the commit but before Spark's commit log leaves a
marker past ``N``, so the replay copies nothing. Staging records only have to outlive
one batch (the replay never reads an earlier run's), hence the short retention. Cost:
every row crosses the network twice more (task to staging, staging to driver) and the
driver copies the batch alone; a batch's copy must finish within
``kafka.transaction.timeout.ms``.

``atomicity=partition`` (:func:`write_once`): each task ``p`` writes its rows in its own
transaction, transactional id and marker group ``<prefix>-<p>``, marker on partition 0
of the ``topic`` option (else of the smallest topic the task's rows name, whatever their
order; then the marker is read after the rows are written, and a batch found written is
aborted): no staging and no copy, but a batch interrupted by a crash is
partly visible (the tasks that committed) until the restarted query writes the rest;
only the tasks of the replay that had not committed write (which needs the replay to put
the same rows in the same Spark partition, as queries without nondeterministic shuffles
do). A task commits only if its input came whole (:mod:`pipeline.task_input`): rows cut
short by a failing upstream stage or a killed executor are aborted, not committed.

The two modes keep their markers apart: a query must not change ``atomicity`` across a
restart that replays an interrupted batch.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from itertools import chain
from typing import TypeVar

import confluent_kafka
from pyspark import TaskContext
from pyspark.sql import Row

from pipeline import clients
from pipeline.options import KafkaOptions
from pipeline.produce import produce_all, topic_of
from pipeline.task_input import executor_link, input_cut

log = logging.getLogger(__name__)

TIMEOUT_SECONDS = 120.0
BATCH_ID_PROPERTY = "streaming.sql.batchId"
"""The task-local property in which Spark's micro-batch execution names the batch."""
QUERY_ID_PROPERTY = "sql.streaming.queryId"
"""The task-local property holding the query's id (kept in its checkpoint)."""


def running_task() -> TaskContext:
    """The running Spark task's context (on an executor)."""
    context = TaskContext.get()
    if context is None:
        raise RuntimeError("edgekafka sink: a streaming write runs outside a Spark task")
    return context


def task_query_id() -> str:
    """The id of the running task's query (kept in its checkpoint)."""
    query = running_task().getLocalProperty(QUERY_ID_PROPERTY)
    if query is None:
        raise RuntimeError("edgekafka sink: Spark gave the task no query id")
    return query


def query_prefix(options: KafkaOptions) -> str:
    """The prefix of the running task's query: ``transactionalIdPrefix`` or
    ``edgekafka-<query id>``."""
    if options.transactional_id_prefix is not None:
        return options.transactional_id_prefix
    return f"edgekafka-{task_query_id()}"


def task_batch_id() -> int:
    """The micro-batch of the running task."""
    batch = running_task().getLocalProperty(BATCH_ID_PROPERTY)
    if batch is None:
        raise RuntimeError("edgekafka sink: Spark gave the task no micro-batch id")
    return int(batch)


def _marker_fields(metadata: str | None) -> dict[str, object]:
    """The fields of a marker's metadata (``{}`` when it holds none)."""
    try:
        fields = json.loads(metadata or "")
    except ValueError:
        return {}
    return fields if isinstance(fields, dict) else {}


T = TypeVar("T")


def in_transaction(producer: confluent_kafka.Producer, group: str,
                   body: Callable[[], T]) -> T:
    """Run ``body`` in a transaction of ``producer`` (transactional, initialised); the
    body commits or aborts it; any exception aborts it."""
    producer.begin_transaction()
    try:
        return body()
    except BaseException:
        try:
            producer.abort_transaction(TIMEOUT_SECONDS)
        except confluent_kafka.KafkaException as exc:  # fenced or fatal: nothing to do
            log.warning("edgekafka sink: aborting the transaction of %s: %s", group, exc)
        raise


class Marker:
    """The batch markers of a group, for batch ``batch_id`` of query ``query``: committed
    offsets on partition 0 of a topic, one past the last batch whose transaction
    committed, with the batch, its record count and the query in their metadata. Its
    consumer (of that group, assign-only, read_committed) may read other partitions too."""

    def __init__(self, options: KafkaOptions, prefix: str, group: str, query: str,
                 batch_id: int) -> None:
        self.prefix = prefix
        self.group = group
        self.query = query
        self.batch_id = batch_id
        self.consumer = clients.consumer(options, isolation_level="read_committed",
                                         group=group)

    def written(self, topic: str) -> bool:
        """Whether the batch is written already, by the marker on ``topic`` partition 0
        (read with require_stable). A marker of another query, or of a later batch than
        a replay of this one explains, is refused."""
        where = confluent_kafka.TopicPartition(topic, 0)
        found = self.consumer.committed([where], timeout=TIMEOUT_SECONDS)[0]
        if found.error is not None:
            raise RuntimeError(f"edgekafka sink: reading the batch marker of "
                               f"{self.group}: {found.error}")
        if int(found.offset) < 0:
            return False
        fields = _marker_fields(found.metadata)
        owner = fields.get("query")  # None: a marker of a version that did not name it
        if owner is not None and owner != self.query:
            raise RuntimeError(
                f"edgekafka sink: transactionalIdPrefix {self.prefix} is in use by query "
                f"{owner} (the batch marker of group {self.group} on {topic}-0 names it; "
                f"this query is {self.query}): give this query another "
                f"transactionalIdPrefix, or delete the consumer group {self.group} if "
                f"query {owner} is gone for good")
        last = int(found.offset) - 1
        if last > self.batch_id:
            raise RuntimeError(
                f"edgekafka sink: the batch marker of group {self.group} on {topic}-0 says "
                f"batch {last} of query {self.query} is written, but the query is at batch "
                f"{self.batch_id}: its checkpoint is older than its output (restored from "
                f"a copy?). Start the query on a new checkpoint with another "
                f"transactionalIdPrefix, or delete the consumer group {self.group}")
        return last == self.batch_id

    def commit(self, producer: confluent_kafka.Producer, topic: str, count: int) -> None:
        """Add the marker on ``topic`` partition 0 to ``producer``'s open transaction and
        commit it."""
        offset = confluent_kafka.TopicPartition(
            topic, 0, self.batch_id + 1, metadata=json.dumps(
                {"batch": self.batch_id, "records": count, "query": self.query}))
        producer.send_offsets_to_transaction(
            [offset], self.consumer.consumer_group_metadata(), TIMEOUT_SECONDS)
        producer.commit_transaction(TIMEOUT_SECONDS)

    def close(self) -> None:
        self.consumer.close()


def write_once(options: KafkaOptions, rows: Iterator[Row]) -> tuple[int, bool]:
    """``atomicity=partition``: write the running task's ``rows`` in its transaction
    unless an earlier run committed them; the number of records written and whether the
    batch was skipped as already written.

    The marker is on partition 0 of the ``topic`` option, read before writing; without
    that option, on partition 0 of the smallest topic the task's rows name, which is known
    only once they are all written, so the marker is read then and a batch found written
    is aborted (a replay with its rows in another order finds the same marker)."""
    link = executor_link()
    first = next(rows, None)
    if first is None:
        return 0, False
    prefix = query_prefix(options)
    name = f"{prefix}-{running_task().partitionId()}"
    topics: set[str] = set()

    def noted(row: Row) -> Row:
        topics.add(topic_of(row, options))
        return row

    def write_all() -> int:
        count = produce_all(producer, options, map(noted, chain([first], rows)))
        if input_cut(link):
            raise RuntimeError(f"edgekafka sink: the input of {name} ended early (the "
                               f"executor closed it after {count} rows): not committed")
        return count

    def write_then_mark() -> tuple[int, bool]:
        count = write_all()
        topic = fixed or min(topics)
        if fixed is None and marker.written(topic):
            producer.abort_transaction(TIMEOUT_SECONDS)
            return 0, True
        marker.commit(producer, topic, count)
        return count, False

    marker = Marker(options, prefix, name, task_query_id(), task_batch_id())
    fixed = options.write_topic
    try:
        producer = clients.producer(options, transactional_id=name)
        producer.init_transactions(TIMEOUT_SECONDS)
        if fixed is not None and marker.written(fixed):
            for _row in rows:  # Spark streams the rest to this worker: take it in
                pass
            skipped = True
        else:
            written, skipped = in_transaction(producer, name, write_then_mark)
            if not skipped:
                return written, False
        log.info("edgekafka sink: batch %d of %s was committed by an earlier run: "
                 "skipped", marker.batch_id, name)
        return 0, True
    finally:
        marker.close()
