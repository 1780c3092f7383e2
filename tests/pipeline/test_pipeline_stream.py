"""Pipeline acceptance 1 and the streaming side of 2-4: exactly-once into Parquet across
restarts from the checkpoint while records keep arriving, read limits with
Trigger.AvailableNow, transactions through the streaming sink, and data loss."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from tests.broker_process import BrokerProcess
from tests.clients import create_topic
from tests.pipeline_helpers import make_spark, produce, read_values

pytestmark = pytest.mark.long_running(minutes=3)


RECORDS = 50_000
PARTITIONS = 4


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    yield from make_spark()


def stream(spark: SparkSession, bootstrap: str, topic: str, **options: str) -> DataFrame:
    return (spark.readStream.format("edgekafka").option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic).option("startingOffsets", "earliest")
            .options(**options).load())


def to_parquet(frame: DataFrame, out: Path, checkpoint: Path, **trigger: object) -> StreamingQuery:
    return (frame.selectExpr("partition", "offset", "CAST(value AS STRING) AS value")
            .writeStream.format("parquet").option("path", str(out))
            .option("checkpointLocation", str(checkpoint)).trigger(**trigger).start())


def wait_for_batches(query: StreamingQuery, batches: int, timeout: float = 120) -> None:
    """Wait until ``batches`` micro-batches with rows have completed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [p for p in query.recentProgress if p["numInputRows"] > 0]
        if len(done) >= batches:
            return
        assert query.exception() is None, query.exception()
        time.sleep(0.2)
    raise AssertionError(f"fewer than {batches} batches in {timeout} s")


def test_exactly_once_across_restarts(spark: SparkSession, broker: BrokerProcess,
                                      topic_name: str, tmp_path: Path) -> None:
    create_topic(broker.bootstrap, topic_name, PARTITIONS)
    stopped = [threading.Event(), threading.Event()]
    done = threading.Event()
    failures: list[BaseException] = []

    def keep_producing() -> None:
        """1000 records every 0.2 s; the second and third phases start only after the
        first and second stop, so records arrive while each run of the query goes on."""
        try:
            for start in range(0, RECORDS, 1000):
                if start == 15_000:
                    stopped[0].wait(120)
                if start == 30_000:
                    stopped[1].wait(120)
                produce(broker.bootstrap, topic_name,
                        [(i % PARTITIONS, None, str(i).encode())
                         for i in range(start, start + 1000)])
                time.sleep(0.2)
        except BaseException as exc:  # pragma: no cover (reported below)
            failures.append(exc)
        finally:
            done.set()

    producer = threading.Thread(target=keep_producing, daemon=True)
    producer.start()
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run() -> StreamingQuery:
        return to_parquet(stream(spark, broker.bootstrap, topic_name,
                                 maxOffsetsPerTrigger="6000"),
                          out, checkpoint, processingTime="500 milliseconds")

    for event in stopped:  # stopped twice, possibly inside a micro-batch
        query = run()
        wait_for_batches(query, 2)
        query.stop()
        event.set()
    query = run()
    assert not done.is_set(), "records must still be arriving after the second restart"
    assert done.wait(120)
    producer.join()
    assert failures == []
    query.processAllAvailable()
    query.stop()
    rows = spark.read.parquet(str(out)).collect()
    assert len(rows) == RECORDS
    assert sorted(int(r.value) for r in rows) == list(range(RECORDS))
    assert len({(r.partition, r.offset) for r in rows}) == RECORDS


def test_read_limit_and_available_now(spark: SparkSession, broker: BrokerProcess,
                                      topic_name: str, tmp_path: Path) -> None:
    create_topic(broker.bootstrap, topic_name, 2)
    produce(broker.bootstrap, topic_name, [(i % 2, None, b"%d" % i) for i in range(1000)])
    query = to_parquet(stream(spark, broker.bootstrap, topic_name, maxOffsetsPerTrigger="300"),
                       tmp_path / "out", tmp_path / "checkpoint", availableNow=True)
    assert query.awaitTermination(120)  # AvailableNow ends by itself
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 1000 and max(sizes) <= 300 and len(sizes) >= 4
    last = query.recentProgress[-1]["sources"][0]
    assert json.loads(last["endOffset"]) == {topic_name: {"0": 500, "1": 500}}
    assert json.loads(last["latestOffset"]) == {topic_name: {"0": 500, "1": 500}}


def test_stream_transactions_into_the_sink(spark: SparkSession, broker: BrokerProcess,
                                           topic_name: str, tmp_path: Path) -> None:
    create_topic(broker.bootstrap, topic_name, 1)
    target = f"{topic_name}-copy"
    create_topic(broker.bootstrap, target, 1)
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap,
                                         "transactional.id": f"tx-{topic_name}"})
    producer.init_transactions(10)
    committed = []
    for txn in range(6):
        producer.begin_transaction()
        values = [f"{txn}-{i}".encode() for i in range(10)]
        for value in values:
            producer.produce(topic_name, value, partition=0)
        if txn % 2:
            producer.flush(10)
            producer.abort_transaction(10)
        else:
            producer.commit_transaction(10)
            committed += values
    query = (stream(spark, broker.bootstrap, topic_name, maxOffsetsPerTrigger="25")
             .selectExpr("key", "value")
             .writeStream.format("edgekafka").option("kafka.bootstrap.servers", broker.bootstrap)
             .option("topic", target).option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(120)
    assert query.exception() is None
    # to the end of the partition: a record written twice would show after the last
    assert read_values(broker.bootstrap, target, 1, "read_committed") == committed


def test_stream_data_loss(spark: SparkSession, broker: BrokerProcess, topic_name: str,
                          tmp_path: Path) -> None:
    create_topic(broker.bootstrap, topic_name, 1)
    produce(broker.bootstrap, topic_name, [(0, None, b"%d" % i) for i in range(100)])
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.delete_records(
            [confluent_kafka.TopicPartition(topic_name, 0, 40)]).values():
        future.result(10)
    start = f'{{"{topic_name}": {{"0": 10}}}}'
    failing = to_parquet(stream(spark, broker.bootstrap, topic_name, startingOffsets=start),
                         tmp_path / "a", tmp_path / "a-cp", availableNow=True)
    with pytest.raises(Exception, match=r"edgekafka data loss"):
        failing.awaitTermination(120)
    skipping = to_parquet(stream(spark, broker.bootstrap, topic_name, startingOffsets=start,
                                 failOnDataLoss="false"),
                          tmp_path / "b", tmp_path / "b-cp", availableNow=True)
    assert skipping.awaitTermination(120)
    offsets = sorted(r.offset for r in spark.read.parquet(str(tmp_path / "b")).collect())
    assert offsets == list(range(40, 100))
