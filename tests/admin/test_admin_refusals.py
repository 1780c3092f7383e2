"""Admin requests Kafka refuses, answered as Kafka answers them: the order of CreateTopics'
checks, names and resources given twice, null config values, colliding topic names, replica
assignments; each refusal leaves one bounded log line. Exact requests through
``tests.raw`` where a client would not send them, kafka-python where it would."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import kafka.admin
import kafka.errors
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource
from kafka.protocol.admin import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeProducersRequest,
    DescribeProducersResponse,
    ElectLeadersRequest,
    ElectLeadersResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from broker_core.admin_refusals import NAME_LIMIT, PER_WINDOW
from tests.broker_process import BrokerProcess
from tests.raw import RawConnection

_Topic = CreateTopicsRequest.CreatableTopic


def topic(name: str, partitions: int = 1, replication: int = 1,
          assignments: dict[int, list[int]] | list[tuple[int, list[int]]] | None = None,
          configs: dict[str, str | None] | None = None) -> _Topic:
    """A CreateTopics entry: ``assignments`` as (partition index, broker ids)."""
    pairs = list(assignments.items() if isinstance(assignments, dict) else assignments or [])
    return _Topic(name=name, num_partitions=partitions, replication_factor=replication,
                  assignments=[_Topic.CreatableReplicaAssignment(partition_index=index,
                                                                 broker_ids=ids)
                               for index, ids in pairs],
                  configs=[_Topic.CreatableTopicConfig(name=key, value=value)
                           for key, value in (configs or {}).items()])


def create_raw(broker: BrokerProcess, *topics: _Topic,
               version: int = 5) -> list[tuple[str, int, str | None]]:
    """(name, error code, message) of each topic of a raw CreateTopics request."""
    raw = RawConnection(broker.port)
    try:
        response = raw.call(CreateTopicsRequest[version](
            topics=list(topics), timeout_ms=10_000, validate_only=False),
            version, CreateTopicsResponse)
    finally:
        raw.close()
    return [(t.name, t.error_code, t.error_message) for t in response.topics]


def topic_id(broker: BrokerProcess, name: str) -> uuid.UUID | None:
    """The topic's id, None when Metadata does not know it."""
    raw = RawConnection(broker.port)
    try:
        meta = raw.call(MetadataRequest[12](topics=[MetadataRequest[12].MetadataRequestTopic(
            topic_id=None, name=name)], allow_auto_topic_creation=False,
            include_topic_authorized_operations=False), 12, MetadataResponse)
    finally:
        raw.close()
    found = meta.topics[0]
    return None if found.error_code else uuid.UUID(str(found.topic_id))


def own_configs(broker: BrokerProcess, name: str) -> dict[str, str]:
    """The topic's own configs (not its defaults), as DescribeConfigs tells them."""
    resource, client = ConfigResource(ConfigResource.Type.TOPIC, name), \
        AdminClient({"bootstrap.servers": broker.bootstrap})
    found = client.describe_configs([resource])[resource].result(10)
    return {key: entry.value for key, entry in found.items() if not entry.is_default}


def alter_raw(broker: BrokerProcess, *resources: tuple[str, dict[str, str | None]],
              incremental: bool = False) -> list[tuple[str, int, str | None]]:
    """(name, error code, message) of each topic of a raw AlterConfigs (or, with
    ``incremental``, IncrementalAlterConfigs, each config SET) request."""
    raw = RawConnection(broker.port)
    try:
        if incremental:
            changes = IncrementalAlterConfigsRequest.AlterConfigsResource
            response = raw.call(IncrementalAlterConfigsRequest[1](resources=[
                changes(resource_type=2, resource_name=name, configs=[
                    changes.AlterableConfig(name=key, config_operation=0, value=value)
                    for key, value in configs.items()])
                for name, configs in resources], validate_only=False),
                1, IncrementalAlterConfigsResponse)
        else:
            replaced = AlterConfigsRequest.AlterConfigsResource
            response = raw.call(AlterConfigsRequest[1](resources=[
                replaced(resource_type=2, resource_name=name, configs=[
                    replaced.AlterableConfig(name=key, value=value)
                    for key, value in configs.items()])
                for name, configs in resources], validate_only=False),
                1, AlterConfigsResponse)
    finally:
        raw.close()
    return [(r.resource_name, r.error_code, r.error_message) for r in response.responses]


