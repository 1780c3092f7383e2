"""Cluster administration on a one-broker cluster, through confluent-kafka's and
kafka-python's admin clients: leader elections (never needed), log dirs (one, with sizes),
replica moves and reassignments (only to where replicas are), DescribeTopicPartitions
paging and ListConfigResources; every refusal with Kafka's error code."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kafka.admin
import kafka.errors
import pytest
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka._model import ElectionType
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from kafka.structs import TopicPartition as KafkaTopicPartition
from kafka.structs import TopicPartitionReplica

from tests.broker_process import BrokerProcess
from tests.clients import make_records, produce_confluent
from tests.raw import RawConnection

pytestmark = pytest.mark.storage_engines  # each test on file://, memory:// and postgres://


@pytest.fixture
def client(broker: BrokerProcess) -> Iterator[kafka.admin.KafkaAdminClient]:
    admin = kafka.admin.KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    yield admin
    admin.close()


def create(broker: BrokerProcess, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(60)


def test_elections_are_never_needed(broker: BrokerProcess, topic_name: str) -> None:
    create(broker, topic_name, 2)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for election in (ElectionType.PREFERRED, ElectionType.UNCLEAN):
        wanted = [TopicPartition(topic_name, 0), TopicPartition(topic_name, 1),
                  TopicPartition(topic_name, 7), TopicPartition(topic_name + "-missing", 0)]
        found = admin.elect_leaders(election, wanted).result(10)
        assert {(tp.topic, tp.partition): error.name() if error else None
                for tp, error in found.items()} == {
            (topic_name, 0): "ELECTION_NOT_NEEDED", (topic_name, 1): "ELECTION_NOT_NEEDED",
            (topic_name, 7): "UNKNOWN_TOPIC_OR_PART",
            (topic_name + "-missing", 0): "UNKNOWN_TOPIC_OR_PART"}


def test_log_dirs_report_partition_sizes(broker: BrokerProcess, topic_name: str,
                                         client: kafka.admin.KafkaAdminClient,
                                         storage_engine: str) -> None:
    create(broker, topic_name, 2)
    records = [r for r in make_records(40, 1_000) if r.partition == 0]
    produce_confluent(broker.bootstrap, topic_name, records, "none")
    [result] = client.describe_log_dirs()
    assert result["broker"] == 0
    [log_dir] = result["log_dirs"]
    assert log_dir["error_code"] == 0
    if storage_engine != "file":  # no volume of ours: its figures are unknown, as Kafka says
        assert log_dir["log_dir"].startswith(f"{storage_engine}://")
        assert log_dir["usable_bytes"] == log_dir["total_bytes"] == -1
    else:
        assert Path(log_dir["log_dir"]) == broker.data_dir.resolve()
        assert 0 < log_dir["usable_bytes"] <= log_dir["total_bytes"]
    sizes = {(t["name"], p["partition_index"]): p["partition_size"]
             for t in log_dir["topics"] for p in t["partitions"]}
    assert sizes[(topic_name, 0)] > sum(len(r.value or b"") for r in records)
    assert sizes[(topic_name, 1)] == 0
    # asked for one partition (and one of a missing topic): only that one comes back
    [result] = client.describe_log_dirs(topic_partitions={topic_name: [1],
                                                          topic_name + "-x": [0]})
    assert [(t["name"], [p["partition_index"] for p in t["partitions"]])
            for t in result["log_dirs"][0]["topics"]] == [(topic_name, [1])]


def test_log_dirs_list_only_the_callers_namespace(broker: BrokerProcess, topic_name: str,
                                                  client: kafka.admin.KafkaAdminClient
                                                  ) -> None:
    create(broker, topic_name, 1)
    create(broker, f"other/ns/{topic_name}", 1)
    [result] = client.describe_log_dirs()
    names = {t["name"] for t in result["log_dirs"][0]["topics"]}
    assert topic_name in names
    assert not any(name.startswith("other/") for name in names)


def test_replicas_move_only_to_where_they_are(broker: BrokerProcess, topic_name: str,
                                              client: kafka.admin.KafkaAdminClient,
                                              tmp_path: Path) -> None:
    create(broker, topic_name, 1)
    here = client.describe_log_dirs()[0]["log_dirs"][0]["log_dir"]
    replica = TopicPartitionReplica(topic_name, 0, 0)
    assert client.alter_replica_log_dirs({replica: here})[replica] is kafka.errors.NoError
    moved = client.alter_replica_log_dirs({replica: str(tmp_path)})
    assert moved[replica] is kafka.errors.LogDirNotFoundError
    # a path no file system takes is no log dir either (found by tests/fuzz_requests.py)
    odd = client.alter_replica_log_dirs({replica: here + "\x00"})
    assert odd[replica] is kafka.errors.LogDirNotFoundError
    missing = TopicPartitionReplica(topic_name, 3, 0)
    assert client.alter_replica_log_dirs({missing: here})[missing] is \
        kafka.errors.UnknownTopicOrPartitionError


def test_reassignments_only_to_this_broker(broker: BrokerProcess, topic_name: str,
                                           client: kafka.admin.KafkaAdminClient) -> None:
    create(broker, topic_name, 2)
    tp0, tp1 = KafkaTopicPartition(topic_name, 0), KafkaTopicPartition(topic_name, 1)
    assert client.alter_partition_reassignments({tp0: [0]}) == {tp0: None}
    assert client.alter_partition_reassignments({tp1: [0, 1]}) == \
        {tp1: kafka.errors.InvalidReplicationAssignmentError}
    assert client.alter_partition_reassignments({tp1: None}) == \
        {tp1: kafka.errors.NoReassignmentInProgressError}
    assert client.list_partition_reassignments() == {}
    assert client.list_partition_reassignments([tp0]) == {}


def test_replica_assignments_only_to_this_broker(broker: BrokerProcess, topic_name: str) -> None:
    """CreateTopics and CreatePartitions take an assignment of every partition to this
    broker, the only one; another broker is refused, naming where the partition will be."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    refused = NewTopic(topic_name, 2, replica_assignment=[[0], [1]])
    with pytest.raises(KafkaException) as failure:
        admin.create_topics([refused])[topic_name].result(30)
    error = failure.value.args[0]
    assert error.name() == "INVALID_REPLICA_ASSIGNMENT"
    assert f"partition 1 of {topic_name} will be on broker 0;" in error.str()
    admin.create_topics([NewTopic(topic_name, 2, replica_assignment=[[0], [0]])]
                        )[topic_name].result(30)
    with pytest.raises(KafkaException) as failure:
        admin.create_partitions([NewPartitions(topic_name, 3, replica_assignment=[[2]])]
                                )[topic_name].result(30)
    assert failure.value.args[0].name() == "INVALID_REPLICA_ASSIGNMENT"
    admin.create_partitions([NewPartitions(topic_name, 3, replica_assignment=[[0]])]
                            )[topic_name].result(30)
    with pytest.raises(KafkaException) as failure:
        admin.create_topics([NewTopic(topic_name + "-rf", 1, 2)])[topic_name + "-rf"].result(30)
    error = failure.value.args[0]
    assert error.name() == "INVALID_REPLICATION_FACTOR"
    assert "one replica" in error.str()


