"""Shared pieces of the Spark pipeline tests: one small SparkSession per module, and
producers / consumers that talk to the test broker through confluent-kafka."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable, Iterator
from typing import Any

import confluent_kafka
from pyspark.sql import DataFrameReader, SparkSession

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
