"""``compression.type`` as Kafka has it: a topic created with a codec (through
confluent-kafka's AdminClient) stores every batch in that codec, whatever codec the
producer used (confluent-kafka and kafka-python), and all three clients read the records
back byte for byte; ``producer`` stores batches as sent; the broker default
``compressionType`` applies to topics without their own value and DescribeConfigs says
where a value comes from; a change applies to new batches only; idempotent and
transactional producers keep their sequences and transactions. What is stored is read raw,
batch by batch, with Fetch. Each test runs on every storage engine."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import kafka.admin
import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from tests.broker_process import BrokerProcess
from tests.clients import CONSUMERS, PRODUCERS, create_topic, make_records
from tests.conftest import check_engine_left, engine_settings
from tests.interop.test_clients_roundtrip import check_roundtrip
from tests.protocol.test_bad_input import produce
from tests.raw import RawConnection, fetch_request
from tests.txn_helpers import read_all

CODEC_IDS = {"none": 0, "uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
pytestmark = pytest.mark.storage_engines  # each test on file://, memory:// and postgres://

TOPIC = ConfigResource.Type.TOPIC
DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 4, 5
MESSAGE_TOO_LARGE = 10


@pytest.fixture(scope="module")
def zstd_broker(tmp_path_factory: pytest.TempPathFactory,
                storage_engine: str) -> Iterator[BrokerProcess]:
    """A broker whose topics store zstd unless they say otherwise."""
    data = Path(tmp_path_factory.mktemp("zstd-default")) / "data"
    process = BrokerProcess(data, {**engine_settings(storage_engine),
                                   "compressionType": "zstd"}).start()
    yield process
    process.stop()
    check_engine_left(data, storage_engine)


def stored_batches(broker: BrokerProcess, topic: str,
                   partitions: int) -> dict[int, list[DefaultRecordBatch]]:
    """Every batch the broker stores for each partition, as a raw Fetch returns it."""
    conn = RawConnection(broker.port)
    found: dict[int, list[DefaultRecordBatch]] = {}
    try:
        for partition in range(partitions):
            found[partition], offset = [], 0
            while True:
                answer = conn.call(fetch_request(topic, offset, partition=partition), 11,
                                   FetchResponse).responses[0].partitions[0]
                assert answer.error_code == 0, answer
                if offset >= answer.high_watermark:
                    break
                records = MemoryRecords(bytes(answer.records))
                while (batch := records.next_batch()) is not None:
                    assert isinstance(batch, DefaultRecordBatch)
                    assert batch.validate_crc()
                    found[partition].append(batch)
                    offset = batch.next_offset
    finally:
        conn.close()
    return found


def stored_codecs(broker: BrokerProcess, topic: str, partitions: int) -> list[int]:
    """The codec of every stored data batch, partition by partition, in offset order."""
    return [batch.compression_type for _, batches in
            sorted(stored_batches(broker, topic, partitions).items()) for batch in batches
            if not batch.is_control_batch]


def as_sent_by_librdkafka(codecs: list[int], codec: int) -> bool:
    """Whether ``codecs`` are what librdkafka sends with ``codec`` set: that codec, or none
    where compressing would not make a batch smaller (a batch of one small record, when a
    loaded machine splits a producer's records into many batches)."""
    return codec in codecs and set(codecs) <= {codec, 0}


def describe(broker: BrokerProcess, topic: str, name: str) -> tuple[str, int]:
    """(value, source) of one topic config."""
    resource = ConfigResource(TOPIC, topic)
    client = AdminClient({"bootstrap.servers": broker.bootstrap})  # held: futures need it
    found = client.describe_configs([resource])[resource].result(10)
    entry = found[name]
    return entry.value, int(entry.source)


def incremental(broker: BrokerProcess, topic: str, name: str, value: str) -> None:
    entry = ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(TOPIC, topic, incremental_configs=[entry])
    client = AdminClient({"bootstrap.servers": broker.bootstrap})
    client.incremental_alter_configs([resource])[resource].result(10)


def error_name(call: Any) -> str:
    with pytest.raises(KafkaException) as failure:
        call()
    return str(failure.value.args[0].name())


# producers' codecs per topic codec: every codec is both a source and a target somewhere
PRODUCED_WITH = {"uncompressed": ("zstd", "gzip"), "gzip": ("none", "lz4"),
                 "snappy": ("lz4", "zstd"), "lz4": ("snappy", "none"),
                 "zstd": ("gzip", "snappy")}


@pytest.mark.parametrize("topic_codec", sorted(PRODUCED_WITH))
def test_batches_are_stored_in_the_topics_codec_and_read_back_intact(
        broker: BrokerProcess, topic_name: str, topic_codec: str) -> None:
    create_topic(broker.bootstrap, topic_name, config={"compression.type": topic_codec})
    assert describe(broker, topic_name, "compression.type") == (topic_codec,
                                                                DYNAMIC_TOPIC_CONFIG)
    base_ts = int(time.time() * 1000) - 1_000_000
    records = make_records(600, base_ts)
    confluent_codec, kafka_python_codec = PRODUCED_WITH[topic_codec]
    PRODUCERS["confluent"](broker.bootstrap, topic_name, records[:300], confluent_codec)
    PRODUCERS["kafka-python"](broker.bootstrap, topic_name, records[300:], kafka_python_codec)
    codecs = stored_codecs(broker, topic_name, 3)
    assert codecs and set(codecs) == {CODEC_IDS[topic_codec]}
    for reader in sorted(CONSUMERS):
        check_roundtrip(CONSUMERS[reader](broker.bootstrap, topic_name, 600), 600, base_ts)


def test_producer_keeps_each_batch_as_sent(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name)
    assert describe(broker, topic_name, "compression.type") == ("producer", DEFAULT_CONFIG)
    base_ts = int(time.time() * 1000) - 1_000_000
    records = make_records(200, base_ts)
    PRODUCERS["confluent"](broker.bootstrap, topic_name, records[:100], "lz4")
    PRODUCERS["kafka-python"](broker.bootstrap, topic_name, records[100:], "gzip")
    by_partition = stored_batches(broker, topic_name, 3)
    for batches in by_partition.values():
        codecs = [batch.compression_type for batch in batches]
        # librdkafka's lz4 batches first, then kafka-python's gzip ones, kept as sent
        gzip_from = codecs.index(1)
        assert as_sent_by_librdkafka(codecs[:gzip_from], 3), codecs
        assert set(codecs[gzip_from:]) == {1}, codecs
    check_roundtrip(CONSUMERS["confluent"](broker.bootstrap, topic_name, 200), 200, base_ts)


def test_the_broker_default_applies_where_a_topic_sets_none(zstd_broker: BrokerProcess,
                                                            topic_name: str) -> None:
    defaulted, own = topic_name + "-default", topic_name + "-own"
    create_topic(zstd_broker.bootstrap, defaulted)
    create_topic(zstd_broker.bootstrap, own, config={"compression.type": "producer"})
    assert describe(zstd_broker, defaulted, "compression.type") == ("zstd",
                                                                   STATIC_BROKER_CONFIG)
    assert describe(zstd_broker, own, "compression.type") == ("producer",
                                                             DYNAMIC_TOPIC_CONFIG)
    base_ts = int(time.time() * 1000) - 1_000_000
    for topic in (defaulted, own):
        PRODUCERS["confluent"](zstd_broker.bootstrap, topic, make_records(90, base_ts), "gzip")
        check_roundtrip(CONSUMERS["aiokafka"](zstd_broker.bootstrap, topic, 90), 90, base_ts)
    assert set(stored_codecs(zstd_broker, defaulted, 3)) == {4}
    codecs = stored_codecs(zstd_broker, own, 3)
    assert as_sent_by_librdkafka(codecs, 1), codecs


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated:DeprecationWarning")
def test_a_change_applies_to_new_batches_only(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, partitions=1)
    base_ts = int(time.time() * 1000) - 1_000_000
    records = [r for r in make_records(450, base_ts) if r.partition == 0]  # 150
    PRODUCERS["confluent"](broker.bootstrap, topic_name, records[:50], "gzip")
    incremental(broker, topic_name, "compression.type", "lz4")
    PRODUCERS["confluent"](broker.bootstrap, topic_name, records[50:100], "gzip")
    client = kafka.admin.KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:  # the old AlterConfigs, which replaces the topic's whole set
        client.alter_configs([kafka.admin.ConfigResource(
            kafka.admin.ConfigResourceType.TOPIC, topic_name,
            configs={"compression.type": "uncompressed"})], incremental=False)
    finally:
        client.close()
    assert describe(broker, topic_name, "compression.type") == ("uncompressed",
                                                                DYNAMIC_TOPIC_CONFIG)
    PRODUCERS["kafka-python"](broker.bootstrap, topic_name, records[100:], "snappy")
    batches = stored_batches(broker, topic_name, 1)[0]
    by_codec = [(batch.compression_type, batch.next_offset) for batch in batches]
    assert 50 in {end for _, end in by_codec}  # no batch spans the change
    # the first 50 stay as sent
    assert as_sent_by_librdkafka([codec for codec, end in by_codec if end <= 50], 1)
    assert {codec for codec, end in by_codec if 50 < end <= 100} == {3}
    assert {codec for codec, end in by_codec if end > 100} == {0}
    for reader in sorted(CONSUMERS):
        got = CONSUMERS[reader](broker.bootstrap, topic_name, 150, partitions=1)
        assert [g.rec for g in got] == records and [g.offset for g in got] == list(range(150))


def test_unknown_values_are_invalid_config(broker: BrokerProcess, topic_name: str) -> None:
    for bad in ("brotli", "none", "GZIP", ""):
        assert error_name(lambda bad=bad: create_topic(
            broker.bootstrap, topic_name, config={"compression.type": bad})) == \
            "INVALID_CONFIG"
    create_topic(broker.bootstrap, topic_name, config={"compression.type": "gzip"})
    assert error_name(lambda: incremental(broker, topic_name, "compression.type",
                                          "Zstd")) == "INVALID_CONFIG"
    assert describe(broker, topic_name, "compression.type") == ("gzip", DYNAMIC_TOPIC_CONFIG)


def test_idempotent_producer_keeps_its_sequences(broker: BrokerProcess,
                                                  topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, config={"compression.type": "gzip"})
    base_ts = int(time.time() * 1000) - 1_000_000
    PRODUCERS["confluent"](broker.bootstrap, topic_name, make_records(900, base_ts), "lz4",
                           conf={"bootstrap.servers": broker.bootstrap,
                                 "enable.idempotence": True, "batch.num.messages": 50})
    for batches in stored_batches(broker, topic_name, 3).values():
        assert len(batches) > 1 and {b.compression_type for b in batches} == {1}
        assert len({(b.producer_id, b.producer_epoch) for b in batches}) == 1
        assert batches[0].producer_id >= 0 and batches[0].base_sequence == 0
        for before, after in itertools.pairwise(batches):
            assert after.base_sequence == before.base_sequence + before.last_offset_delta + 1
            assert after.base_offset == before.next_offset
    check_roundtrip(CONSUMERS["kafka-python"](broker.bootstrap, topic_name, 900), 900,
                    base_ts)


def test_transactions_into_a_recompressing_topic(broker: BrokerProcess,
                                                 topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, partitions=2,
                 config={"compression.type": "zstd"})
    producer = confluent_kafka.Producer({
        "bootstrap.servers": broker.bootstrap, "transactional.id": f"tid-{topic_name}",
        "compression.type": "snappy", "linger.ms": 5})
    producer.init_transactions(30)
    committed: list[bytes] = []
    for round_, commit in enumerate((True, False, True)):
        producer.begin_transaction()
        values = [f"r{round_}-{i}".encode() for i in range(120)]
        for i, value in enumerate(values):
            producer.produce(topic_name, key=b"k%d" % i, value=value, partition=i % 2)
        producer.flush(30)
        if commit:
            producer.commit_transaction(30)
            committed += values
        else:
            producer.abort_transaction(30)
    seen = read_all(broker.bootstrap, topic_name, 2, "read_committed")
    assert sorted(value for _, _, value in seen) == sorted(committed)
    everything = read_all(broker.bootstrap, topic_name, 2, "read_uncommitted")
    assert len(everything) == 360
    for batches in stored_batches(broker, topic_name, 2).values():
        data = [b for b in batches if not b.is_control_batch]
        assert {(b.compression_type, b.is_transactional) for b in data} == {(4, True)}
        assert sum(b.is_control_batch for b in batches) == 3  # commit, abort, commit
        for before, after in itertools.pairwise(batches):
            assert after.base_offset == before.next_offset  # contiguous, markers included


def _gzip_batch(count: int, value: bytes) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=1, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 22)
    for i in range(count):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=b"k", value=value, headers=[])
    return bytes(builder.build())


