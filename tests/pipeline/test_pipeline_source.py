"""Pipeline acceptance 2, 3 and 4 in batch: explicit offset ranges, data loss below the
log start, read_committed over committed and aborted transactions, the sink, and an
OAUTHBEARER login through the project's login callback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from oauth.dev_issuer import DevIssuer
from tests.broker_process import BrokerProcess
from tests.clients import create_topic
from tests.oauth_helpers import credentials_url, oauth_file, start_broker
from tests.pipeline_helpers import consume, make_spark, produce, reader


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    yield from make_spark()


def value_of(partition: int, index: int) -> bytes:
    return f"p{partition}-r{index}".encode()


def test_explicit_offset_ranges(spark: SparkSession, broker: BrokerProcess,
                                topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, 3)
    produce(broker.bootstrap, topic_name,
            [(p, f"k{i}".encode(), value_of(p, i)) for i in range(30) for p in range(3)])
    frame = reader(spark, broker.bootstrap, subscribe=topic_name,
                   startingOffsets=f'{{"{topic_name}": {{"0": 5, "1": -2, "2": 10}}}}',
                   endingOffsets=f'{{"{topic_name}": {{"0": 15, "1": 7, "2": -1}}}}').load()
    rows = frame.collect()
    got = sorted((r.partition, r.offset, r.value) for r in rows)
    expected = sorted([(0, o, value_of(0, o)) for o in range(5, 15)]
                      + [(1, o, value_of(1, o)) for o in range(0, 7)]
                      + [(2, o, value_of(2, o)) for o in range(10, 30)])
    assert got == expected
    first = next(r for r in rows if (r.partition, r.offset) == (0, 5))
    assert first.key == b"k5" and first.topic == topic_name
    assert first.timestampType == 0 and first.timestamp is not None
    assert first.headers is None
    assert [f.name for f in frame.schema.fields] == [
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType",
        "headers"]
    everything = reader(spark, broker.bootstrap, subscribePattern=f"{topic_name[:20]}.*").load()
    assert everything.where(F.col("topic") == topic_name).count() == 90


def test_range_below_log_start_is_data_loss(spark: SparkSession, broker: BrokerProcess,
                                            topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, 2)
    produce(broker.bootstrap, topic_name,
            [(p, None, value_of(p, i)) for i in range(20) for p in range(2)])
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    deleted = admin.delete_records([confluent_kafka.TopicPartition(topic_name, 0, 12)])
    for future in deleted.values():
        future.result(10)
    ranges = {"startingOffsets": f'{{"{topic_name}": {{"0": 5, "1": 0}}}}',
              "endingOffsets": f'{{"{topic_name}": {{"0": 16, "1": 4}}}}'}
    with pytest.raises(Exception, match="edgekafka data loss") as failure:
        reader(spark, broker.bootstrap, subscribe=topic_name, **ranges).load().collect()
    text = str(failure.value)
    assert f"{topic_name}-0: offsets [5, 12) are no longer in the log" in text
    assert "failOnDataLoss=false" in text
    rows = reader(spark, broker.bootstrap, subscribe=topic_name, failOnDataLoss="false",
                  **ranges).load().collect()
    assert sorted((r.partition, r.offset) for r in rows) == \
        [(0, o) for o in range(12, 16)] + [(1, o) for o in range(4)]
    # Spark's default range starts at the log start, so it loses nothing.
    assert reader(spark, broker.bootstrap, subscribe=topic_name).load().count() == 8 + 20


def test_read_committed_sees_exactly_the_committed_records(
        spark: SparkSession, broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, 2)
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap,
                                         "transactional.id": f"tx-{topic_name}"})
    producer.init_transactions(10)
    committed: list[bytes] = []
    aborted: list[bytes] = []
    transactions = 0
    for txn in range(8):
        producer.begin_transaction()
        values = [f"t{txn}-{i}".encode() for i in range(5 + txn)]
        for i, value in enumerate(values):
            producer.produce(topic_name, value, partition=(txn + i) % 2)
        transactions += 1
        if txn % 3 == 1:
            producer.flush(10)  # aborted data reaches the log
            producer.abort_transaction(10)
            aborted += values
        else:
            producer.commit_transaction(10)
            committed += values
    producer.begin_transaction()  # left open: beyond the last stable offset
    producer.produce(topic_name, b"open", partition=0)
    producer.flush(10)

    rows = reader(spark, broker.bootstrap, subscribe=topic_name).load().collect()
    assert sorted(r.value for r in rows) == sorted(committed)
    uncommitted = reader(spark, broker.bootstrap, subscribe=topic_name,
                         isolationLevel="read_uncommitted").load().collect()
    assert sorted(r.value for r in uncommitted) == sorted(committed + aborted + [b"open"])

    # Every offset below the last stable offset is a record read, an aborted record or
    # a marker (one per transaction and partition); nothing else is missing.
    watcher = confluent_kafka.Consumer({"bootstrap.servers": broker.bootstrap,
                                        "group.id": "lso", "isolation.level": "read_committed"})
    for partition in range(2):
        seen = {r.offset for r in rows if r.partition == partition}
        dropped = {r.offset for r in uncommitted
                   if r.partition == partition and r.value in set(aborted)}
        _low, last_stable = watcher.get_watermark_offsets(
            confluent_kafka.TopicPartition(topic_name, partition), 10)
        assert max(seen) < last_stable
        markers = set(range(last_stable)) - seen - dropped
        assert len(markers) == transactions, (partition, sorted(markers))
        assert not seen & dropped
    watcher.close()
    producer.commit_transaction(10)
    after = reader(spark, broker.bootstrap, subscribe=topic_name).load()
    assert after.where(F.col("value") == b"open").count() == 1


def test_sink_writes_complete_and_in_order(spark: SparkSession, broker: BrokerProcess,
                                           topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, 3)
    frame = (spark.range(3000)
             .select(F.concat(F.lit("k"), F.col("id").cast("string")).alias("key"),
                     F.concat(F.lit("v"), F.col("id").cast("string")).cast("binary")
                     .alias("value"),
                     (F.col("id") % 3).cast("int").alias("partition"),
                     F.array(F.struct(F.lit("id").alias("key"),
                                      F.col("id").cast("string").cast("binary")
                                      .alias("value"))).alias("headers"), "id")
             .repartition(2, "partition").sortWithinPartitions("id").drop("id"))
    (frame.write.format("edgekafka").mode("append")
     .option("kafka.bootstrap.servers", broker.bootstrap).option("topic", topic_name).save())
    got = consume(broker.bootstrap, topic_name, 3, 3000)
    assert len(got) == 3000
    for partition in range(3):
        mine = sorted((m for m in got if m.partition() == partition), key=lambda m: m.offset())
        ids = [int(m.value()[1:]) for m in mine]
        assert ids == list(range(partition, 3000, 3))
        assert [m.offset() for m in mine] == list(range(len(mine)))
        assert all(m.key() == b"k%d" % i for m, i in zip(mine, ids, strict=True))
        assert all(m.headers() == [("id", str(i).encode())]
                   for m, i in zip(mine, ids, strict=True))
    with pytest.raises(Exception, match="needs a 'value' column"):
        (spark.range(3).write.format("edgekafka").mode("append")
         .option("kafka.bootstrap.servers", broker.bootstrap).option("topic", topic_name).save())
    with pytest.raises(Exception, match="only appends"):
        (frame.write.format("edgekafka").mode("overwrite")
         .option("kafka.bootstrap.servers", broker.bootstrap).option("topic", topic_name).save())


def test_bad_options_are_named(spark: SparkSession, broker: BrokerProcess) -> None:
    with pytest.raises(Exception, match="give exactly one of the options subscribe"):
        reader(spark, broker.bootstrap).load().collect()
    with pytest.raises(Exception, match="startingOffsets must be earliest, latest or JSON"):
        reader(spark, broker.bootstrap, subscribe="x", startingOffsets="soon").load().collect()


def test_oauthbearer_login_callback(spark: SparkSession, issuer: DevIssuer,
                                    tmp_path: Path) -> None:
    broker = start_broker(tmp_path, oauth_file(tmp_path, issuer.url))
    try:
        options = {"oauth.issuerUrl": issuer.url,
                   "oauth.credentialsUrl": credentials_url("acme-app", "acme-secret"),
                   "oauth.audience": "edge-broker"}
        frame = spark.createDataFrame([(f"paid {i}",) for i in range(5)], "value string")
        (frame.write.format("edgekafka").mode("append").options(**options)
         .option("kafka.bootstrap.servers", broker.bootstrap).option("topic", "invoices")
         .save())
        rows = reader(spark, broker.bootstrap, subscribe="acme/default/invoices",
                      **options).load().collect()
        assert sorted(r.value for r in rows) == [f"paid {i}".encode() for i in range(5)]
    finally:
        broker.stop()
