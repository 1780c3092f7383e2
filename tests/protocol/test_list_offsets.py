"""Acceptance 2: ListOffsets earliest, latest, max timestamp and by timestamp, before and after
DeleteRecords and after retention removes ledgers (asked through librdkafka's AdminClient
and kafka-python's consumer)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import kafka
import pytest
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    OffsetSpec,
)

from tests.broker_process import BrokerProcess
from tests.clients import create_topic, present
from tests.conftest import check_engine_left, engine_settings

pytestmark = pytest.mark.storage_engines  # each test on file://, memory:// and postgres://

T0 = 1_600_000_000_000
BATCHES = 40
PER_BATCH = 5


@pytest.fixture(scope="module")
def ledger_broker(tmp_path_factory: pytest.TempPathFactory,
                  storage_engine: str) -> Iterator[BrokerProcess]:
    """A broker that checks retention every 200 ms."""
    data = Path(tmp_path_factory.mktemp("offsets")) / "data"
    process = BrokerProcess(data, {
        "logRetentionCheckIntervalMs": "200", **engine_settings(storage_engine),
    }).start()
    yield process
    process.stop()
    check_engine_left(data, storage_engine)


def produce_batches(bootstrap: str, topic: str, timestamps: list[int] | None = None) -> None:
    """BATCHES batches of PER_BATCH records; record i has timestamp T0 + 1000 * i unless given."""
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                         "linger.ms": 0})
    stamps = timestamps or [T0 + 1000 * i for i in range(BATCHES * PER_BATCH)]
    for i, stamp in enumerate(stamps):
        producer.produce(topic, value=b"x" * 100, key=str(i).encode(), partition=0,
                         timestamp=stamp)
        if i % PER_BATCH == PER_BATCH - 1:
            assert producer.flush(10) == 0
    assert producer.flush(10) == 0


def offsets(bootstrap: str, topic: str, spec: OffsetSpec) -> tuple[int, int]:
    """(offset, timestamp) from AdminClient.list_offsets for partition 0."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tp = confluent_kafka.TopicPartition(topic, 0)
    info = admin.list_offsets({tp: spec})[tp].result(10)
    return info.offset, info.timestamp


def by_time(bootstrap: str, topic: str, stamp: int) -> int:
    return offsets(bootstrap, topic, OffsetSpec.for_timestamp(stamp))[0]


def earliest(bootstrap: str, topic: str) -> int:
    return offsets(bootstrap, topic, OffsetSpec.earliest())[0]


def latest(bootstrap: str, topic: str) -> int:
    return offsets(bootstrap, topic, OffsetSpec.latest())[0]


def test_offsets_before_and_after_delete_records(ledger_broker: BrokerProcess,
                                                 topic_name: str) -> None:
    boot = ledger_broker.bootstrap
    create_topic(boot, topic_name, 1, {"segment.bytes": "2048"})
    total = BATCHES * PER_BATCH
    produce_batches(boot, topic_name)
    assert earliest(boot, topic_name) == 0
    assert latest(boot, topic_name) == total
    assert by_time(boot, topic_name, 0) == 0
    assert by_time(boot, topic_name, T0) == 0
    assert by_time(boot, topic_name, T0 + 1000 * 37) == 37     # exact record, mid-batch
    assert by_time(boot, topic_name, T0 + 1000 * 37 + 1) == 38
    assert by_time(boot, topic_name, T0 + 1000 * total) == -1  # after the last record
    assert offsets(boot, topic_name, OffsetSpec.max_timestamp()) == \
        (total - 1, T0 + 1000 * (total - 1))

    admin = AdminClient({"bootstrap.servers": boot})
    tp = confluent_kafka.TopicPartition(topic_name, 0, 103)
    deleted = admin.delete_records([tp])[tp].result(10)
    assert deleted.low_watermark == 103
    assert earliest(boot, topic_name) == 103
    assert latest(boot, topic_name) == total
    assert by_time(boot, topic_name, T0) == 103                # deleted records are skipped
    assert by_time(boot, topic_name, T0 + 1000 * 150) == 150
    assert offsets(boot, topic_name, OffsetSpec.max_timestamp())[0] == total - 1

    # kafka-python asks the same questions through its consumer
    consumer = kafka.KafkaConsumer(bootstrap_servers=boot, group_id=None)
    ktp = kafka.TopicPartition(topic_name, 0)
    assert consumer.beginning_offsets([ktp])[ktp] == 103
    assert consumer.end_offsets([ktp])[ktp] == total
    found = consumer.offsets_for_times({ktp: T0 + 1000 * 120})[ktp]
    assert (found.offset, found.timestamp) == (120, T0 + 1000 * 120)
    consumer.close()