def test_a_batch_too_large_once_inflated_is_refused(broker: BrokerProcess,
                                                   topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, partitions=1,
                 config={"compression.type": "uncompressed", "max.message.bytes": "5000"})
    conn = RawConnection(broker.port)
    try:
        sent = _gzip_batch(50, b"x" * 1000)
        assert len(sent) < 5000
        refused: Any = produce(conn, topic_name, sent)
        assert refused.error_code == MESSAGE_TOO_LARGE
        stored: Any = produce(conn, topic_name, _gzip_batch(3, b"y" * 100))
        assert stored.error_code == 0
    finally:
        conn.close()
    assert stored_codecs(broker, topic_name, 1) == [0]


def test_log_append_time_is_stamped_on_the_recompressed_batch(broker: BrokerProcess,
                                                             topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, partitions=1,
                 config={"compression.type": "zstd",
                         "message.timestamp.type": "LogAppendTime"})
    conn = RawConnection(broker.port)
    try:
        answer: Any = produce(conn, topic_name, _gzip_batch(5, b"z" * 10))
    finally:
        conn.close()
    assert answer.error_code == 0 and answer.log_append_time_ms > 0
    (batch,) = stored_batches(broker, topic_name, 1)[0]
    assert (batch.compression_type, batch.timestamp_type) == (4, 1)
    assert batch.max_timestamp == answer.log_append_time_ms
    assert [record.timestamp for record in batch] == [answer.log_append_time_ms] * 5


