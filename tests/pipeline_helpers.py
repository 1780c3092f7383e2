"""Shared pieces of the Spark pipeline tests: one small SparkSession per module,
producers / consumers that talk to the test broker through confluent-kafka, and the
context of a Spark task for driving the sink's task code without Spark's JVM."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import confluent_kafka
from pyspark import TaskContext
from pyspark.sql import DataFrameReader, SparkSession

from pipeline.exactly_once import BATCH_ID_PROPERTY, QUERY_ID_PROPERTY
from pipeline.spark_session import spark_session
from tests.security_helpers import SASL_AUTHENTICATION_FAILED, OpsConnection, plain_message

SPARK_CONFIG = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
}


def make_spark() -> Iterator[SparkSession]:
    """A local[2] session for one test module (stopped at its end)."""
    spark = spark_session("local[2]", app_name="edge-broker-pipeline-tests",
                          config=SPARK_CONFIG)
    spark.sparkContext.setLogLevel("ERROR")
    yield spark
    spark.stop()


def reader(spark: SparkSession, bootstrap: str, **options: str) -> DataFrameReader:
    """``spark.read.format("edgekafka")`` with the bootstrap and ``options``."""
    return spark.read.format("edgekafka").option("kafka.bootstrap.servers", bootstrap) \
        .options(**options)


def produce(bootstrap: str, topic: str, items: Iterable[tuple[int, bytes | None, bytes]],
            **config: Any) -> None:
    """Produce ``(partition, key, value)`` items and check every delivery."""
    errors: list[object] = []
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                         "linger.ms": 5, **config})

    def report(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    for partition, key, value in items:
        while True:
            try:
                producer.produce(topic, value=value, key=key, partition=partition,
                                 on_delivery=report)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert errors == []


def consume(bootstrap: str, topic: str, partitions: int, count: int, timeout: float = 60,
            **config: Any) -> list[confluent_kafka.Message]:
    """``count`` records from offset 0 of every partition (assign only)."""
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": "pipeline-tests",
        "enable.auto.commit": False, **config})
    consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(partitions)])
    got: list[confluent_kafka.Message] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < count and time.monotonic() < deadline:
            for message in consumer.consume(1000, 0.5):
                assert message.error() is None, message.error()
                got.append(message)
    finally:
        consumer.close()
    return got


def read_all(bootstrap: str, topic: str, partition: int, isolation: str) -> list[bytes]:
    """Every value of ``topic``-``partition`` a reader at ``isolation`` gets now: up to
    the end (the last stable offset) at read_committed, up to the high watermark of the
    moment at read_uncommitted (a partition written to all the time has no end)."""
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": "pipeline-tests",
        "enable.auto.commit": False, "enable.partition.eof": True,
        "isolation.level": isolation})
    where = confluent_kafka.TopicPartition(topic, partition, 0)
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        consumer.list_topics(topic, timeout=30)  # the partition's leader
        high = (consumer.get_watermark_offsets(where, timeout=30)[1]
                if isolation == "read_uncommitted" else None)
        if high == 0:
            return values
        consumer.assign([where])
        while time.monotonic() < deadline:
            for message in consumer.consume(1000, 0.5):
                error = message.error()
                if error is not None:
                    assert error.code() == confluent_kafka.KafkaError._PARTITION_EOF, error
                    return values
                value, offset = message.value(), message.offset()
                assert value is not None and offset is not None
                values.append(value)
                if high is not None and offset + 1 >= high:
                    return values
    finally:
        consumer.close()
    raise AssertionError(f"no end of {topic}-{partition} within 60 s")


def read_values(bootstrap: str, topic: str, partitions: int, isolation: str) -> list[bytes]:
    """Every value of every partition of ``topic`` a reader at ``isolation`` gets now."""
    return [v for p in range(partitions) for v in read_all(bootstrap, topic, p, isolation)]


@contextmanager
def spark_task(partition: int, batch: int, query: str) -> Iterator[TaskContext]:
    """PySpark's context of a streaming write task (Spark partition ``partition`` of
    micro-batch ``batch`` of query ``query``), as an executor's worker sets it."""
    TaskContext._setTaskContext(TaskContext(
        partitionId=partition, stageId=0, attemptNumber=0, taskAttemptId=0,
        localProperties={BATCH_ID_PROPERTY: str(batch), QUERY_ID_PROPERTY: query}))
    try:
        yield TaskContext._getOrCreate()
    finally:
        TaskContext._setTaskContext(None)


class LoginFrom(OpsConnection):
    """A raw connection from a chosen loopback address (127.0.0.x), so that audit events
    name different client hosts."""

    def __init__(self, port: int, source: str = "127.0.0.1", timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout,
                                             source_address=(source, 0))
        self.correlation_id = 0

    def failed_login(self, username: str, password: str) -> None:
        """A PLAIN login the broker refuses (it then closes the connection)."""
        assert self.handshake("PLAIN").error_code == 0
        answer = self.authenticate(plain_message(username, password))
        assert answer.error_code == SASL_AUTHENTICATION_FAILED, answer
        self.close()