def test_creating_an_existing_topic_says_it_exists_before_anything_else(
        broker: BrokerProcess, topic_name: str) -> None:
    client = kafka.admin.KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        client.create_topics([kafka.admin.NewTopic(topic_name, 1, 1)])
        # kafka-python's "create, ignore TopicAlreadyExists" with any settings
        for again in (kafka.admin.NewTopic(topic_name, 1, 3),
                      kafka.admin.NewTopic(topic_name, 0, 1),
                      kafka.admin.NewTopic(topic_name, 1, 1,
                                           topic_configs={"no.such.key": "1"})):
            with pytest.raises(kafka.errors.TopicAlreadyExistsError):
                client.create_topics([again])
    finally:
        client.close()


def test_a_refusal_is_one_bounded_line_and_a_flood_of_them_a_few(
        broker: BrokerProcess, topic_name: str) -> None:
    mark = len(broker.lines)
    client = kafka.admin.KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        client.create_topics([kafka.admin.NewTopic(topic_name, 1, 1)])
        with pytest.raises(kafka.errors.TopicAlreadyExistsError):
            client.create_topics([kafka.admin.NewTopic(topic_name, 1, 1)])
    finally:
        client.close()
    line = broker.wait_for_log(f"CreateTopics refused topic '{topic_name}'", after=mark)
    assert "TOPIC_ALREADY_EXISTS" in line and "already exists" in line
    # a CreatePartitions naming many unknown topics, one with a line break, one very long
    names = [f"{topic_name}\nforged line", "x" * 5000] + \
        [f"{topic_name}-{n}" for n in range(3 * PER_WINDOW)]
    raw = RawConnection(broker.port)
    try:
        answer = raw.call(CreatePartitionsRequest[1](
            topics=[CreatePartitionsRequest.CreatePartitionsTopic(name=name, count=2,
                                                                  assignments=None)
                    for name in names], timeout_ms=10_000, validate_only=False),
            1, CreatePartitionsResponse)
    finally:
        raw.close()
    # INVALID_TOPIC_EXCEPTION for the two bad names, UNKNOWN_TOPIC_OR_PARTITION for the rest
    assert [r.error_code for r in answer.results] == [17, 17] + [3] * (3 * PER_WINDOW)
    broker.wait_for_log(f"CreatePartitions refused topic '{topic_name}-{PER_WINDOW - 3}'",
                        after=mark)
    lines = [line for line in broker.lines[mark:] if "CreatePartitions refused" in line]
    assert len(lines) == PER_WINDOW  # the rest counted, told when the window ends
    assert all("UNKNOWN_TOPIC_OR_PARTITION" in line for line in lines[2:])
    assert not any(line.startswith("forged line") for line in broker.lines[mark:])
    assert "\\nforged line" in lines[0]
    assert "x" * NAME_LIMIT + "... (5000 characters)" in lines[1]
    assert all(len(line) < 2 * NAME_LIMIT + 600 for line in lines)


def test_a_topic_named_twice_in_delete_topics_is_not_deleted(
        broker: BrokerProcess, topic_name: str) -> None:
    other = f"{topic_name}-other"
    assert create_raw(broker, topic(topic_name), topic(other)) == [
        (topic_name, 0, None), (other, 0, None)]
    raw = RawConnection(broker.port)
    try:
        by_name = raw.call(DeleteTopicsRequest[5](
            topic_names=[topic_name, other, topic_name], timeout_ms=10_000),
            5, DeleteTopicsResponse)
        assert [(r.name, r.error_code, r.error_message) for r in by_name.responses] == [
            (topic_name, 42, "Duplicate topic name."), (other, 0, None),
            (topic_name, 42, "Duplicate topic name.")]
        assert topic_id(broker, other) is None
        known = topic_id(broker, topic_name)
        assert known is not None
        entry = DeleteTopicsRequest[6].DeleteTopicState
        by_id = raw.call(DeleteTopicsRequest[6](
            topics=[entry(name=None, topic_id=known), entry(name=None, topic_id=known)],
            timeout_ms=10_000), 6, DeleteTopicsResponse)
        assert [(r.error_code, r.error_message) for r in by_id.responses] == [
            (42, "Duplicate topic id."), (42, "Duplicate topic id.")]
    finally:
        raw.close()
    assert topic_id(broker, topic_name) == known