def test_max_timestamp_is_the_exact_record(ledger_broker: BrokerProcess,
                                           topic_name: str) -> None:
    boot = ledger_broker.bootstrap
    create_topic(boot, topic_name, 1)
    stamps = [T0 + 10 * i for i in range(BATCHES * PER_BATCH)]
    stamps[57] = T0 + 10**9  # out of order, in the middle of a batch
    produce_batches(boot, topic_name, stamps)
    assert offsets(boot, topic_name, OffsetSpec.max_timestamp()) == (57, T0 + 10**9)
    assert by_time(boot, topic_name, T0 + 10**8) == 57


def test_max_timestamp_names_a_newer_transaction_marker(ledger_broker: BrokerProcess,
                                                        topic_name: str) -> None:
    """A commit marker, stamped by the coordinator after the records it ends, has the
    largest timestamp: MAX_TIMESTAMP names it, as Kafka (whose segments track every
    batch's max timestamp); it answered -1 on a log of five offsets. A lookup by a time
    past the records names it too (it answered -1)."""
    boot = ledger_broker.bootstrap
    create_topic(boot, topic_name, 1)
    now = int(time.time() * 1000)
    plain = confluent_kafka.Producer({"bootstrap.servers": boot, "linger.ms": 0})
    plain.produce(topic_name, value=b"plain", partition=0, timestamp=now - 60_000)
    assert plain.flush(10) == 0
    assert offsets(boot, topic_name, OffsetSpec.max_timestamp()) == (0, now - 60_000)
    txn = confluent_kafka.Producer({"bootstrap.servers": boot, "linger.ms": 0,
                                    "transactional.id": f"{topic_name}-txn"})
    txn.init_transactions(30)
    txn.begin_transaction()
    for i in range(3):
        txn.produce(topic_name, value=b"t%d" % i, partition=0, timestamp=now - 30_000 + i)
    txn.commit_transaction(30)
    offset, stamp = offsets(boot, topic_name, OffsetSpec.max_timestamp())
    assert (offset, latest(boot, topic_name)) == (4, 5)  # the marker, after records 1-3
    assert stamp >= now - 1000
    # by time, too, the marker is a record (Kafka's search walks every batch)
    assert by_time(boot, topic_name, now - 30_000 + 2) == 3
    assert by_time(boot, topic_name, now - 30_000 + 3) == 4
    assert by_time(boot, topic_name, stamp) == 4


def settled_log_start(bootstrap: str, topic: str) -> int:
    """The log start once retention has moved it and stopped moving it (checks run every
    200 ms, so an unchanged value over a second is settled)."""
    deadline = time.monotonic() + 20
    previous, stable_since = -1, time.monotonic()
    while time.monotonic() < deadline:
        current = earliest(bootstrap, topic)
        if current != previous:
            previous, stable_since = current, time.monotonic()
        elif current > 0 and time.monotonic() - stable_since > 1.0:
            return current
        time.sleep(0.2)
    return previous


