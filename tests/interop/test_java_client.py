"""The Java client (kafka-clients 4.3) against a real broker: admin (create, list,
describe through DescribeTopicPartitions, delete), idempotent produce, a consumer group
that subscribes and commits, and transactions (commit, abort, offsets in a transaction,
read_committed), aborting a hanging transaction (kafka-transactions.sh abort), and the
client-quota admin calls (the kafka-configs flow). Each flow is tests/java/KafkaFlows.java;
the results are read back with the Python clients where they can be."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import kafka.admin
import pytest

from tests.broker_process import BrokerProcess
from tests.clients import consume_confluent, create_topic, present
from tests.java_client import JavaFlows
from tests.operations.test_metrics import scrape
from tests.ports import free_port
from tests.quota_helpers import describe, parts
from tests.raw import RawConnection
from tests.txn_helpers import TxnConnection


@pytest.fixture(scope="module")
def metrics_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory,
           metrics_port: int) -> Iterator[BrokerProcess]:
    """The module's broker, with its metrics served: they tell which API a flow used."""
    process = BrokerProcess(Path(tmp_path_factory.mktemp("broker-data")),
                            {"metricsPort": str(metrics_port)}).start()
    process.wait_for_log(rf"metrics on http://127.0.0.1:{metrics_port}/metrics")
    yield process
    process.stop()


@pytest.fixture(scope="session")
def java(tmp_path_factory: pytest.TempPathFactory) -> JavaFlows:
    """KafkaFlows compiled once per test session."""
    return JavaFlows.compile(Path(tmp_path_factory.mktemp("java-flows")))


def describe_topic_partitions_requests(metrics_port: int) -> float:
    """DescribeTopicPartitions requests the broker has handled (no sample before the first)."""
    return scrape(metrics_port).get('kop_server_requests_total{api="DescribeTopicPartitions"}',
                                    0.0)


@pytest.fixture
def admin(broker: BrokerProcess) -> Iterator[kafka.admin.KafkaAdminClient]:
    client = kafka.admin.KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    yield client
    client.close()


def test_admin_creates_describes_and_deletes_topics(
        java: JavaFlows, broker: BrokerProcess, topic_name: str,
        admin: kafka.admin.KafkaAdminClient, metrics_port: int) -> None:
    before = describe_topic_partitions_requests(metrics_port)
    lines = java.run("admin", broker.bootstrap, topic_name, "3")
    # describeTopics went through DescribeTopicPartitions (the topic, then the missing one),
    # not the client's fallback to Metadata, which would leave the ELR lists null
    assert describe_topic_partitions_requests(metrics_port) >= before + 2
    assert lines[:2] == [["created", topic_name], ["listed", "true"]]
    [(_word, topic_id)] = [line for line in lines if line[0] == "topic-id"]
    assert topic_id != "AAAAAAAAAAAAAAAAAAAAAA"  # Uuid.ZERO_UUID
    assert [line for line in lines if line[0] == "partition"] == [
        ["partition", str(p), "leader", "0", "replicas", "1", "isr", "1", "elr", "0",
         "last-known-elr", "0"] for p in range(3)]
    assert ["missing", "UnknownTopicOrPartitionException"] in lines
    # by id: the Java client sends Metadata v12 with an empty name beside the id
    assert ["by-id", topic_name, "3"] in lines
    assert ["missing-id", "UnknownTopicIdException"] in lines
    assert lines[-2:] == [["deleted", topic_name], ["listed", "false"]]
    assert topic_name not in admin.list_topics()


def test_idempotent_produce_is_read_back(java: JavaFlows, broker: BrokerProcess,
                                         topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, 2)
    lines = java.run("produce", broker.bootstrap, topic_name, "40")
    sent = {line[1]: (int(line[2]), int(line[3])) for line in lines if line[0] == "sent"}
    assert len(sent) == 40
    for partition in (0, 1):  # continuous offsets from 0 in each partition
        offsets = sorted(o for p, o in sent.values() if p == partition)
        assert offsets == list(range(len(offsets)))
    got = consume_confluent(broker.bootstrap, topic_name, 40, partitions=2)
    assert {present(g.rec.value).decode(): (g.partition, g.offset) for g in got} == sent


