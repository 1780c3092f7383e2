"""The replica and log-dir APIs in a cluster of two brokers on one PostgreSQL: each partition
has one replica, on the broker Metadata names as its leader, and the answers say so.

A reassignment or a create-time replica assignment is accepted only when it names exactly
that broker (otherwise INVALID_REPLICA_ASSIGNMENT, naming it), a replication factor above 1
is INVALID_REPLICATION_FACTOR, and each broker's DescribeLogDirs lists only the partitions
it leads (AlterReplicaLogDirs: NOT_LEADER_OR_FOLLOWER for one it does not), as Kafka lists
only a broker's hosted replicas. Through confluent-kafka, kafka-python, the Java client
and raw requests to one broker at a time."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path

import kafka.admin
import kafka.errors
import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from kafka.protocol import admin as a
from kafka.structs import TopicPartition

from tests.cluster_helpers import Cluster, running_cluster
from tests.java_client import JavaFlows
from tests.raw import RawConnection

PARTITIONS = 4
INVALID_REPLICA_ASSIGNMENT, NOT_LEADER_OR_FOLLOWER = 39, 6
_Reassign = a.AlterPartitionReassignmentsRequest.ReassignableTopic
STEADY = {"brokerSessionTimeoutMs": "6000", "brokerHeartbeatIntervalMs": "1000"}
"""The default membership settings: nothing here needs a fast failover, and the leaders
must stay put on a loaded machine while a test compares answers with them."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("replicas"), size=2, settings=STEADY) as started:
        yield started


def agreed_leaders(cluster: Cluster, topic: str, timeout: float = 30.0) -> dict[int, int]:
    """partition -> leader once both brokers' Metadata tell the same."""
    deadline = time.monotonic() + timeout
    while (found := cluster.agreed_leaders(topic)) is None or len(found) < PARTITIONS:
        assert time.monotonic() < deadline, f"the brokers never agreed on {topic}'s leaders"
        time.sleep(0.2)
    return found