def test_offsets_after_retention_removes_ledgers(ledger_broker: BrokerProcess,
                                                 topic_name: str) -> None:
    boot = ledger_broker.bootstrap
    create_topic(boot, topic_name, 1, {"segment.bytes": "2048", "retention.bytes": "6000"})
    total = BATCHES * PER_BATCH
    produce_batches(boot, topic_name)
    start = settled_log_start(boot, topic_name)
    assert 0 < start < total
    assert latest(boot, topic_name) == total
    assert by_time(boot, topic_name, T0) == start               # removed records are gone
    assert by_time(boot, topic_name, T0 + 1000 * (total - 2)) == total - 2
    ledger_broker.wait_for_log(r"retention removed \d+ ledgers")
    # the remaining records are still readable from the new log start
    consumer = confluent_kafka.Consumer({"bootstrap.servers": boot, "group.id": "x",
                                         "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition(topic_name, 0, start)])
    got: list[int] = []
    while len(got) < total - start:
        for msg in consumer.consume(500, 5.0):
            assert msg.error() is None
            got.append(present(msg.offset()))
    consumer.close()
    assert got == list(range(start, total))


def test_retention_by_time(ledger_broker: BrokerProcess, topic_name: str) -> None:
    boot = ledger_broker.bootstrap
    create_topic(boot, topic_name, 1, {"segment.bytes": "2048", "retention.ms": "1500"})
    total = BATCHES * PER_BATCH
    produce_batches(boot, topic_name)
    deadline = time.monotonic() + 20
    while earliest(boot, topic_name) == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    start = earliest(boot, topic_name)
    assert 0 < start <= total
    assert latest(boot, topic_name) == total


def test_retention_by_time_empties_an_idle_partition(ledger_broker: BrokerProcess,
                                                     topic_name: str) -> None:
    """As Kafka: once every record of an idle partition is past ``retention.ms`` (the
    segment appends go to included), the log start moves to the log end; a consumer from
    the beginning reads what comes next, and the idempotent producer that wrote the
    removed records goes on writing (its state outlives them)."""
    boot = ledger_broker.bootstrap
    create_topic(boot, topic_name, 1, {"retention.ms": "1500"})
    producer = confluent_kafka.Producer({"bootstrap.servers": boot, "linger.ms": 0,
                                         "enable.idempotence": True})
    for i in range(5):
        producer.produce(topic_name, value=b"old %d" % i, partition=0)
    assert producer.flush(10) == 0
    assert latest(boot, topic_name) == 5
    deadline = time.monotonic() + 30
    while earliest(boot, topic_name) < 5 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (earliest(boot, topic_name), latest(boot, topic_name)) == (5, 5)
    assert offsets(boot, topic_name, OffsetSpec.max_timestamp())[0] == -1
    keep = ConfigResource(ConfigResource.Type.TOPIC, topic_name, incremental_configs=[
        ConfigEntry("retention.ms", "-1", incremental_operation=AlterConfigOpType.SET)])
    admin = AdminClient({"bootstrap.servers": boot})
    for future in admin.incremental_alter_configs([keep]).values():
        future.result(10)  # what comes next stays until it is read
    delivered: list[int] = []
    producer.produce(topic_name, value=b"new", partition=0,
                     on_delivery=lambda err, msg: delivered.append(
                         -1 if err is not None else present(msg.offset())))
    assert producer.flush(10) == 0
    assert delivered == [5]
    consumer = confluent_kafka.Consumer({"bootstrap.servers": boot, "group.id": topic_name,
                                         "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition(
        topic_name, 0, confluent_kafka.OFFSET_BEGINNING)])
    got: list[tuple[int, bytes | None]] = []
    deadline = time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        for msg in consumer.consume(10, 1.0):
            assert msg.error() is None
            got.append((present(msg.offset()), msg.value()))
    consumer.close()
    assert got == [(5, b"new")]


def test_a_partition_named_twice_answers_invalid_request(ledger_broker: BrokerProcess,
                                                         topic_name: str) -> None:
    """As Kafka: each mention of a partition named twice in one ListOffsets answers
    INVALID_REQUEST (each mention of a lookup by time could walk a whole batch again);
    the other partitions are answered."""
    from kafka.protocol.consumer import ListOffsetsRequest, ListOffsetsResponse

    from tests.raw import RawConnection
    create_topic(ledger_broker.bootstrap, topic_name, 2)
    produce_batches(ledger_broker.bootstrap, topic_name)
    part = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition
    request = ListOffsetsRequest[7](replica_id=-1, isolation_level=0, topics=[
        ListOffsetsRequest.ListOffsetsTopic(name=topic_name, partitions=[
            part(partition_index=p, current_leader_epoch=-1, timestamp=T0)
            for p in (0, 1, 0)])])
    conn = RawConnection(ledger_broker.port)
    try:
        answer = conn.call(request, 7, ListOffsetsResponse)
    finally:
        conn.close()
    got = [(p.partition_index, p.error_code, p.offset)
           for p in answer.topics[0].partitions]
    assert got == [(0, 42, -1), (1, 0, -1), (0, 42, -1)]  # 1 holds nothing: not found


def test_latest_tiered_is_none_without_remote_storage(ledger_broker: BrokerProcess,
                                                      topic_name: str) -> None:
    """ListOffsets v9+ (KIP-1005; the Java Admin's ``OffsetSpec.latestTiered()``): no
    offset is tiered here, so -1, as Kafka answers for a topic without remote storage;
    v10's timeout is taken and the other lookups answer as before."""
    from kafka.protocol.consumer import ListOffsetsRequest, ListOffsetsResponse

    from tests.raw import RawConnection
    create_topic(ledger_broker.bootstrap, topic_name, 1)
    produce_batches(ledger_broker.bootstrap, topic_name)
    part = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition
    conn = RawConnection(ledger_broker.port)
    try:
        for version in (9, 10):
            fields = {"timeout_ms": 1000} if version >= 10 else {}
            request = ListOffsetsRequest[version](replica_id=-1, isolation_level=0, topics=[
                ListOffsetsRequest.ListOffsetsTopic(name=topic_name, partitions=[
                    part(partition_index=0, current_leader_epoch=-1, timestamp=-5)])],
                **fields)
            answer = conn.call(request, version, ListOffsetsResponse)
            [tiered] = answer.topics[0].partitions
            assert (tiered.error_code, tiered.offset, tiered.timestamp) == (0, -1, -1)
    finally:
        conn.close()
    assert latest(ledger_broker.bootstrap, topic_name) == BATCHES * PER_BATCH