def test_describe_topic_partitions_pages_through_everything(
        broker: BrokerProcess, topic_name: str, client: kafka.admin.KafkaAdminClient) -> None:
    names = [f"{topic_name}-a", f"{topic_name}-b"]
    for name in names:
        create(broker, name, 3)
    missing = client.describe_topic_partitions([topic_name + "-missing"])["topics"]
    assert [(t["name"], t["error_code"]) for t in missing] == \
        [(topic_name + "-missing", 3)]  # UNKNOWN_TOPIC_OR_PARTITION
    seen: list[tuple[str, int]] = []
    result = client.describe_topic_partitions(names, response_partition_limit=2)
    pages = 1
    while True:
        for topic in result["topics"]:
            if topic["error_code"] == 0:
                assert topic["topic_id"] is not None
                seen += [(topic["name"], p["partition_index"]) for p in topic["partitions"]]
                assert all(p["leader_id"] == 0 and p["replica_nodes"] == [0]
                           for p in topic["partitions"])
        if result["next_cursor"] is None:
            break
        result = client.describe_topic_partitions(names, response_partition_limit=2,
                                                  cursor=result["next_cursor"])
        pages += 1
    assert seen == [(name, p) for name in names for p in range(3)]
    assert pages == 3


def test_describe_topic_partitions_answers_empty_elr_lists(
        broker: BrokerProcess, topic_name: str) -> None:
    """Eligible leader replicas and the last known ELR come as empty arrays, as Kafka sends
    them without ELR, never null: the Java client's describeTopics reads them without a null
    check. Read raw, since kafka-python's admin client turns both into None."""
    from kafka.protocol import admin as a
    create(broker, topic_name, 2)
    conn = RawConnection(broker.port)
    try:
        answer = conn.call(a.DescribeTopicPartitionsRequest[0](
            topics=[a.DescribeTopicPartitionsRequest.TopicRequest(name=topic_name)],
            response_partition_limit=10, cursor=None), 0, a.DescribeTopicPartitionsResponse)
    finally:
        conn.close()
    [topic] = answer.topics
    assert [(p.partition_index, p.eligible_leader_replicas, p.last_known_elr,
             p.offline_replicas) for p in topic.partitions] == [(0, [], [], []), (1, [], [], [])]


