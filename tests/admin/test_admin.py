"""Topic administration through confluent-kafka's AdminClient and kafka-python's admin client:
CreateTopics (validate-only, configs: those stock tools set, every key of Kafka's
TopicConfig), DeleteTopics, CreatePartitions, DescribeConfigs, the timestamp bounds of
produce (INVALID_TIMESTAMP), DescribeCluster, and KoP's tenant/namespace naming."""

from __future__ import annotations

import time

import confluent_kafka
import kafka.admin
import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic

from tests.broker_process import BrokerProcess
from tests.clients import consume_confluent, make_records, produce_confluent
from tests.compaction.test_compaction_configs import described

pytestmark = pytest.mark.storage_engines  # each test on file://, memory:// and postgres://


def admin(broker: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def error_name(exc: BaseException) -> str:
    assert isinstance(exc, KafkaException), exc
    return str(exc.args[0].name())


def test_create_validate_only_then_for_real(broker: BrokerProcess, topic_name: str) -> None:
    client = admin(broker)
    topic = NewTopic(topic_name, 4, 1, config={"retention.ms": "12345"})
    client.create_topics([topic], validate_only=True)[topic_name].result(10)
    assert topic_name not in client.list_topics(timeout=10).topics
    client.create_topics([topic])[topic_name].result(10)
    meta = client.list_topics(timeout=10).topics[topic_name]
    assert sorted(meta.partitions) == [0, 1, 2, 3]
    assert all(p.leader == 0 and p.replicas == [0] for p in meta.partitions.values())
    with pytest.raises(KafkaException) as again:
        client.create_topics([topic])[topic_name].result(10)
    assert error_name(again.value) == "TOPIC_ALREADY_EXISTS"


@pytest.mark.parametrize(("kwargs", "config", "expected"), [
    ({"num_partitions": 0}, {}, "INVALID_PARTITIONS"),
    ({"num_partitions": 1, "replication_factor": 3}, {}, "INVALID_REPLICATION_FACTOR"),
    ({"num_partitions": 1}, {"no.such.config": "1"}, "INVALID_CONFIG"),
    ({"num_partitions": 1}, {"retention.ms": "soon"}, "INVALID_CONFIG"),
])
def test_create_topic_errors(broker: BrokerProcess, topic_name: str, kwargs: dict[str, int],
                             config: dict[str, str], expected: str) -> None:
    client = admin(broker)
    future = client.create_topics([NewTopic(topic_name, config=config, **kwargs)])
    with pytest.raises(KafkaException) as failure:
        future[topic_name].result(10)
    assert error_name(failure.value) == expected


def test_describe_configs_shows_own_and_default_values(broker: BrokerProcess,
                                                       topic_name: str) -> None:
    client = admin(broker)
    client.create_topics([NewTopic(topic_name, 1, 1, config={
        "retention.ms": "60000", "message.timestamp.type": "LogAppendTime"})])[topic_name] \
        .result(10)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic_name)
    configs = client.describe_configs([resource])[resource].result(10)
    assert configs["retention.ms"].value == "60000"
    assert not configs["retention.ms"].is_default
    assert configs["message.timestamp.type"].value == "LogAppendTime"
    assert configs["segment.bytes"].value == "1073741824"
    assert configs["segment.bytes"].is_default
    broker_resource = ConfigResource(ConfigResource.Type.BROKER, "0")
    broker_configs = client.describe_configs([broker_resource])[broker_resource].result(10)
    assert broker_configs["broker.id"].value == "0"
    missing = ConfigResource(ConfigResource.Type.TOPIC, topic_name + "-missing")
    with pytest.raises(KafkaException) as failure:
        client.describe_configs([missing])[missing].result(10)
    assert error_name(failure.value) == "UNKNOWN_TOPIC_OR_PART"


