"""Issue 18, the Spark source over a compacted topic: once the broker's log cleaner has
removed superseded records, the offsets of the topic have gaps in the middle of its log.
The ``edgekafka`` source reads it with ``failOnDataLoss=true`` (batch, and streaming with
micro-batch ends falling inside removed ranges) and gets exactly what a plain consumer
gets, asking the broker for the log start once per range rather than once per gap; records
deleted below the log start of a compacted topic are still data loss."""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient
from pyspark.sql import SparkSession

from pipeline.fetch import DataLossError, OffsetRange, RangeReader
from pipeline.options import parse_options
from tests.broker_process import BrokerProcess
from tests.clients import create_topic
from tests.pipeline_helpers import make_spark, reader

CLEANER = {"logCleanerBackoffMs": "200", "logCleanerIoMaxBytesPerSecond": "0"}
COMPACTED = {"cleanup.policy": "compact,delete", "segment.bytes": "4096",
             "min.cleanable.dirty.ratio": "0.01"}
ROUNDS, KEYS = 40, 8
Record = tuple[int, bytes | None, bytes | None]
"""Offset, key, value."""


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    yield from make_spark()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker whose cleaner looks for work every 200 ms."""
    process = BrokerProcess(tmp_path_factory.mktemp("compacting") / "data", CLEANER).start()
    yield process
    process.stop()


def produce_versions(bootstrap: str, topic: str) -> int:
    """Key k gets a version per round while round < ROUNDS - 4k (so the latest versions lie
    all over the log), a flush per round (many small batches); the offset after the last
    record of round 20 (well inside the sealed segments)."""
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                                         "enable.idempotence": True})
    ends: list[int] = []

    def report(err: object, msg: confluent_kafka.Message) -> None:
        assert err is None, err
        ends.append((msg.offset() or 0) + 1)

    mark = 0
    for r in range(ROUNDS):
        for k in range(KEYS):
            if r < ROUNDS - 4 * k:
                producer.produce(topic, key=b"key-%d" % k, value=b"v%d-%d." % (r, k) + b"." * 100,
                                 partition=0, on_delivery=report)
        assert producer.flush(30) == 0
        if r == 20:
            mark = max(ends)
    return mark


def wait_cleaned_below(broker: BrokerProcess, topic: str, offset: int) -> None:
    """Until the cleaner reports a cleaning of ``topic`` up to ``offset`` at least."""
    pattern = re.compile(rf"log cleaner: cleaned \S*{re.escape(topic)}\S* below offset (\d+)")
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if any(int(m.group(1)) >= offset for m in map(pattern.search, list(broker.lines)) if m):
            return
        time.sleep(0.2)
    raise AssertionError(f"{topic} not cleaned below {offset}:\n{broker.log_text()}")


def read_plainly(bootstrap: str, topic: str) -> list[Record]:
    """Everything a plain consumer reads from offset 0 to the end."""
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": "compacted-test",
        "enable.auto.commit": False, "enable.partition.eof": True})
    consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
    got: list[Record] = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            for message in consumer.consume(1000, 0.5):
                error = message.error()
                if error is not None:
                    assert error.code() == confluent_kafka.KafkaError._PARTITION_EOF, error
                    return got
                got.append((message.offset() or 0, message.key(), message.value()))
    finally:
        consumer.close()
    raise AssertionError(f"no end of {topic} within 60 s")


def settled_read(broker: BrokerProcess, topic: str) -> list[Record]:
    """What a plain consumer reads once the cleaner is done with the topic: the cleaning
    waited for may be followed by more (of what was dirty after it; a loaded machine makes
    them come later), and the tests compare their reads with this one."""
    cleaned = re.compile(rf"log cleaner: cleaned \S*{re.escape(topic)}\S* below")
    deadline = time.monotonic() + 90
    while True:
        before = sum(1 for line in list(broker.lines) if cleaned.search(line))
        records = read_plainly(broker.bootstrap, topic)
        time.sleep(3)  # 15 of the cleaner's rounds
        if sum(1 for line in list(broker.lines) if cleaned.search(line)) == before:
            return records
        assert time.monotonic() < deadline, f"the cleaner kept cleaning {topic}"


class CountingReader(RangeReader):
    """A range reader that counts its questions about the log start."""

    asked = 0

    def log_start(self) -> int:
        self.asked += 1
        return super().log_start()


def read_with(bootstrap: str, where: OffsetRange, **options: str) -> tuple[list[Record], int]:
    """The records of ``where`` through :class:`RangeReader`, and its log-start questions."""
    parsed = parse_options({"kafka.bootstrap.servers": bootstrap, "subscribe": where.topic,
                            **options})
    range_reader = CountingReader(parsed, where)
    got = [(o, k, v) for batch in range_reader.batches() for o, k, v in zip(
        batch.column("offset").to_pylist(), batch.column("key").to_pylist(),
        batch.column("value").to_pylist(), strict=True)]
    return got, range_reader.asked


@pytest.fixture(scope="module")
def cleaned(broker: BrokerProcess) -> tuple[str, list[Record], int]:
    """A compacted topic cleaned with gaps in the middle: its name, what a plain consumer
    reads and the end of its log."""
    topic = "compacted-for-spark"
    create_topic(broker.bootstrap, topic, 1, COMPACTED)
    wait_cleaned_below(broker, topic, produce_versions(broker.bootstrap, topic))
    records = settled_read(broker, topic)
    offsets = [o for o, _k, _v in records]
    runs = sum(1 for a, b in itertools.pairwise(offsets) if b > a + 1)
    assert runs >= 3, offsets  # gaps between kept records, not just before the first
    assert len(records) < sum(max(0, ROUNDS - 4 * k) for k in range(KEYS))
    return topic, records, offsets[-1] + 1


def test_range_reader_takes_compacted_gaps_without_asking(
        broker: BrokerProcess, cleaned: tuple[str, list[Record], int]) -> None:
    topic, records, end = cleaned
    got, asked = read_with(broker.bootstrap, OffsetRange(topic, 0, 0, end, compacted=True))
    assert got == records
    assert asked == 1  # the check of the range's start, none per gap
    strict, asked = read_with(broker.bootstrap, OffsetRange(topic, 0, 0, end))
    assert strict == records  # a gap above the log start is not loss even when unmarked
    assert asked > 3


def test_spark_batch_and_stream_read_a_cleaned_topic(
        spark: SparkSession, broker: BrokerProcess, cleaned: tuple[str, list[Record], int],
        tmp_path: Path) -> None:
    topic, records, end = cleaned
    rows = reader(spark, broker.bootstrap, subscribe=topic, failOnDataLoss="true").load()
    assert sorted((r.offset, r.key, r.value) for r in rows.collect()) == records
    query = (spark.readStream.format("edgekafka").option("kafka.bootstrap.servers",
                                                         broker.bootstrap)
             .option("subscribe", topic).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", str(end // 4 + 1)).load()
             .select("offset", "key", "value").writeStream.format("parquet")
             .option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(300)
    assert query.exception() is None
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    assert len(batches) >= 2
    streamed = spark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted((r.offset, r.key, r.value) for r in streamed) == records


def test_deleted_records_of_a_compacted_topic_are_data_loss(
        broker: BrokerProcess, cleaned: tuple[str, list[Record], int]) -> None:
    topic, records, end = cleaned
    cut = records[len(records) // 2][0]
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.delete_records([confluent_kafka.TopicPartition(topic, 0, cut)]).values():
        future.result(30)
    where = OffsetRange(topic, 0, 0, end, compacted=True)
    with pytest.raises(DataLossError, match=rf"offsets \[0, {cut}\) are no longer in the log"):
        read_with(broker.bootstrap, where)
    got, _asked = read_with(broker.bootstrap, where, failOnDataLoss="false")
    assert got == [r for r in records if r[0] >= cut]