def test_describe_topic_partitions_pages_stay_bounded(
        broker: BrokerProcess, topic_name: str, client: kafka.admin.KafkaAdminClient) -> None:
    """At most 2,000 partitions a page, whatever the limit asked; a cursor before the first
    partition starts at it (a negative one made the broker build 2**31 entries: found by
    tests/fuzz_requests.py)."""
    create(broker, topic_name, 2001)
    result = client.describe_topic_partitions(
        [topic_name], response_partition_limit=2**31 - 1,
        cursor={"topic_name": topic_name, "partition_index": -(2**31)})
    [topic] = result["topics"]
    assert [p["partition_index"] for p in topic["partitions"]] == list(range(2000))
    assert result["next_cursor"]["partition_index"] == 2000


def test_list_config_resources(broker: BrokerProcess, topic_name: str,
                               client: kafka.admin.KafkaAdminClient) -> None:
    create(broker, topic_name, 1)
    every = client.list_config_resources()
    assert topic_name in every["topic"]
    assert every["broker"] == ["0"]
    assert client.list_config_resources(["BROKER"]) == {"broker": ["0"]}
    with pytest.raises(kafka.errors.InvalidRequestError):
        client.list_config_resources(["GROUP"])



def _requests(topic: str, data_dir: str, storage_engine: str
              ) -> list[tuple[Any, Any, int, Any, Any, object]]:
    """(request class, response class, top version, request fields, the per-item error
    codes of an answer, what they must be) of each API. Only the file engine keeps its
    partitions in ``data_dir``: for the others it is no log dir (LOG_DIR_NOT_FOUND)."""
    moved = 0 if storage_engine == "file" else 57
    from kafka.protocol import admin as a
    return [
        (a.ElectLeadersRequest, a.ElectLeadersResponse, 2, {
            "election_type": 0, "timeout_ms": 1000, "topic_partitions": [
                a.ElectLeadersRequest.TopicPartitions(topic=topic, partitions=[0, 9])]},
         lambda r: [(t.topic, p.partition_id, p.error_code)
                    for t in r.replica_election_results for p in t.partition_result],
         [(topic, 0, 84), (topic, 9, 3)]),  # ELECTION_NOT_NEEDED, UNKNOWN_TOPIC_OR_PARTITION
        (a.DescribeLogDirsRequest, a.DescribeLogDirsResponse, 4, {"topics": [
            a.DescribeLogDirsRequest.DescribableLogDirTopic(topic=topic, partitions=[0])]},
         lambda r: [(d.error_code, [(t.name, [p.partition_index for p in t.partitions])
                                    for t in d.topics]) for d in r.results],
         [(0, [(topic, [0])])]),
        (a.AlterReplicaLogDirsRequest, a.AlterReplicaLogDirsResponse, 2, {"dirs": [
            a.AlterReplicaLogDirsRequest.AlterReplicaLogDir(path=data_dir, topics=[
                a.AlterReplicaLogDirsRequest.AlterReplicaLogDir.AlterReplicaLogDirTopic(
                    name=topic, partitions=[0, 9])])]},
         lambda r: [(t.topic_name, p.partition_index, p.error_code)
                    for t in r.results for p in t.partitions],
         [(topic, 0, moved), (topic, 9, 3)]),
        (a.AlterPartitionReassignmentsRequest, a.AlterPartitionReassignmentsResponse, 1, {
            "timeout_ms": 1000, "allow_replication_factor_change": True, "topics": [
                a.AlterPartitionReassignmentsRequest.ReassignableTopic(name=topic, partitions=[
                    a.AlterPartitionReassignmentsRequest.ReassignableTopic
                    .ReassignablePartition(partition_index=0, replicas=[0])])]},
         lambda r: [(t.name, p.partition_index, p.error_code)
                    for t in r.responses for p in t.partitions],
         [(topic, 0, 0)]),
        (a.ListPartitionReassignmentsRequest, a.ListPartitionReassignmentsResponse, 0,
         {"timeout_ms": 1000, "topics": None}, lambda r: r.topics, []),
        (a.DescribeTopicPartitionsRequest, a.DescribeTopicPartitionsResponse, 0, {
            "topics": [a.DescribeTopicPartitionsRequest.TopicRequest(name=topic)],
            "response_partition_limit": 10, "cursor": None},
         lambda r: [(t.name, t.error_code, [(p.partition_index, p.error_code)
                                            for p in t.partitions]) for t in r.topics],
         [(topic, 0, [(0, 0)])]),
        (a.ListConfigResourcesRequest, a.ListConfigResourcesResponse, 1,
         {"resource_types": []}, lambda r: r.error_code, 0),
    ]


