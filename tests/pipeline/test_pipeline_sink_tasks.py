"""The streaming sink's task and driver code against a real broker, without Spark's JVM:
each task runs under PySpark's task context as an executor's worker sets it (its Spark
partition, micro-batch and query id), holding an open socket as its link to the executor.
Batch markers are tied to their query and, with ``atomicity=partition``, found whatever
the order of a replay's rows; keyed rows land where Java's producer puts them."""

from __future__ import annotations

import socket

import pytest
from kafka.partitioner.default import murmur2
from pyspark.sql import Row

from pipeline import clients
from pipeline.exactly_once import write_once
from pipeline.options import parse_options
from pipeline.produce import ANY_PARTITION, Record, produce_records
from pipeline.staging import Staged, copy_batch, stage_rows
from tests.broker_process import BrokerProcess
from tests.clients import create_topic
from tests.pipeline_helpers import read_values, spark_task


def stage(options_rows: tuple[dict[str, str], list[Row]], bootstrap: str, batch: int,
          query: str) -> Staged:
    """Task 0 of ``batch`` of ``query`` stages ``rows``."""
    given, rows = options_rows
    options = parse_options({"kafka.bootstrap.servers": bootstrap, **given}, reading=False)
    with spark_task(0, batch, query):
        return stage_rows(options, iter(rows))


def test_batch_markers_belong_to_their_query(broker: BrokerProcess, topic_name: str) -> None:
    """A new query (fresh checkpoint) reusing a transactionalIdPrefix used to find the old
    query's marker for its batch 0 and skip the batch: nothing written, no error."""
    bootstrap, target = broker.bootstrap, f"{topic_name}-out"
    create_topic(bootstrap, target, 1)
    given = {"topic": target, "transactionalIdPrefix": f"{topic_name}-shared"}
    options = parse_options({"kafka.bootstrap.servers": bootstrap, **given}, reading=False)
    job = (given, [Row(value=b"v-%d" % i) for i in range(3)])

    assert copy_batch(options, [stage(job, bootstrap, 0, "query-a")], 0) == (3, False)
    assert copy_batch(options, [stage(job, bootstrap, 0, "query-a")], 0) == (0, True)
    with pytest.raises(RuntimeError, match=f"transactionalIdPrefix {topic_name}-shared is "
                       "in use by query query-a .* this query is query-b"):
        copy_batch(options, [stage(job, bootstrap, 0, "query-b")], 0)
    assert copy_batch(options, [stage(job, bootstrap, 5, "query-a")], 5) == (3, False)
    with pytest.raises(RuntimeError, match="says batch 5 of query query-a is written, but "
                       "the query is at batch 2"):
        copy_batch(options, [stage(job, bootstrap, 2, "query-a")], 2)
    assert len(read_values(bootstrap, target, 1, "read_committed")) == 6


def test_partition_markers_ignore_row_order_and_belong_to_their_query(
        broker: BrokerProcess, topic_name: str) -> None:
    """``atomicity=partition`` kept a task's marker on its first row's topic: a replay
    whose rows came in another order found none and wrote them all again."""
    bootstrap, x, y = broker.bootstrap, f"{topic_name}-x", f"{topic_name}-y"
    create_topic(bootstrap, x, 1)
    create_topic(bootstrap, y, 1)
    link, executor = socket.socketpair()  # the task's open link to its executor
    by_rows = parse_options({"kafka.bootstrap.servers": bootstrap, "atomicity": "partition",
                             "transactionalIdPrefix": f"{topic_name}-rows"}, reading=False)
    rows = ([Row(topic=x, value=b"x-%d" % i) for i in range(3)]
            + [Row(topic=y, value=b"y-%d" % i) for i in range(3)])
    with link, executor:
        with spark_task(0, 7, "query-a"):
            assert write_once(by_rows, iter(rows)) == (6, False)
        with spark_task(0, 7, "query-a"):  # the replay, its rows in another order
            assert write_once(by_rows, iter(rows[3:] + rows[:3])) == (0, True)
        with spark_task(0, 7, "query-b"), pytest.raises(RuntimeError, match="in use by"):
            write_once(by_rows, iter(rows))
        assert [len(read_values(bootstrap, t, 1, "read_committed")) for t in (x, y)] == [3, 3]

        by_option = parse_options({"kafka.bootstrap.servers": bootstrap, "topic": x,
                                   "atomicity": "partition",
                                   "transactionalIdPrefix": f"{topic_name}-option"},
                                  reading=False)
        plain = [Row(value=b"o-%d" % i) for i in range(2)]
        with spark_task(1, 0, "query-c"):
            assert write_once(by_option, iter(plain)) == (2, False)
        with spark_task(1, 0, "query-c"):  # the marker is read before writing anything
            assert write_once(by_option, iter(plain)) == (0, True)
    assert len(read_values(bootstrap, x, 1, "read_committed")) == 3 + 2
    assert read_values(bootstrap, x, 1, "read_uncommitted").count(b"o-0") == 1


def test_keyed_records_land_where_java_puts_them(broker: BrokerProcess,
                                                 topic_name: str) -> None:
    """librdkafka's default partitioner (CRC32) put 10 of these 12 keys elsewhere than
    Java's and Spark's Kafka sink (murmur2)."""
    create_topic(broker.bootstrap, topic_name, 6)
    options = parse_options({"kafka.bootstrap.servers": broker.bootstrap,
                             "topic": topic_name}, reading=False)
    got: list[tuple[bytes, int]] = []
    produce_records(clients.producer(options),
                    [Record(topic_name, ANY_PARTITION, b"user-%d" % i, b"v", None)
                     for i in range(12)],
                    lambda m: got.append((m.key() or b"", m.partition() or 0)))
    assert sorted(got) == sorted((key, (murmur2(key) & 0x7FFFFFFF) % 6) for key, _ in got)
    assert len(got) == 12
