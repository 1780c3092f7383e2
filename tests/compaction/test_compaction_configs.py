"""The topic configs of compaction as Kafka has them (the cleaner: test_compaction_*):
``cleanup.policy`` (``delete``, ``compact`` or both), ``min.cleanable.dirty.ratio``,
``min.compaction.lag.ms``, ``max.compaction.lag.ms``, ``delete.retention.ms``, with
``segment.ms``/``segment.bytes``, set at creation and with (Incremental)AlterConfigs, with
Kafka's types and ranges (INVALID_CONFIG outside them) and shown by DescribeConfigs with
their sources, types and broker synonyms. A topic whose policy includes ``compact``
refuses records without a key with INVALID_RECORD (87), as Kafka does, in every codec and
from every client; it keeps tombstones; DeleteRecords on a compact-only topic is
POLICY_VIOLATION and retention deletes nothing of it. Each test runs on every storage
engine."""

from __future__ import annotations

import time
from typing import Any

import confluent_kafka
import kafka
import kafka.errors
import pytest
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)
from kafka.protocol.admin import DescribeConfigsRequest, DescribeConfigsResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

from broker_core.storage import LogConfig, log_config_for_topic
from tests.broker_process import BrokerProcess
from tests.clients import CONSUMERS
from tests.protocol.test_bad_input import latest_offset, produce
from tests.raw import RawConnection

pytestmark = pytest.mark.storage_engines  # each test on file://, memory:// and postgres://

TOPIC = ConfigResource.Type.TOPIC
DYNAMIC_TOPIC_CONFIG, DEFAULT_CONFIG = 1, 5
TYPE_STRING, TYPE_INT, TYPE_LONG, TYPE_DOUBLE, TYPE_LIST = 2, 3, 5, 6, 7
INVALID_RECORD = 87
LONG_MAX = str(2**63 - 1)

DEFAULTS = {
    "cleanup.policy": ("delete", TYPE_LIST),
    "min.cleanable.dirty.ratio": ("0.5", TYPE_DOUBLE),
    "min.compaction.lag.ms": ("0", TYPE_LONG),
    "max.compaction.lag.ms": (LONG_MAX, TYPE_LONG),
    "delete.retention.ms": ("86400000", TYPE_LONG),
    "segment.ms": ("604800000", TYPE_LONG),
    "segment.bytes": ("1073741824", TYPE_INT),
}
SET = {"cleanup.policy": "compact,delete", "min.cleanable.dirty.ratio": "0.25",
       "min.compaction.lag.ms": "60000", "max.compaction.lag.ms": "3600000",
       "delete.retention.ms": "1000", "segment.ms": "600000", "segment.bytes": "1048576"}


def admin(broker: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def create(broker: BrokerProcess, topic: str, **config: str) -> None:
    client = admin(broker)  # held: the futures fail if the client goes first
    client.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(10)


def described(broker: BrokerProcess, topic: str) -> dict[str, tuple[str, int, int]]:
    """{name: (value, source, type)} of a topic's configs, by a raw DescribeConfigs v4."""
    conn = RawConnection(broker.port)
    try:
        request = DescribeConfigsRequest[4](resources=[
            DescribeConfigsRequest.DescribeConfigsResource(
                resource_type=2, resource_name=topic, configuration_keys=None)],
            include_synonyms=False, include_documentation=True)
        (result,) = conn.call(request, 4, DescribeConfigsResponse).results
    finally:
        conn.close()
    assert result.error_code == 0, result
    return {c.name: (c.value, c.config_source, c.config_type) for c in result.configs}


def incremental(broker: BrokerProcess, topic: str, *entries: tuple[str, str | None,
                                                                   AlterConfigOpType]) -> None:
    resource = ConfigResource(TOPIC, topic, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=kind) for name, value, kind in entries])
    client = admin(broker)
    client.incremental_alter_configs([resource])[resource].result(10)


def error_name(call: Any) -> str:
    with pytest.raises(KafkaException) as failure:
        call()
    return str(failure.value.args[0].name())


def test_defaults_and_values_set_at_creation(broker: BrokerProcess, topic_name: str) -> None:
    create(broker, topic_name + "-plain")
    plain = described(broker, topic_name + "-plain")
    for name, (value, kind) in DEFAULTS.items():
        assert plain[name] == (value, DEFAULT_CONFIG, kind), name
    create(broker, topic_name, **SET)
    configs = described(broker, topic_name)
    for name, value in SET.items():
        assert configs[name] == (value, DYNAMIC_TOPIC_CONFIG, DEFAULTS[name][1]), name