@pytest.mark.parametrize("incremental", [False, True])
def test_a_resource_named_twice_in_alter_configs_is_not_altered(
        broker: BrokerProcess, topic_name: str, incremental: bool) -> None:
    other = f"{topic_name}-other"
    create_raw(broker, topic(topic_name), topic(other))
    answers = alter_raw(broker, (topic_name, {"retention.ms": "1000"}),
                        (other, {"retention.ms": "3000"}),
                        (topic_name, {"segment.ms": "2000"}), incremental=incremental)
    assert answers == [(topic_name, 42, "Duplicate resource."), (other, 0, None),
                       (topic_name, 42, "Duplicate resource.")]
    assert own_configs(broker, topic_name) == {}
    assert own_configs(broker, other) == {"retention.ms": "3000"}


def test_null_config_values_are_refused_as_kafka_refuses_them(
        broker: BrokerProcess, topic_name: str) -> None:
    assert create_raw(broker, topic(topic_name, configs={
        "retention.ms": "1000", "segment.ms": None, "cleanup.policy": None})) == [
        (topic_name, 40, "Null value not supported for topic configs: segment.ms,cleanup.policy")]
    assert topic_id(broker, topic_name) is None
    create_raw(broker, topic(topic_name, configs={"retention.ms": "1000"}))
    assert alter_raw(broker, (topic_name, {"retention.ms": "2000", "segment.ms": None})) == [
        (topic_name, 42, "Null value not supported for : segment.ms")]
    assert alter_raw(broker, (topic_name, {"retention.ms": None}), incremental=True) == [
        (topic_name, 42, "Null value not supported for : retention.ms")]
    assert own_configs(broker, topic_name) == {"retention.ms": "1000"}


def test_names_that_differ_only_by_dot_and_underscore_collide_within_a_namespace(
        broker: BrokerProcess, topic_name: str) -> None:
    dotted, underscored = f"{topic_name}.x", f"{topic_name}_x"
    assert create_raw(broker, topic(dotted)) == [(dotted, 0, None)]
    elsewhere = f"acme/prod/{underscored}"  # another tenant's namespace: no collision
    assert create_raw(broker, topic(underscored), topic(elsewhere)) == [
        (underscored, 17, f"Topic '{underscored}' collides with existing topic: {dotted}"),
        (elsewhere, 0, None)]
    first, second = f"{topic_name}.y_z", f"{topic_name}_y.z"  # both in one request
    assert create_raw(broker, topic(first), topic(second)) == [
        (first, 0, None),
        (second, 17, f"Topic '{second}' collides with existing topic: {first}")]
    assert topic_id(broker, underscored) is None and topic_id(broker, second) is None


def test_replica_assignments_are_checked_as_kafka_checks_them(
        broker: BrokerProcess, topic_name: str) -> None:
    cases = [
        (topic(f"{topic_name}-rf", -1, 1, {0: [0]}), 42,
         "A manual partition assignment was specified, but replication factor was not "
         "set to -1."),
        (topic(f"{topic_name}-np", 1, -1, {0: [0]}), 42,
         "A manual partition assignment was specified, but numPartitions was not set "
         "to -1."),
        (topic(f"{topic_name}-gap", -1, -1, {0: [0], 2: [0]}), 39,
         "partitions should be a consecutive 0-based integer sequence"),
        (topic(f"{topic_name}-twice", -1, -1, [(0, [0]), (1, [0]), (0, [0])]), 39,
         "Found multiple manual partition assignments for partition 0"),
    ]
    assert create_raw(broker, *(case for case, _, _ in cases)) == [
        (case.name, code, message) for case, code, message in cases]
    fine = f"{topic_name}-fine"
    assert create_raw(broker, topic(fine, -1, -1, {1: [0], 0: [0]})) == [(fine, 0, None)]