STOCK_TOOL_CONFIGS = {  # what Strimzi, Kafka Streams, Connect and Terraform users set
    "cleanup.policy": "compact,delete", "message.timestamp.type": "CreateTime",
    "segment.bytes": "52428800", "retention.ms": "-1", "min.insync.replicas": "1",
    "unclean.leader.election.enable": "false", "preallocate": "false",
    "segment.jitter.ms": "60000", "segment.index.bytes": "1048576",
    "file.delete.delay.ms": "60000", "flush.messages": "10000", "flush.ms": "1000",
    "message.downconversion.enable": "true", "message.format.version": "3.0-IV1",
    "leader.replication.throttled.replicas": "*",
    "follower.replication.throttled.replicas": "0:0",
    "local.retention.ms": "-2", "local.retention.bytes": "-2",
    "remote.storage.enable": "false", "compression.zstd.level": "3",
    "message.timestamp.before.max.ms": "86400000",
    "message.timestamp.after.max.ms": "3600000",
    "message.timestamp.difference.max.ms": "86400000",
}


def test_stock_tools_topic_configs_are_taken_and_described(broker: BrokerProcess,
                                                           topic_name: str) -> None:
    client = admin(broker)
    client.create_topics([NewTopic(topic_name, 1, 1, config=STOCK_TOOL_CONFIGS)])[
        topic_name].result(10)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic_name)
    configs = client.describe_configs([resource])[resource].result(10)
    assert {name: configs[name].value for name in STOCK_TOOL_CONFIGS} == STOCK_TOOL_CONFIGS
    assert all(not configs[name].is_default for name in STOCK_TOOL_CONFIGS)
    assert set(configs["preallocate"].synonyms) == {"preallocate", "log.preallocate"}
    assert set(configs["remote.storage.enable"].synonyms) == {"remote.storage.enable"}
    assert configs["compression.gzip.level"].value == "-1"
    assert configs["compression.gzip.level"].is_default
    kinds = {name: kind for name, (_value, _source, kind) in described(
        broker, topic_name).items()}
    assert (kinds["preallocate"], kinds["flush.ms"], kinds["segment.index.bytes"],
            kinds["leader.replication.throttled.replicas"]) == (1, 5, 3, 7)
    tiered = NewTopic(topic_name + "-tiered", 1, 1, config={"remote.storage.enable": "true"})
    with pytest.raises(KafkaException) as refused:
        client.create_topics([tiered])[tiered.topic].result(10)
    assert error_name(refused.value) == "INVALID_CONFIG"


def test_timestamps_out_of_the_topics_bounds_are_invalid_timestamp(
        broker: BrokerProcess, topic_name: str) -> None:
    client = admin(broker)
    client.create_topics([NewTopic(topic_name, 1, 1, config={
        "message.timestamp.before.max.ms": "3600000",
        "message.timestamp.after.max.ms": "3600000"})])[topic_name].result(10)
    now = int(time.time() * 1000)
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap,
                                         "linger.ms": 0})
    outcomes: dict[bytes | None, confluent_kafka.KafkaError | None] = {}
    for value, timestamp in ((b"old", now - 7_200_000), (b"new", now + 7_200_000),
                             (b"good", now)):
        producer.produce(topic_name, value, partition=0, timestamp=timestamp,
                         on_delivery=lambda err, msg: outcomes.__setitem__(msg.value(), err))
        assert producer.flush(30) == 0  # one batch each
    codes = {value: None if err is None else err.code() for value, err in outcomes.items()}
    assert codes == {b"old": confluent_kafka.KafkaError.INVALID_TIMESTAMP,
                     b"new": confluent_kafka.KafkaError.INVALID_TIMESTAMP, b"good": None}
    (got,) = consume_confluent(broker.bootstrap, topic_name, 1, partitions=1)
    assert (got.offset, got.rec.value, got.rec.timestamp) == (0, b"good", now)


def test_log_append_time_topics_stamp_the_broker_time(broker: BrokerProcess,
                                                      topic_name: str) -> None:
    client = admin(broker)
    client.create_topics([NewTopic(topic_name, 3, 1, config={
        "message.timestamp.type": "LogAppendTime"})])[topic_name].result(10)
    recs = make_records(30, 1_000)  # ancient producer timestamps
    produce_confluent(broker.bootstrap, topic_name, recs, "none")
    got = consume_confluent(broker.bootstrap, topic_name, 30)
    assert len(got) == 30
    assert all(g.rec.timestamp > 1_600_000_000_000 for g in got)
    assert [g.rec.value for g in got if g.partition == 0] == \
        [r.value for r in recs if r.partition == 0]