def test_the_broker_shows_kafkas_names_for_the_defaults(broker: BrokerProcess) -> None:
    resource = ConfigResource(ConfigResource.Type.BROKER, "0")
    client = admin(broker)
    configs = client.describe_configs([resource])[resource].result(10)
    assert configs["log.cleanup.policy"].value == "delete"
    assert configs["log.cleaner.min.cleanable.ratio"].value == "0.5"
    assert configs["log.cleaner.min.compaction.lag.ms"].value == "0"
    assert configs["log.cleaner.max.compaction.lag.ms"].value == LONG_MAX
    assert configs["log.cleaner.delete.retention.ms"].value == "86400000"
    assert configs["log.roll.ms"].value == "604800000"
    assert configs["message.max.bytes"].value == "1048588"
    assert configs["compression.type"].value == "producer"


@pytest.mark.parametrize(("name", "value"), [
    ("cleanup.policy", "archive"), ("cleanup.policy", ""), ("cleanup.policy", "compact;delete"),
    ("min.cleanable.dirty.ratio", "1.5"), ("min.cleanable.dirty.ratio", "-0.1"),
    ("min.cleanable.dirty.ratio", "half"), ("min.cleanable.dirty.ratio", "NaN"),
    ("min.compaction.lag.ms", "-1"), ("min.compaction.lag.ms", "1.5"),
    ("max.compaction.lag.ms", "0"), ("delete.retention.ms", "-1"),
    ("delete.retention.ms", "9223372036854775808"), ("segment.ms", "0"),
    ("segment.bytes", "2147483648"), ("segment.bytes", "1_000_000"),
])
def test_values_out_of_kafkas_ranges_are_invalid_config(broker: BrokerProcess,
                                                        topic_name: str, name: str,
                                                        value: str) -> None:
    assert error_name(lambda: create(broker, topic_name, **{name: value})) == "INVALID_CONFIG"
    create(broker, topic_name)
    set_it = (name, value, AlterConfigOpType.SET)
    assert error_name(lambda: incremental(broker, topic_name, set_it)) == "INVALID_CONFIG"
    assert described(broker, topic_name)[name][1] == DEFAULT_CONFIG  # unchanged


def test_min_compaction_lag_may_not_exceed_the_max(broker: BrokerProcess,
                                                   topic_name: str) -> None:
    assert error_name(lambda: create(broker, topic_name, **{
        "min.compaction.lag.ms": "100", "max.compaction.lag.ms": "50"})) == "INVALID_CONFIG"
    create(broker, topic_name, **{"min.compaction.lag.ms": "100"})
    lower_max = ("max.compaction.lag.ms", "50", AlterConfigOpType.SET)
    assert error_name(lambda: incremental(broker, topic_name, lower_max)) == "INVALID_CONFIG"
    incremental(broker, topic_name, ("max.compaction.lag.ms", "100", AlterConfigOpType.SET))
    assert described(broker, topic_name)["max.compaction.lag.ms"][0] == "100"


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated:DeprecationWarning")
def test_policy_set_appended_and_subtracted(broker: BrokerProcess, topic_name: str) -> None:
    create(broker, topic_name)
    incremental(broker, topic_name, ("cleanup.policy", "compact", AlterConfigOpType.APPEND))
    assert described(broker, topic_name)["cleanup.policy"][:2] == ("delete,compact",
                                                                   DYNAMIC_TOPIC_CONFIG)
    incremental(broker, topic_name, ("cleanup.policy", "delete", AlterConfigOpType.SUBTRACT),
                ("delete.retention.ms", "5000", AlterConfigOpType.SET))
    configs = described(broker, topic_name)
    assert configs["cleanup.policy"][0] == "compact"
    assert configs["delete.retention.ms"][:2] == ("5000", DYNAMIC_TOPIC_CONFIG)
    # the old AlterConfigs replaces the whole set (kafka-python would fill in the rest)
    resource = ConfigResource(TOPIC, topic_name, set_config={
        "cleanup.policy": "compact,delete", "min.cleanable.dirty.ratio": "0.9"})
    client = admin(broker)
    client.alter_configs([resource])[resource].result(10)
    configs = described(broker, topic_name)
    assert configs["cleanup.policy"][0] == "compact,delete"
    assert configs["min.cleanable.dirty.ratio"][:2] == ("0.9", DYNAMIC_TOPIC_CONFIG)
    assert configs["delete.retention.ms"][:2] == ("86400000", DEFAULT_CONFIG)


def _confluent_errors(broker: BrokerProcess, topic: str,
                      records: list[tuple[bytes | None, bytes | None]],
                      compression: str) -> list[str | None]:
    """Produce each (key, value) as its own batch; each delivery's error name or None."""
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap,
                                         "compression.type": compression, "linger.ms": 0,
                                         "retries": 0, "enable.idempotence": False})
    errors: list[str | None] = []
    for key, value in records:
        producer.produce(topic, key=key, value=value, partition=0,
                         on_delivery=lambda err, _m: errors.append(
                             None if err is None else err.name()))
        producer.flush(30)
    assert len(errors) == len(records)
    return errors