UNSUPPORTED_COMPRESSION_TYPE = 76


def _zstd_batch() -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=4, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 20)
    builder.append(0, timestamp=1_700_000_000_000, key=b"k", value=b"v" * 1000, headers=[])
    built = bytes(builder.build())
    assert built[22] & 7 == 4  # compressed (kafka-python keeps a batch that would not shrink)
    return built


def _produce_at(conn: RawConnection, topic: str, records: bytes, version: int) -> int:
    data = ProduceRequest.TopicProduceData(name=topic, partition_data=[
        ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=records)])
    answer = conn.call(ProduceRequest[version](transactional_id=None, acks=-1,
                                               timeout_ms=5000, topic_data=[data]),
                       version, ProduceResponse)
    return int(answer.responses[0].partition_responses[0].error_code)


def _fetch_error_at(conn: RawConnection, topic: str, version: int) -> int:
    answer = conn.call(fetch_request(topic, 0), version, FetchResponse)  # v11's fields fit
    return int(answer.responses[0].partitions[0].error_code)


def test_clients_before_zstd_get_unsupported_compression_type(broker: BrokerProcess,
                                                              topic_name: str) -> None:
    """KIP-110, as Kafka: zstd batches need Produce v7, and a topic storing zstd needs
    Fetch v10; older requests get UNSUPPORTED_COMPRESSION_TYPE."""
    zstd_topic, plain = topic_name + "-zstd", topic_name + "-plain"
    create_topic(broker.bootstrap, zstd_topic, 1, config={"compression.type": "zstd"})
    create_topic(broker.bootstrap, plain, 1)
    conn = RawConnection(broker.port)
    try:
        assert _produce_at(conn, plain, _zstd_batch(), 6) == UNSUPPORTED_COMPRESSION_TYPE
        assert _produce_at(conn, plain, _zstd_batch(), 7) == 0
        assert _produce_at(conn, zstd_topic, _gzip_batch(3, b"v" * 100), 5) == 0  # into zstd
        assert _fetch_error_at(conn, zstd_topic, 9) == UNSUPPORTED_COMPRESSION_TYPE
        assert _fetch_error_at(conn, zstd_topic, 10) == 0
        assert _fetch_error_at(conn, plain, 9) == 0
    finally:
        conn.close()