def test_create_partitions_and_delete_topic(broker: BrokerProcess, topic_name: str) -> None:
    client = admin(broker)
    client.create_topics([NewTopic(topic_name, 2, 1)])[topic_name].result(10)
    client.create_partitions([NewPartitions(topic_name, 5)])[topic_name].result(10)
    assert len(client.list_topics(timeout=10).topics[topic_name].partitions) == 5
    with pytest.raises(KafkaException) as shrink:
        client.create_partitions([NewPartitions(topic_name, 3)])[topic_name].result(10)
    assert error_name(shrink.value) == "INVALID_PARTITIONS"
    produce_confluent(broker.bootstrap, topic_name,
                      [r for r in make_records(20, 1) if r.partition < 3], "none")
    client.delete_topics([topic_name])[topic_name].result(10)
    assert topic_name not in client.list_topics(timeout=10).topics
    with pytest.raises(KafkaException) as gone:
        client.delete_topics([topic_name])[topic_name].result(10)
    assert error_name(gone.value) == "UNKNOWN_TOPIC_OR_PART"
    # the name can be used again, and starts from offset 0
    client.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(10)
    consumer = confluent_kafka.Consumer({"bootstrap.servers": broker.bootstrap,
                                         "group.id": "x"})
    low, high = consumer.get_watermark_offsets(
        confluent_kafka.TopicPartition(topic_name, 0), timeout=10)
    consumer.close()
    assert (low, high) == (0, 0)


def test_one_request_creates_at_most_10000_partitions(broker: BrokerProcess,
                                                      topic_name: str) -> None:
    """Kafka's cap: a request asking for more answers POLICY_VIOLATION for every topic in
    it and creates nothing (one CreatePartitions of 2**31 - 1 used to try them all, found
    by tests/fuzz_requests.py)."""
    client = admin(broker)
    names = [f"{topic_name}-a", f"{topic_name}-b"]
    futures = client.create_topics([NewTopic(name, 5001, 1) for name in names])
    for name in names:
        with pytest.raises(KafkaException) as refused:
            futures[name].result(10)
        assert error_name(refused.value) == "POLICY_VIOLATION"
    assert not set(names) & set(client.list_topics(timeout=10).topics)
    client.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(10)
    for count in (10_002, 100_000):
        with pytest.raises(KafkaException) as grown:
            client.create_partitions([NewPartitions(topic_name, count)])[topic_name].result(10)
        assert error_name(grown.value) == "POLICY_VIOLATION"
    assert len(client.list_topics(timeout=10).topics[topic_name].partitions) == 1


def test_describe_cluster_names_this_broker(broker: BrokerProcess) -> None:
    confluent_admin = admin(broker)
    cluster = confluent_admin.describe_cluster().result(10)
    assert [(n.id, n.host, n.port) for n in cluster.nodes] == [(0, "127.0.0.1", broker.port)]
    assert cluster.controller.id == 0
    assert cluster.cluster_id
    client = kafka.admin.KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        described = client.describe_cluster()
        assert described["cluster_id"] == cluster.cluster_id
        assert [(b["broker_id"], b["port"]) for b in described["brokers"]] == [(0, broker.port)]
    finally:
        client.close()


def test_tenant_and_namespace_names(broker: BrokerProcess, topic_name: str) -> None:
    client = admin(broker)
    client.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(10)
    full = f"public/default/{topic_name}"
    pulsar = f"persistent://public/default/{topic_name}"
    produce_confluent(broker.bootstrap, topic_name, make_records(3, 5)[:1], "none")
    produce_confluent(broker.bootstrap, full, [make_records(3, 5)[0]], "none")
    produce_confluent(broker.bootstrap, pulsar, [make_records(3, 5)[0]], "none")
    got = consume_confluent(broker.bootstrap, full, 3, partitions=1)
    assert [g.offset for g in got] == [0, 1, 2]  # one topic, three names
    with pytest.raises(KafkaException) as exists:
        client.create_topics([NewTopic(full, 1, 1)])[full].result(10)
    assert error_name(exists.value) == "TOPIC_ALREADY_EXISTS"
    other = f"acme/prod/{topic_name}"
    client.create_topics([NewTopic(other, 2, 1)])[other].result(10)
    listed = client.list_topics(timeout=10).topics
    assert topic_name in listed                 # the default namespace, short names
    assert other not in listed and full not in listed
    assert len(client.list_topics(topic=other, timeout=10).topics[other].partitions) == 2
