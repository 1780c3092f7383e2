"""Topic configs changed at run time: IncrementalAlterConfigs and AlterConfigs through
confluent-kafka's and kafka-python's admin clients, the change visible in DescribeConfigs
and in what the broker does next, kept across a restart; every refusal with its error."""

from __future__ import annotations

from pathlib import Path

import kafka.admin
import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from broker_core.storage import LogConfig, open_storage
from tests.broker_process import BrokerProcess
from tests.raw import RawConnection

pytestmark = pytest.mark.storage_engines  # each test on file://, memory:// and postgres://

TOPIC = ConfigResource.Type.TOPIC


def admin(broker: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def create(broker: BrokerProcess, topic: str, **config: str) -> None:
    client = admin(broker)
    client.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(10)


def describe(broker: BrokerProcess, topic: str) -> dict[str, tuple[str, bool]]:
    """{name: (value, is_default)} of the topic's configs."""
    resource, client = ConfigResource(TOPIC, topic), admin(broker)
    found = client.describe_configs([resource])[resource].result(10)
    return {name: (entry.value, entry.is_default) for name, entry in found.items()}


def incremental(broker: BrokerProcess, topic: str, *entries: ConfigEntry,
                validate_only: bool = False) -> None:
    resource = ConfigResource(TOPIC, topic, incremental_configs=list(entries))
    client = admin(broker)  # held: the futures fail if the client goes first
    futures = client.incremental_alter_configs([resource], validate_only=validate_only)
    futures[resource].result(10)


def op(name: str, value: str | None, kind: AlterConfigOpType) -> ConfigEntry:
    return ConfigEntry(name, value, incremental_operation=kind)


def produce_one(broker: BrokerProcess, topic: str, size: int) -> str | None:
    """Produce one record of ``size`` bytes; the delivery error's name, None when stored."""
    producer = Producer({"bootstrap.servers": broker.bootstrap, "message.max.bytes": 10_000_000,
                         "retries": 0})
    errors: list[str | None] = []
    producer.produce(topic, b"x" * size, partition=0,
                     on_delivery=lambda err, _msg: errors.append(None if err is None
                                                                 else err.name()))
    producer.flush(10)
    assert len(errors) == 1
    return errors[0]


def error_of(call: object) -> str:
    assert callable(call)
    with pytest.raises(KafkaException) as failure:
        call()
    return str(failure.value.args[0].name())


def test_incremental_set_and_delete_take_effect_at_once(broker: BrokerProcess,
                                                        topic_name: str) -> None:
    create(broker, topic_name, **{"retention.ms": "600000"})
    assert produce_one(broker, topic_name, 20_000) is None
    incremental(broker, topic_name, op("max.message.bytes", "10000", AlterConfigOpType.SET),
                op("retention.ms", "90000", AlterConfigOpType.SET))
    configs = describe(broker, topic_name)
    assert configs["max.message.bytes"] == ("10000", False)
    assert configs["retention.ms"] == ("90000", False)
    assert produce_one(broker, topic_name, 20_000) == "MSG_SIZE_TOO_LARGE"
    incremental(broker, topic_name, op("max.message.bytes", None, AlterConfigOpType.DELETE))
    configs = describe(broker, topic_name)
    assert configs["max.message.bytes"] == ("1048588", True)
    assert configs["retention.ms"] == ("90000", False)  # untouched by the other key's delete
    assert produce_one(broker, topic_name, 20_000) is None


def test_validate_only_changes_nothing(broker: BrokerProcess, topic_name: str) -> None:
    create(broker, topic_name)
    incremental(broker, topic_name, op("max.message.bytes", "100", AlterConfigOpType.SET),
                validate_only=True)
    assert describe(broker, topic_name)["max.message.bytes"] == ("1048588", True)
    assert produce_one(broker, topic_name, 1000) is None


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated:DeprecationWarning")
def test_alter_configs_replaces_the_whole_set(broker: BrokerProcess, topic_name: str) -> None:
    create(broker, topic_name, **{"retention.ms": "600000", "segment.bytes": "1048576"})
    resource = ConfigResource(TOPIC, topic_name, set_config={"retention.bytes": "5000000"})
    client = admin(broker)
    client.alter_configs([resource])[resource].result(10)
    configs = describe(broker, topic_name)
    assert configs["retention.bytes"] == ("5000000", False)
    assert configs["retention.ms"] == ("604800000", True)  # left out: back to the default
    assert configs["segment.bytes"] == ("1073741824", True)


def test_kafka_python_alters_incrementally_and_with_the_old_api(broker: BrokerProcess,
                                                                topic_name: str) -> None:
    create(broker, topic_name, **{"retention.ms": "600000"})
    client = kafka.admin.KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        resource = kafka.admin.ConfigResource(kafka.admin.ConfigResourceType.TOPIC, topic_name,
                                              configs={"message.timestamp.type":
                                                       "LogAppendTime"})
        client.alter_configs([resource], incremental=True)
        configs = describe(broker, topic_name)
        assert configs["message.timestamp.type"] == ("LogAppendTime", False)
        assert configs["retention.ms"] == ("600000", False)
        resource = kafka.admin.ConfigResource(kafka.admin.ConfigResourceType.TOPIC, topic_name,
                                              configs={"segment.ms": "3600000"})
        client.alter_configs([resource], incremental=False)
        configs = describe(broker, topic_name)
        assert configs["segment.ms"] == ("3600000", False)
    finally:
        client.close()


@pytest.mark.parametrize(("entry", "expected"), [
    (("no.such.config", "1", AlterConfigOpType.SET), "INVALID_CONFIG"),
    (("retention.ms", "soon", AlterConfigOpType.SET), "INVALID_CONFIG"),
    (("segment.bytes", "10", AlterConfigOpType.SET), "INVALID_CONFIG"),
    (("retention.ms", "5", AlterConfigOpType.APPEND), "INVALID_CONFIG"),
    (("cleanup.policy", "delete", AlterConfigOpType.SUBTRACT), "INVALID_CONFIG"),
    (("cleanup.policy", "archive", AlterConfigOpType.APPEND), "INVALID_CONFIG"),
    (("no.such.config", None, AlterConfigOpType.DELETE), "INVALID_CONFIG"),
    # a regular expression with two ways to read each digit took minutes on this one
    (("min.cleanable.dirty.ratio", "1" * 30_000 + "x", AlterConfigOpType.SET),
     "INVALID_CONFIG"),
    (("segment.bytes", "1" * 5_000, AlterConfigOpType.SET), "INVALID_CONFIG"),  # int() refuses
    # no value is longer than 1 KiB: a tenant stored 30 MB per topic in the metadata
    (("retention.ms", "0" * 1_000_000 + "1000", AlterConfigOpType.SET), "INVALID_CONFIG"),
    (("cleanup.policy", "delete," * 200_000, AlterConfigOpType.SET), "INVALID_CONFIG"),
    (("cleanup.policy", "compact," * 200_000, AlterConfigOpType.APPEND), "INVALID_CONFIG"),
], ids=["unknown-key", "not-a-number", "below-minimum", "append-to-a-number",
        "policy-left-empty", "unsupported-policy", "delete-unknown-key", "long-decimal",
        "long-integer", "long-zeros", "long-list", "long-list-appended"])
def test_bad_changes_are_refused_and_change_nothing(
        broker: BrokerProcess, topic_name: str,
        entry: tuple[str, str | None, AlterConfigOpType], expected: str) -> None:
    create(broker, topic_name, **{"retention.ms": "600000"})
    good = op("max.message.bytes", "5000", AlterConfigOpType.SET)
    assert error_of(lambda: incremental(broker, topic_name, good, op(*entry))) == expected
    configs = describe(broker, topic_name)
    assert configs["retention.ms"] == ("600000", False)
    assert configs["max.message.bytes"] == ("1048588", True)  # all or nothing


def test_append_to_a_list_key_keeps_it_a_set(broker: BrokerProcess, topic_name: str) -> None:
    create(broker, topic_name)
    incremental(broker, topic_name, op("cleanup.policy", "delete", AlterConfigOpType.APPEND))
    assert describe(broker, topic_name)["cleanup.policy"] == ("delete", False)


def test_numbers_with_leading_zeros_are_kept_as_their_digits(
        broker: BrokerProcess, topic_name: str) -> None:
    """Kafka's parser takes any number of leading zeros; the broker keeps the number as
    its digits (what DescribeConfigs gives back, as Kafka does), so what reads it later
    (each Produce, the log cleaner) never meets 5,000 of them (``int`` refuses them)."""
    zeros = "0" * 1_000  # 5,000 broke every Produce; more than 1 KiB is refused now
    create(broker, topic_name, **{"segment.bytes": zeros + "1048576",
                                  "cleanup.policy": "delete, delete"})
    incremental(broker, topic_name,
                op("max.message.bytes", zeros + "100000", AlterConfigOpType.SET),
                op("min.insync.replicas", "+" + zeros + "1", AlterConfigOpType.SET))
    assert produce_one(broker, topic_name, 1000) is None
    assert produce_one(broker, topic_name, 200_000) == "MSG_SIZE_TOO_LARGE"
    configs = describe(broker, topic_name)
    assert {name: configs[name][0] for name in (
        "segment.bytes", "max.message.bytes", "min.insync.replicas", "cleanup.policy")} \
        == {"segment.bytes": "1048576", "max.message.bytes": "100000",
            "min.insync.replicas": "1", "cleanup.policy": "delete"}


def test_missing_topic_and_broker_configs(broker: BrokerProcess, topic_name: str) -> None:
    set_retention = op("retention.ms", "1000", AlterConfigOpType.SET)
    assert error_of(lambda: incremental(broker, topic_name + "-missing", set_retention)) == \
        "UNKNOWN_TOPIC_OR_PART"
    resource = ConfigResource(ConfigResource.Type.BROKER, "0",
                              incremental_configs=[op("log.retention.ms", "1000",
                                                      AlterConfigOpType.SET)])
    client = admin(broker)
    future = client.incremental_alter_configs([resource])[resource]
    assert error_of(lambda: future.result(10)) == "INVALID_REQUEST"


def test_altered_configs_survive_a_restart(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        create(broker, "kept")
        incremental(broker, "kept", op("max.message.bytes", "10000", AlterConfigOpType.SET))
        assert broker.stop() == 0
        broker.start()
        assert describe(broker, "kept")["max.message.bytes"] == ("10000", False)
        assert produce_one(broker, "kept", 20_000) == "MSG_SIZE_TOO_LARGE"
    finally:
        broker.kill()


def test_the_brokers_own_topics_keep_their_settings(broker: BrokerProcess) -> None:
    shrink = op("retention.ms", "1", AlterConfigOpType.SET)
    system = "persistent://public/__kafka/__consumer_offsets"
    # INVALID_TOPIC_EXCEPTION (17), which librdkafka calls TOPIC_EXCEPTION
    assert error_of(lambda: incremental(broker, system, shrink)) == "TOPIC_EXCEPTION"
    # the short name is a topic of the caller's own namespace, and there is none
    assert error_of(lambda: incremental(broker, "__consumer_offsets", shrink)) == \
        "UNKNOWN_TOPIC_OR_PART"


def test_metadata_does_not_create_the_brokers_own_topics(broker: BrokerProcess) -> None:
    """Auto-creation through Metadata stops at the broker's own topics, as CreateTopics
    does: one made that way would have the default retention and delete a tenant's group
    offsets and transaction states by age."""
    conn = RawConnection(broker.port)
    try:
        name = "persistent://acme/__kafka/__consumer_offsets"
        request = MetadataRequest[9](topics=[MetadataRequest.MetadataRequestTopic(name=name)],
                                     allow_auto_topic_creation=True,
                                     include_cluster_authorized_operations=False,
                                     include_topic_authorized_operations=False)
        answer = conn.call(request, 9, MetadataResponse)
        assert [t.error_code for t in answer.topics] == [3]  # UNKNOWN_TOPIC_OR_PARTITION
        assert "acme/__kafka/__consumer_offsets" not in admin(broker).list_topics(
            timeout=10).topics
    finally:
        conn.close()


def test_a_system_topic_that_could_expire_is_made_to_keep_its_records(tmp_path: Path) -> None:
    """A system topic created with a retention (by an older version) gets the retention
    of one the broker creates once its coordinator uses it."""
    data = tmp_path / "data"
    storage = open_storage(data.as_uri(), LogConfig())
    storage.create_topic("public/__kafka/__consumer_offsets", 1, {"retention.ms": "604800000"})
    storage.close()
    broker = BrokerProcess(data).start()
    try:
        create(broker, "t")
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g",
                             "enable.auto.commit": False})
        consumer.commit(offsets=[TopicPartition("t", 0, 0)], asynchronous=False)
        consumer.close()
        configs = describe(broker, "persistent://public/__kafka/__consumer_offsets")
        assert (configs["retention.ms"][0], configs["retention.bytes"][0]) == ("-1", "-1")
        assert broker.wait_for_log("system topic public/__kafka/__consumer_offsets had a "
                                   "retention")
    finally:
        broker.kill()