def create(cluster: Cluster, topic: str) -> dict[int, int]:
    """Create ``topic`` and return its leaders, once both brokers agree on them."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    return agreed_leaders(cluster, topic)


def reassign(port: int, topic: str, partition: int,
             replicas: list[int] | None) -> tuple[int, str | None]:
    """(error code, message) of one partition's AlterPartitionReassignments, asked of the
    broker on ``port``."""
    conn = RawConnection(port)
    try:
        answer = conn.call(a.AlterPartitionReassignmentsRequest[0](
            timeout_ms=10_000, topics=[_Reassign(name=topic, partitions=[
                _Reassign.ReassignablePartition(partition_index=partition,
                                                replicas=replicas)])]),
            0, a.AlterPartitionReassignmentsResponse)
    finally:
        conn.close()
    assert answer.error_code == 0
    [[result]] = [t.partitions for t in answer.responses]
    return int(result.error_code), result.error_message


def log_dir_partitions(port: int, topics: list[tuple[str, list[int]]] | None
                       ) -> dict[str, dict[int, int]]:
    """topic -> {partition: size} the broker on ``port`` lists in its DescribeLogDirs v4."""
    conn = RawConnection(port)
    try:
        asked = None if topics is None else [
            a.DescribeLogDirsRequest.DescribableLogDirTopic(topic=name, partitions=indexes)
            for name, indexes in topics]
        answer = conn.call(a.DescribeLogDirsRequest[4](topics=asked), 4,
                           a.DescribeLogDirsResponse)
    finally:
        conn.close()
    assert answer.error_code == 0
    [log_dir] = answer.results
    assert log_dir.error_code == 0
    return {t.name: {int(p.partition_index): int(p.partition_size) for p in t.partitions}
            for t in log_dir.topics}


def test_reassignments_are_accepted_only_to_the_leader(cluster: Cluster,
                                                       topic_name: str) -> None:
    leaders = create(cluster, topic_name)
    assert set(leaders.values()) == {0, 1}, leaders  # bounded load: two on each
    for partition, leader in leaders.items():
        other = 1 - leader
        for broker in cluster.brokers:  # every broker answers alike
            assert reassign(broker.port, topic_name, partition, [leader]) == (0, None)
            for wrong in ([other], [leader, other], [7]):
                code, message = reassign(broker.port, topic_name, partition, wrong)
                assert code == INVALID_REPLICA_ASSIGNMENT
                assert message is not None
                assert f"partition {partition} of {topic_name} is on broker {leader};" \
                    in message, message
                assert "ownership follows the cluster's placement" in message
                assert "only broker" not in message
    assert cluster.agreed_leaders(topic_name) == leaders  # nothing moved
    client = kafka.admin.KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    try:
        tp = TopicPartition(topic_name, 0)
        assert client.alter_partition_reassignments({tp: [leaders[0]]}) == {tp: None}
        assert client.alter_partition_reassignments({tp: [1 - leaders[0]]}) == \
            {tp: kafka.errors.InvalidReplicationAssignmentError}
        assert client.alter_partition_reassignments({tp: None}) == \
            {tp: kafka.errors.NoReassignmentInProgressError}
        assert client.list_partition_reassignments() == {}
    finally:
        client.close()


def _refusal(future: Future[None]) -> tuple[str, str] | None:
    """(error name, message) a CreateTopics or CreatePartitions answered, or None."""
    try:
        future.result(30)
    except KafkaException as failure:
        error = failure.args[0]
        return error.name(), error.str()
    return None


def _follow_refusals(topic: str, assignment: list[list[int]], first: int,
                     attempt: Callable[[list[list[int]]], tuple[str, str] | None]
                     ) -> list[list[int]]:
    """Starting from ``assignment`` (of partitions ``first``, ``first`` + 1, ...), correct
    the partition each validate-only ``attempt`` refusal names to the broker it names, until
    one is accepted: the assignment the cluster places."""
    assignment = [list(replicas) for replicas in assignment]
    for _ in range(len(assignment) + 1):
        refusal = attempt(assignment)
        if refusal is None:
            return assignment
        name, message = refusal
        assert name == "INVALID_REPLICA_ASSIGNMENT"
        found = re.search(rf"partition (\d+) of {topic} will be on broker (\d);", message)
        assert found is not None, message
        assert "ownership follows the cluster's placement" in message
        partition, broker = int(found[1]), int(found[2])
        assert assignment[partition - first] != [broker]
        assignment[partition - first] = [broker]
    raise AssertionError(f"no assignment of {topic} was accepted")


def test_create_time_assignment_must_name_where_each_partition_goes(cluster: Cluster,
                                                                    topic_name: str) -> None:
    """All on broker 0 (what the Java client review asked for) is refused, naming where a
    partition goes; following the refusals leads to the assignment the cluster places, which
    is accepted and is where the partitions are led. Alike for CreatePartitions."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})

    def create_topic(assignment: list[list[int]]) -> tuple[str, str] | None:
        new = NewTopic(topic_name, PARTITIONS, replica_assignment=assignment)
        return _refusal(admin.create_topics([new], validate_only=True)[topic_name])

    all_on_0 = [[0] for _ in range(PARTITIONS)]
    assert create_topic(all_on_0) is not None  # bounded load: at most two of four on 0
    assignment = _follow_refusals(topic_name, all_on_0, 0, create_topic)
    assert {b for [b] in assignment} == {0, 1}
    new = NewTopic(topic_name, PARTITIONS, replica_assignment=assignment)
    admin.create_topics([new])[topic_name].result(30)
    assert agreed_leaders(cluster, topic_name) == {p: b for p, [b] in enumerate(assignment)}

    def grow(added: list[list[int]]) -> tuple[str, str] | None:
        new = NewPartitions(topic_name, PARTITIONS + 2, replica_assignment=added)
        return _refusal(admin.create_partitions([new], validate_only=True)[topic_name])

    added = _follow_refusals(topic_name, [[0], [0]], PARTITIONS, grow)
    new_partitions = NewPartitions(topic_name, PARTITIONS + 2, replica_assignment=added)
    admin.create_partitions([new_partitions])[topic_name].result(30)
    deadline = time.monotonic() + 30
    while (found := cluster.agreed_leaders(topic_name)) is None \
            or len(found) < PARTITIONS + 2:
        assert time.monotonic() < deadline, "the brokers never agreed on the new partitions"
        time.sleep(0.2)
    assert [found[PARTITIONS], found[PARTITIONS + 1]] == [b for [b] in added]


def test_a_replication_factor_above_one_is_refused(cluster: Cluster, topic_name: str) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    with pytest.raises(KafkaException) as failure:
        admin.create_topics([NewTopic(topic_name, 2, 2)])[topic_name].result(30)
    error = failure.value.args[0]
    assert error.name() == "INVALID_REPLICATION_FACTOR"
    assert "one replica" in error.str()
    assert "available broker" not in error.str()


