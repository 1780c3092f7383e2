"""Authorized operations (KIP-430) as Kafka reports them, read with confluent-kafka's admin
API (``include_authorized_operations=True``) and over raw connections.

Kafka asks about every operation its authorizer supports for the resource type: 7 for the
cluster (ALTER, ALTER_CONFIGS, CLUSTER_ACTION, CREATE, DESCRIBE, DESCRIBE_CONFIGS,
IDEMPOTENT_WRITE), 8 for a topic, 3 for a group. A superuser and a principal holding ALL on
the cluster get the full sets; a limited principal gets what its ACLs grant (READ implies
DESCRIBE). Asking is not an attempt: it writes no authorization denial to the audit topic.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import TopicCollection
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from kafka.protocol.admin import DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from tests.broker_process import BrokerProcess
from tests.security_helpers import NONE, Login, OpsConnection, TokenIssuer, audit_events

TENANT = "acme"
CLUSTER = {"ALTER", "ALTER_CONFIGS", "CLUSTER_ACTION", "CREATE", "DESCRIBE",
           "DESCRIBE_CONFIGS", "IDEMPOTENT_WRITE"}
TOPIC = {"READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE", "DESCRIBE_CONFIGS",
         "ALTER_CONFIGS"}
GROUP = {"READ", "DESCRIBE", "DELETE"}
CODES = {"READ": 3, "WRITE": 4, "CREATE": 5, "DELETE": 6, "ALTER": 7, "DESCRIBE": 8,
         "CLUSTER_ACTION": 9, "DESCRIBE_CONFIGS": 10, "ALTER_CONFIGS": 11,
         "IDEMPOTENT_WRITE": 12}


@dataclass
class OpsBroker:
    broker: BrokerProcess
    issuer: TokenIssuer

    def login(self, role: str) -> Login:
        return Login(self.broker.bootstrap, "SASL_PLAINTEXT", TENANT, self.issuer.token(role))

    def admin(self, role: str) -> AdminClient:
        return AdminClient(self.login(role).confluent())

    def conn(self, role: str) -> OpsConnection:
        conn = OpsConnection(self.broker.port)
        conn.login(TENANT, self.issuer.token(role))
        return conn


def allow(resource: ResourceType, name: str, role: str, operation: AclOperation) -> AclBinding:
    return AclBinding(resource, name, ResourcePatternType.LITERAL, f"User:{role}", "*",
                      operation, AclPermissionType.ALLOW)


@pytest.fixture(scope="module")
def ops_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpsBroker]:
    base = Path(tmp_path_factory.mktemp("authorized-operations"))
    issuer = TokenIssuer("hmac", base / "keys")
    broker = BrokerProcess(base / "data", {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0,PLAINTEXT://127.0.0.1:0",
        "authorizationEnabled": "true", "superUserRoles": "admin,ANONYMOUS",
        **issuer.settings}).start()
    setup = OpsBroker(broker, issuer)
    try:
        root = setup.admin("admin")
        root.create_topics([NewTopic("payments", 1, 1)])["payments"].result(15)
        grants = [
            allow(ResourceType.BROKER, "kafka-cluster", "clusterall", AclOperation.ALL),
            allow(ResourceType.BROKER, "kafka-cluster", "viewer", AclOperation.DESCRIBE),
            allow(ResourceType.TOPIC, "payments", "viewer", AclOperation.READ),
            allow(ResourceType.GROUP, "ops-g", "viewer", AclOperation.DESCRIBE),
        ]
        for future in root.create_acls(grants, request_timeout=15).values():
            future.result(15)
        conn = setup.conn("admin")
        try:
            assert conn.simple_commit("ops-g", "payments", {0: 0}) == {0: NONE}
        finally:
            conn.close()
        yield setup
    finally:
        broker.stop()


def names(operations: list[AclOperation] | None) -> set[str]:
    assert operations is not None, "no authorized operations were reported"
    return {operation.name for operation in operations}


def cluster_operations(client: AdminClient) -> set[str]:
    described = client.describe_cluster(include_authorized_operations=True,
                                        request_timeout=15).result(15)
    return names(described.authorized_operations)


def topic_operations(client: AdminClient, topic: str) -> set[str]:
    futures = client.describe_topics(TopicCollection([topic]),
                                     include_authorized_operations=True, request_timeout=15)
    return names(futures[topic].result(15).authorized_operations)


def group_operations(client: AdminClient, group: str) -> set[str]:
    futures = client.describe_consumer_groups([group], include_authorized_operations=True,
                                              request_timeout=15)
    return names(futures[group].result(15).authorized_operations)


def test_a_superuser_gets_every_supported_operation(ops_broker: OpsBroker) -> None:
    client = ops_broker.admin("admin")
    assert cluster_operations(client) == CLUSTER
    assert topic_operations(client, "payments") == TOPIC
    assert group_operations(client, "ops-g") == GROUP
    assert group_operations(client, "no-such-group") == GROUP  # Dead, still answered


def test_all_on_the_cluster_gives_the_seven_cluster_operations(ops_broker: OpsBroker) -> None:
    assert cluster_operations(ops_broker.admin("clusterall")) == CLUSTER
    conn = ops_broker.conn("clusterall")
    try:
        request = MetadataRequest[10](
            topics=[], allow_auto_topic_creation=False,
            include_cluster_authorized_operations=True,
            include_topic_authorized_operations=False)
        answer = conn.call(request, 10, MetadataResponse)
        assert set(answer.authorized_operations) == {CODES[name] for name in CLUSTER}
    finally:
        conn.close()


def test_a_limited_principal_gets_what_its_acls_grant(ops_broker: OpsBroker) -> None:
    client = ops_broker.admin("viewer")
    assert cluster_operations(client) == {"DESCRIBE"}
    assert topic_operations(client, "payments") == {"READ", "DESCRIBE"}
    assert group_operations(client, "ops-g") == {"DESCRIBE"}
    conn = ops_broker.conn("viewer")
    try:
        request = DescribeTopicPartitionsRequest[0](
            topics=[DescribeTopicPartitionsRequest.TopicRequest(name="payments")],
            response_partition_limit=10, cursor=None)
        answer = conn.call(request, 0, DescribeTopicPartitionsResponse)
        (topic,) = answer.topics
        assert topic.error_code == NONE
        assert topic.topic_authorized_operations == (1 << CODES["READ"]) | (
            1 << CODES["DESCRIBE"])
    finally:
        conn.close()


def test_asking_is_not_an_attempt(ops_broker: OpsBroker) -> None:
    """The operations a principal lacks are not written to __audit as denials."""
    client = ops_broker.admin("viewer")
    for _ in range(3):
        assert cluster_operations(client) == {"DESCRIBE"}
        assert topic_operations(client, "payments") == {"READ", "DESCRIBE"}
    events = audit_events(f"127.0.0.1:{ops_broker.broker.ports['PLAINTEXT']}")
    assert any(e["kind"] == "authentication" and e["principal"] == "viewer" for e in events)
    denied = [e for e in events if e["outcome"] == "denied" and e["principal"] == "viewer"]
    assert denied == []