@pytest.mark.parametrize(("endpoint_type", "code"), [(1, 0), (2, 114), (0, 115), (7, 115)])
def test_describe_cluster_answers_for_the_endpoint_type_asked(
        broker: BrokerProcess, endpoint_type: int, code: int) -> None:
    raw = RawConnection(broker.port)
    try:
        answer = raw.call(DescribeClusterRequest[1](
            include_cluster_authorized_operations=False, endpoint_type=endpoint_type),
            1, DescribeClusterResponse)
    finally:
        raw.close()
    assert answer.error_code == code  # MISMATCHED_ENDPOINT_TYPE, UNSUPPORTED_ENDPOINT_TYPE
    assert (answer.error_message is None) == (code == 0)
    assert bool(answer.brokers) == (code == 0)


def test_describe_producers_does_not_tell_the_internal_topic_name(
        broker: BrokerProcess, topic_name: str) -> None:
    create_raw(broker, topic(topic_name))
    raw = RawConnection(broker.port)
    try:
        answer = raw.call(DescribeProducersRequest[0](topics=[
            DescribeProducersRequest.TopicRequest(name=name, partition_indexes=[7])
            for name in (topic_name, f"{topic_name}-none")]), 0, DescribeProducersResponse)
    finally:
        raw.close()
    assert [found.name for found in answer.topics] == [topic_name, f"{topic_name}-none"]
    for found in answer.topics:
        [partition] = found.partitions
        assert partition.partition_index == 7
        assert partition.error_code == 3  # UNKNOWN_TOPIC_OR_PARTITION
        assert "public/default" not in (partition.error_message or "")


def test_electing_every_leader_lists_no_partition_that_needs_none(
        broker: BrokerProcess, topic_name: str) -> None:
    create_raw(broker, topic(topic_name, 3))
    raw = RawConnection(broker.port)
    try:
        every = raw.call(ElectLeadersRequest[1](election_type=0, topic_partitions=None,
                                                timeout_ms=10_000), 1, ElectLeadersResponse)
        named = raw.call(ElectLeadersRequest[1](election_type=0, topic_partitions=[
            ElectLeadersRequest.TopicPartitions(topic=topic_name, partitions=[0, 1, 2])],
            timeout_ms=10_000), 1, ElectLeadersResponse)
    finally:
        raw.close()
    assert every.error_code == 0
    listed = {r.topic: r.partition_result for r in every.replica_election_results}
    assert listed[topic_name] == []  # as Kafka: no ELECTION_NOT_NEEDED when electing all
    [asked] = named.replica_election_results
    assert [(p.partition_id, p.error_code) for p in asked.partition_result] == [
        (0, 84), (1, 84), (2, 84)]  # ELECTION_NOT_NEEDED when named


@pytest.fixture(scope="module")
def retention_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker whose config file sets the default retention.ms."""
    process = BrokerProcess(Path(tmp_path_factory.mktemp("retention")) / "data",
                            {"logRetentionMs": "7200000"}).start()
    yield process
    process.stop()


def test_described_configs_list_their_synonyms(retention_broker: BrokerProcess,
                                               topic_name: str) -> None:
    create_raw(retention_broker, topic(topic_name, configs={"retention.ms": "60000",
                                                            "segment.bytes": "2048"}))
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic_name)
    client = AdminClient({"bootstrap.servers": retention_broker.bootstrap})
    found = client.describe_configs([resource])[resource].result(10)  # include_synonyms

    def synonyms(name: str) -> list[tuple[str, str | None, str]]:
        return [(s.name, s.value, ConfigSource(s.source).name)
                for s in found[name].synonyms.values()]

    assert synonyms("retention.ms") == [
        ("retention.ms", "60000", "DYNAMIC_TOPIC_CONFIG"),
        ("log.retention.ms", "7200000", "STATIC_BROKER_CONFIG")]
    assert synonyms("retention.bytes") == [("log.retention.bytes", "-1", "DEFAULT_CONFIG")]
    assert synonyms("segment.bytes") == [
        ("segment.bytes", "2048", "DYNAMIC_TOPIC_CONFIG"),
        ("log.segment.bytes", "1073741824", "DEFAULT_CONFIG")]
    assert synonyms("max.message.bytes") == [
        ("message.max.bytes", found["max.message.bytes"].value, "DEFAULT_CONFIG")]