def test_each_broker_lists_only_the_partitions_it_leads(cluster: Cluster,
                                                        topic_name: str) -> None:
    leaders = create(cluster, topic_name)
    producer = Producer({"bootstrap.servers": cluster.bootstrap})
    for partition in range(PARTITIONS):
        producer.produce(topic_name, value=b"x" * 500, partition=partition)
    assert producer.flush(30) == 0
    everything = list(range(PARTITIONS))
    for broker_id, broker in zip(cluster.ids, cluster.brokers, strict=True):
        mine = {p for p, leader in leaders.items() if leader == broker_id}
        listed = log_dir_partitions(broker.port, None)
        assert set(listed[topic_name]) == mine, (broker_id, listed[topic_name])
        assert all(size > 0 for size in listed[topic_name].values())
        asked = log_dir_partitions(broker.port, [(topic_name, everything)])
        assert set(asked[topic_name]) == mine
        # asked only for partitions the other broker leads: the topic is left out
        theirs = [p for p in everything if p not in mine]
        assert log_dir_partitions(broker.port, [(topic_name, theirs)]) == {}


def test_replica_log_dirs_answer_only_where_the_replica_is(cluster: Cluster,
                                                           topic_name: str) -> None:
    leaders = create(cluster, topic_name)
    for broker_id, broker in zip(cluster.ids, cluster.brokers, strict=True):
        conn = RawConnection(broker.port)
        try:
            [log_dir] = conn.call(a.DescribeLogDirsRequest[4](topics=None), 4,
                                  a.DescribeLogDirsResponse).results
            topic = a.AlterReplicaLogDirsRequest.AlterReplicaLogDir.AlterReplicaLogDirTopic(
                name=topic_name, partitions=list(range(PARTITIONS)))
            answer = conn.call(a.AlterReplicaLogDirsRequest[2](dirs=[
                a.AlterReplicaLogDirsRequest.AlterReplicaLogDir(path=log_dir.log_dir,
                                                                topics=[topic])]),
                2, a.AlterReplicaLogDirsResponse)
        finally:
            conn.close()
        [result] = answer.results
        assert {int(p.partition_index): int(p.error_code) for p in result.partitions} == {
            p: 0 if leader == broker_id else NOT_LEADER_OR_FOLLOWER
            for p, leader in leaders.items()}


def test_a_broker_that_leaves_hands_its_log_dir_entries_over(tmp_path: Path,
                                                              topic_name: str) -> None:
    """When broker 1 stops (SIGTERM: it hands its partitions over), broker 0 leads and
    lists every partition."""
    with running_cluster(tmp_path, size=2, settings=STEADY) as pair:
        create(pair, topic_name)
        pair.by_id(1).stop()
        pair.wait_for_members(1)
        deadline = time.monotonic() + 30
        while set(log_dir_partitions(pair.by_id(0).port, None).get(topic_name, {})) \
                != set(range(PARTITIONS)):
            assert time.monotonic() < deadline, "broker 0 never listed every partition"
            time.sleep(0.2)


def test_the_java_clients_replica_tools_see_one_replica_at_the_leader(
        cluster: Cluster, topic_name: str, tmp_path: Path) -> None:
    """What the Java client review found (and Cruise Control-like tools rely on): each
    broker's log dirs hold the partitions it leads, describeReplicaLogDirs finds a replica
    only on its leader, a reassignment to the leader is done and one elsewhere refused."""
    leaders = create(cluster, topic_name)
    lines = JavaFlows.compile(tmp_path).run("replicas", cluster.bootstrap, topic_name,
                                            timeout=180)
    facts = [tuple(words) for words in lines]
    assert {(int(p), int(b)) for kind, p, b in
            (f for f in facts if f[0] == "leader")} == set(leaders.items())
    assert sorted((int(p), int(b)) for kind, b, p in
                  (f for f in facts if f[0] == "logdir")) == sorted(leaders.items())
    assert sorted((int(p), int(b)) for kind, p, b, held in
                  (f for f in facts if f[0] == "replica-dir") if held == "yes") \
        == sorted(leaders.items())
    reassigned = {(int(f[1]), int(f[2])): f[3:] for f in facts if f[0] == "reassign"}
    assert reassigned == {
        (p, b): ("ok",) if leaders[p] == b else ("refused", "InvalidReplicaAssignmentException")
        for p in range(PARTITIONS) for b in cluster.ids}
    assert ("reassignments", "0") in facts
    assert cluster.agreed_leaders(topic_name) == leaders