@pytest.mark.parametrize("policy", ["compact", "compact,delete"])
@pytest.mark.parametrize("compression", ["none", "gzip", "zstd"])
def test_records_without_a_key_are_refused_where_the_policy_compacts(
        broker: BrokerProcess, topic_name: str, policy: str, compression: str) -> None:
    create(broker, topic_name, **{"cleanup.policy": policy})
    records = [(b"k1", b"v1"), (None, b"no key"), (b"k1", None), (b"", b"empty key")]
    assert _confluent_errors(broker, topic_name, records, compression) == [
        None, "INVALID_RECORD", None, None]
    got = CONSUMERS["confluent"](broker.bootstrap, topic_name, 3, partitions=1)
    assert [(g.offset, g.rec.key, g.rec.value) for g in got] == [
        (0, b"k1", b"v1"), (1, b"k1", None), (2, b"", b"empty key")]  # tombstone kept


def test_kafka_python_gets_invalid_record(broker: BrokerProcess, topic_name: str) -> None:
    create(broker, topic_name, **{"cleanup.policy": "compact"})
    producer = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap, retries=0,
                                   compression_type="lz4", enable_idempotence=False)
    try:
        with pytest.raises(kafka.errors.InvalidRecordError):
            producer.send(topic_name, value=b"no key", partition=0).get(30)
        assert producer.send(topic_name, key=b"k", value=b"v", partition=0).get(30).offset == 0
    finally:
        producer.close()


def test_one_keyless_record_refuses_the_whole_batch(broker: BrokerProcess,
                                                    topic_name: str) -> None:
    create(broker, topic_name, **{"cleanup.policy": "compact"})
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 20)
    for i in range(5):
        builder.append(i, timestamp=int(time.time() * 1000), key=None if i == 3 else b"k",
                       value=b"v", headers=[])
    conn = RawConnection(broker.port)
    try:
        answer: Any = produce(conn, topic_name, bytes(builder.build()))
        assert answer.error_code == INVALID_RECORD
        assert "no key" in answer.error_message
        assert latest_offset(conn, topic_name) == 0
    finally:
        conn.close()


def test_a_delete_topic_takes_records_without_a_key(broker: BrokerProcess,
                                                    topic_name: str) -> None:
    create(broker, topic_name)
    assert _confluent_errors(broker, topic_name, [(None, b"v")], "lz4") == [None]
    got = CONSUMERS["kafka-python"](broker.bootstrap, topic_name, 1, partitions=1)
    keys: list[bytes | None] = [g.rec.key for g in got]  # the clients give None for none
    assert keys == [None] and [g.rec.value for g in got] == [b"v"]


def test_delete_records_is_a_policy_violation_on_a_compact_only_topic(
        broker: BrokerProcess, topic_name: str) -> None:
    for policy, expected in (("compact", "POLICY_VIOLATION"), ("compact,delete", None)):
        topic = f"{topic_name}-{policy.replace(',', '-')}"
        create(broker, topic, **{"cleanup.policy": policy})
        assert _confluent_errors(broker, topic, [(b"k", b"v"), (b"k", b"w")], "none") == \
            [None, None]
        client = admin(broker)
        future = client.delete_records([TopicPartition(topic, 0, 1)])[TopicPartition(topic, 0,
                                                                                     1)]
        if expected is None:
            assert future.result(10).low_watermark == 1
        else:
            assert error_name(lambda future=future: future.result(10)) == expected


def test_a_compact_only_topic_is_never_deleted_by_retention() -> None:
    base = LogConfig(retention_ms=1000, retention_bytes=5000)
    assert log_config_for_topic(base, {"cleanup.policy": "compact", "retention.ms": "10"}) == \
        LogConfig(retention_ms=-1, retention_bytes=-1)
    assert log_config_for_topic(base, {"cleanup.policy": "compact, delete"}) == base
    assert log_config_for_topic(base, {"cleanup.policy": "delete"}) == base


def test_a_compacted_topics_open_ledger_rolls_within_the_max_compaction_lag() -> None:
    """Kafka's maxSegmentMs (KIP-354): the open ledger is never cleaned, so a compacted
    topic rolls it after max.compaction.lag.ms when that is shorter than segment.ms."""
    base = LogConfig(segment_ms=60_000)
    lagged = {"cleanup.policy": "compact", "max.compaction.lag.ms": "5000"}
    assert log_config_for_topic(base, lagged).segment_ms == 5000
    assert log_config_for_topic(base, {**lagged, "segment.ms": "1000"}).segment_ms == 1000
    assert log_config_for_topic(base, {**lagged, "cleanup.policy": "delete"}).segment_ms \
        == 60_000
    assert log_config_for_topic(
        base, {**lagged, "max.compaction.lag.ms": "9223372036854775807"}).segment_ms == 60_000