def test_group_subscribes_and_commits(java: JavaFlows, broker: BrokerProcess,
                                      topic_name: str,
                                      admin: kafka.admin.KafkaAdminClient) -> None:
    create_topic(broker.bootstrap, topic_name, 2)
    java.run("produce", broker.bootstrap, topic_name, "30")
    group = f"{topic_name}-group"
    lines = java.run("group", broker.bootstrap, topic_name, group, "30")
    consumed = [line for line in lines if line[0] == "consumed"]
    assert sorted(line[1] for line in consumed) == sorted(f"value-{i}" for i in range(30))
    ends = {int(line[2]): 0 for line in consumed}
    for line in consumed:
        ends[int(line[2])] = max(ends[int(line[2])], int(line[3]) + 1)
    assert ["assigned", "2"] in lines
    assert {int(line[1]): int(line[2]) for line in lines if line[0] == "committed"} == ends
    committed = admin.list_group_offsets(group)
    assert {tp.partition: meta.offset for tp, meta in committed[group].items()} == ends


def test_transactions_commit_abort_and_read_committed(
        java: JavaFlows, broker: BrokerProcess, topic_name: str,
        admin: kafka.admin.KafkaAdminClient) -> None:
    create_topic(broker.bootstrap, topic_name, 1)
    group = f"{topic_name}-txn-group"
    lines = java.run("transactions", broker.bootstrap, topic_name, f"{topic_name}-txn", group)
    assert ["committed", "transaction"] in lines and ["aborted", "transaction"] in lines
    assert [line[1] for line in lines if line[0] == "consumed"] == \
        ["committed-0", "committed-1", "committed-2", "committed-3"]
    # 3 committed, their marker, 2 aborted, their marker, 1 committed, its marker
    assert ["end", "9", "position", "9"] in lines
    assert ["group-offset", "7"] in lines
    committed = admin.list_group_offsets(group)
    assert {tp.partition: meta.offset for tp, meta in committed[group].items()} == {0: 7}


def test_abort_transaction_through_the_java_admin(java: JavaFlows, broker: BrokerProcess,
                                                 topic_name: str) -> None:
    """kafka-transactions.sh abort: Admin.abortTransaction sends WriteTxnMarkers to the
    partition's leader; the last stable offset moves past the hanging transaction."""
    create_topic(broker.bootstrap, topic_name, 1)
    lines = java.run("abort", broker.bootstrap, topic_name, f"{topic_name}-hanging")
    [(_word, _pid, start)] = [line for line in lines if line[0] == "open"]
    assert start == "0"
    assert ["aborted", f"{topic_name}-0"] in lines
    assert ["still-open", "0"] in lines
    assert ["end", "3"] in lines  # two aborted records and the marker: nothing held back
    conn = TxnConnection(broker.port)
    try:
        assert conn.committed_values(topic_name, 0) == []
    finally:
        conn.close()


def test_client_quotas_through_the_java_admin(java: JavaFlows, broker: BrokerProcess,
                                              topic_name: str) -> None:
    """The kafka-configs flow: the Java client sends our ``tenant`` entity type as given."""
    user, tenant = f"{topic_name}-user", f"{topic_name[:20]}-tenant"
    lines = java.run("quotas", broker.bootstrap, user, tenant)
    print("\n".join(" ".join(line) for line in lines))
    described = [line for line in lines if line[0] == "described"]
    assert lines[0] == ["altered", "2"]
    assert described[0] == ["described", "user", "1", f"user={user}",
                            "producer_byte_rate", "1048576.0"]
    assert described[1] == ["described", "tenant", "1", f"tenant={tenant}",
                            "producer_byte_rate", "2097152.0"]
    assert ["refused", "unknown-key", "InvalidRequestException"] in lines
    assert ["refused", "negative", "InvalidRequestException"] in lines
    assert described[2] == described[0]  # validate-only changed nothing
    assert described[3] == ["described", "user", "0"]  # its one key removed
    # the broker serves what Java stored to the Python clients too
    conn = RawConnection(broker.port)
    found = describe(conn, [])[1]
    assert found[parts({"tenant": tenant})] == {"producer_byte_rate": 2097152.0}
    assert parts({"user": user}) not in found