def test_every_version_of_each_api_answers(broker: BrokerProcess, topic_name: str,
                                           storage_engine: str) -> None:
    """Each API at each version ApiVersions advertises, by raw requests: well-formed
    answers (every byte taken: ``RawConnection.call``), the error codes of each item right,
    and the connection stays usable after every one."""
    from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
    create(broker, topic_name, 1)
    conn = RawConnection(broker.port)
    try:
        advertised = conn.call(ApiVersionsRequest[3](
            client_software_name="raw-test", client_software_version="1"), 3,
            ApiVersionsResponse)
        tops = {api.api_key: api.max_version for api in advertised.api_keys}
        apis = _requests(topic_name, str(broker.data_dir.resolve()), storage_engine)
        assert [(r.__name__, top) for r, _, top, *_ in apis] == [
            (r.__name__, tops.get(r.API_KEY)) for r, *_ in apis]
        for request_class, response_class, _top, fields, items, expected in apis:
            for version in range(tops[request_class.API_KEY] + 1):
                if request_class.__name__ == "ListConfigResourcesRequest" and version == 0:
                    answer = conn.call(request_class[0](), 0, response_class)
                    assert (answer.error_code, answer.config_resources) == (0, [])
                    continue
                answer = conn.call(request_class[version](**fields), version, response_class)
                assert getattr(answer, "error_code", 0) == 0, (request_class, version)
                assert items(answer) == expected, (request_class, version)
    finally:
        conn.close()
