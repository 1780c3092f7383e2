"""Security acceptance 4: ACLs with authorizationEnabled=true and superUserRoles=admin.

The superuser ``admin`` creates topics and ACLs with confluent-kafka's AdminClient; roles
get exactly what their ACLs grant (READ/WRITE imply DESCRIBE, DENY beats ALLOW, PREFIXED
patterns, namespace grants, group READ for joining and committing); describe_acls and
delete_acls work; the ACLs survive a restart; only superusers manage them; and with
authorization disabled CreateAcls answers SECURITY_DISABLED.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewPartitions,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from kafka import TopicPartition as KafkaTopicPartition
from kafka.admin import KafkaAdminClient
from kafka.errors import GroupAuthorizationFailedError, NoError, TopicAuthorizationFailedError
from kafka.protocol.admin import (
    CreateAclsRequest,
    CreateAclsResponse,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
)

from tests.broker_process import BrokerProcess
from tests.group_helpers import FAST_GROUPS, UNKNOWN_TOPIC_OR_PARTITION
from tests.security_helpers import (
    ACL_GROUP,
    CLUSTER_AUTHORIZATION_FAILED,
    GROUP_AUTHORIZATION_FAILED,
    NONE,
    SASL_AUTHENTICATION_FAILED,
    SECURITY_DISABLED,
    TOPIC_AUTHORIZATION_FAILED,
    Login,
    OpsConnection,
    TokenIssuer,
    grant,
    revoke,
)

TENANT = "acme"
COUNT = 30
PARTITIONS = 3


@dataclass
class AclBroker:
    broker: BrokerProcess
    issuer: TokenIssuer

    def login(self, role: str, username: str = TENANT) -> Login:
        return Login(self.broker.bootstrap, "SASL_PLAINTEXT", username, self.issuer.token(role))

    def admin(self, role: str = "admin", username: str = TENANT) -> AdminClient:
        return AdminClient(self.login(role, username).confluent())

    def conn(self, role: str, username: str = TENANT) -> OpsConnection:
        conn = OpsConnection(self.broker.port)
        conn.login(username, self.issuer.token(role))
        return conn

    def refused(self, role: str, username: str = TENANT) -> None:
        """Assert that ``role`` may not log in to the tenant (it holds no ACL there)."""
        conn = OpsConnection(self.broker.port)
        try:
            answer = conn.attempt_login(username, self.issuer.token(role))
            assert answer.error_code == SASL_AUTHENTICATION_FAILED, answer
            assert f"role {role} may not use tenant {username}" in answer.error_message
        finally:
            conn.close()


def allow(resource: ResourceType, name: str, role: str, operation: AclOperation,
          pattern: ResourcePatternType = ResourcePatternType.LITERAL,
          permission: AclPermissionType = AclPermissionType.ALLOW) -> AclBinding:
    return AclBinding(resource, name, pattern, f"User:{role}", "*", operation, permission)


def deny(resource: ResourceType, name: str, role: str, operation: AclOperation,
         pattern: ResourcePatternType = ResourcePatternType.LITERAL) -> AclBinding:
    return allow(resource, name, role, operation, pattern, AclPermissionType.DENY)


GRANTS = [
    # reader: READ on every topic starting with orders-, and READ on its group.
    allow(ResourceType.TOPIC, "orders-", "reader", AclOperation.READ,
          ResourcePatternType.PREFIXED),
    allow(ResourceType.GROUP, "reader-group", "reader", AclOperation.READ),
    # ... but orders-secret is denied to it (DENY beats the PREFIXED ALLOW).
    deny(ResourceType.TOPIC, "orders-secret", "reader", AclOperation.READ),
    # writer: WRITE on orders-1 only.
    allow(ResourceType.TOPIC, "orders-1", "writer", AclOperation.WRITE),
    # nsuser: the whole namespace acme/ns2 (a namespace grant), READ and WRITE, and groups.
    allow(ResourceType.TOPIC, f"{TENANT}/ns2/", "nsuser", AclOperation.ALL,
          ResourcePatternType.PREFIXED),
    allow(ResourceType.GROUP, "ns-", "nsuser", AclOperation.READ,
          ResourcePatternType.PREFIXED),
]


def create_acls(client: AdminClient, bindings: list[AclBinding]) -> None:
    for future in client.create_acls(bindings, request_timeout=15).values():
        future.result(15)


def produce_records(login: Login, topic: str, count: int = COUNT) -> list[Any]:
    """Produce ``count`` records; return the delivery errors (None for successes)."""
    reports: list[Any] = []
    producer = confluent_kafka.Producer({**login.confluent(), "acks": "all",
                                         "message.timeout.ms": 10000})
    for i in range(count):
        producer.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode(),
                         partition=i % PARTITIONS,
                         on_delivery=lambda err, _msg: reports.append(err))
    producer.flush(20)
    return reports


def consume_group(login: Login, topic: str, group: str, count: int,
                  timeout: float = 20) -> tuple[list[tuple[int, int, bytes]], list[int]]:
    """Subscribe in ``group`` and read up to ``count`` records, committing them; return
    the records and the error codes seen."""
    consumer = confluent_kafka.Consumer({
        **login.confluent(), "group.id": group, "enable.auto.commit": False,
        "auto.offset.reset": "earliest"})
    got: list[tuple[int, int, bytes]] = []
    errors: list[int] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            for msg in consumer.consume(100, 0.5):
                if msg.error() is not None:
                    errors.append(msg.error().code())
                    if msg.error().code() in (
                            confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED,
                            confluent_kafka.KafkaError.GROUP_AUTHORIZATION_FAILED):
                        return got, errors
                else:
                    got.append((msg.partition(), msg.offset(), msg.value()))
        if got:
            consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return got, errors


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclBroker]:
    base = Path(tmp_path_factory.mktemp("acls"))
    issuer = TokenIssuer("hmac", base / "keys")
    broker = BrokerProcess(base / "data", {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0", "authorizationEnabled": "true",
        "superUserRoles": "admin", "allowAutoTopicCreation": "false",
        **FAST_GROUPS, **issuer.settings,
    }).start()
    setup = AclBroker(broker, issuer)
    try:
        client = setup.admin()
        futures = client.create_topics([
            NewTopic(name, PARTITIONS, 1) for name in
            ("orders-1", "orders-2", "orders-secret", "payments", f"{TENANT}/ns2/n1")])
        for future in futures.values():
            future.result(15)
        for topic in ("orders-1", "orders-2", "orders-secret", "payments"):
            assert produce_records(setup.login("admin"), topic) == [None] * COUNT
        create_acls(client, GRANTS)
        yield setup
    finally:
        broker.stop()


def check_grants(acl: AclBroker) -> None:
    """The behaviour GRANTS must produce."""
    reader = acl.conn("reader")
    try:
        # READ (and the DESCRIBE it implies) on the prefix.
        for topic in ("orders-1", "orders-2"):
            assert reader.metadata([topic]).topics[0].error_code == NONE
            error, end = reader.list_offset(topic, 0, -1)
            assert error == NONE and end >= COUNT // PARTITIONS
            error, found = reader.fetch(topic, 0)
            assert error == NONE and [o for o, _k, _v in found] == list(range(end))
        # No WRITE.
        assert reader.produce("orders-1", 1) == TOPIC_AUTHORIZATION_FAILED
        # DENY beats ALLOW on orders-secret.
        assert reader.fetch("orders-secret", 0) == (TOPIC_AUTHORIZATION_FAILED, [])
        # (Kafka's rule: a DENY of READ does not deny the DESCRIBE that the ALLOW of READ
        # implies, so the topic stays visible.)
        assert reader.metadata(["orders-secret"]).topics[0].error_code == NONE
        assert reader.list_offset("orders-secret", 0, -1)[0] == NONE
        # Nothing outside the prefix, nor other management operations.
        assert reader.fetch("payments", 0) == (TOPIC_AUTHORIZATION_FAILED, [])
        assert reader.metadata(["payments"]).topics[0].error_code == TOPIC_AUTHORIZATION_FAILED
        assert reader.delete_topic("orders-1") == TOPIC_AUTHORIZATION_FAILED
        assert reader.delete_records("orders-1", 0, 1) == TOPIC_AUTHORIZATION_FAILED
        assert reader.create_partitions("orders-1", 5) == TOPIC_AUTHORIZATION_FAILED
        assert reader.alter_config("orders-1", "retention.ms", "1") == \
            TOPIC_AUTHORIZATION_FAILED
        assert reader.cluster_errors() == (CLUSTER_AUTHORIZATION_FAILED,) * 2
        assert reader.create_topic("orders-new") == TOPIC_AUTHORIZATION_FAILED
        listed = {t.name for t in reader.metadata(None).topics}
        assert listed == {"orders-1", "orders-2", "orders-secret"}, listed
        # Its group needs READ on the group: granted for reader-group only.
        assert reader.simple_commit("other-group", "orders-1", {0: 1}) == \
            {0: GROUP_AUTHORIZATION_FAILED}
        assert reader.find_coordinator(["other-group"], 4).coordinators[0].error_code == \
            GROUP_AUTHORIZATION_FAILED
    finally:
        reader.close()
    writer = acl.conn("writer")
    try:
        assert writer.produce("orders-1", 2) == NONE
        assert writer.fetch("orders-1", 0)[0] == TOPIC_AUTHORIZATION_FAILED
        assert writer.produce("orders-2", 1) == TOPIC_AUTHORIZATION_FAILED
        assert writer.metadata(["orders-1"]).topics[0].error_code == NONE  # WRITE => DESCRIBE
    finally:
        writer.close()
    nsuser = acl.conn("nsuser", f"{TENANT}/ns2")
    try:
        assert nsuser.produce("n1", 1) == NONE
        assert nsuser.fetch("n1", 0)[0] == NONE
        assert nsuser.fetch(f"{TENANT}/default/orders-1", 0)[0] == TOPIC_AUTHORIZATION_FAILED
        assert nsuser.simple_commit("ns-g", "n1", {0: 1}) == {0: NONE}
        assert nsuser.simple_commit("other", "n1", {0: 1}) == {0: GROUP_AUTHORIZATION_FAILED}
    finally:
        nsuser.close()
    acl.refused("stranger")  # no ACL in the tenant: not even a login


def test_reader_consumes_but_cannot_produce(acl_broker: AclBroker) -> None:
    login = acl_broker.login("reader")
    got, errors = consume_group(login, "orders-2", "reader-group", COUNT)
    assert errors == []
    assert sorted((p, o) for p, o, _v in got) == sorted(
        (p, o) for p in range(PARTITIONS) for o in range(COUNT // PARTITIONS))
    # The group's offsets were committed under READ on reader-group.
    conn = acl_broker.conn("reader")
    try:
        assert conn.all_offsets("reader-group") == (NONE, {
            ("orders-2", p): COUNT // PARTITIONS for p in range(PARTITIONS)})
    finally:
        conn.close()
    reports = produce_records(login, "orders-2", 3)
    assert len(reports) == 3 and all(r is not None for r in reports)
    assert {r.code() for r in reports} == {confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED}


def test_reader_group_needs_group_acl(acl_broker: AclBroker) -> None:
    got, errors = consume_group(acl_broker.login("reader"), "orders-1", "unlisted-group",
                                COUNT, timeout=10)
    assert got == []
    assert confluent_kafka.KafkaError.GROUP_AUTHORIZATION_FAILED in errors, errors


def test_offset_commit_checks_the_group_before_the_topics(acl_broker: AclBroker) -> None:
    """As Kafka: a caller denied READ on the group gets GROUP_AUTHORIZATION_FAILED for
    every partition, whatever its topic (one it may not read, one that does not exist, a
    partition out of range): the topics are not looked at, nor told about."""
    conn = acl_broker.conn("reader")
    try:
        for topic, partition in (("payments", 0), ("orders-missing", 0), ("orders-1", 7),
                                 ("orders-1", 0)):
            assert conn.simple_commit("other-group", topic, {partition: 1}) == \
                {partition: GROUP_AUTHORIZATION_FAILED}, topic
        # allowed on the group, the topics' own errors
        assert conn.simple_commit("reader-group", "payments", {0: 1}) == \
            {0: TOPIC_AUTHORIZATION_FAILED}
        assert conn.simple_commit("reader-group", "orders-missing", {0: 1}) == \
            {0: UNKNOWN_TOPIC_OR_PARTITION}
    finally:
        conn.close()


def test_offset_delete_needs_delete_on_the_group_and_read_on_the_topic(
        acl_broker: AclBroker) -> None:
    """OffsetDelete, as Kafka authorizes it: without DELETE on the group the whole request
    is GROUP_AUTHORIZATION_FAILED (READ on it is not enough); with it, a partition of a
    topic the caller may not READ is TOPIC_AUTHORIZATION_FAILED and left alone."""
    client = acl_broker.admin()
    grants = [allow(ResourceType.GROUP, "cleanup-group", "cleaner", AclOperation.DELETE),
              allow(ResourceType.TOPIC, "orders-1", "cleaner", AclOperation.READ)]
    create_acls(client, grants)
    root = acl_broker.conn("admin")
    cleaner = KafkaAdminClient(**acl_broker.login("cleaner").kafka_python())
    reader = KafkaAdminClient(**acl_broker.login("reader").kafka_python())
    try:
        for topic in ("orders-1", "payments"):
            assert root.simple_commit("cleanup-group", topic, {0: 1}) == {0: NONE}
        assert root.simple_commit("reader-group", "orders-1", {2: 1}) == {2: NONE}
        assert cleaner.delete_group_offsets("cleanup-group", [
            KafkaTopicPartition("orders-1", 0), KafkaTopicPartition("payments", 0)]) == {
            KafkaTopicPartition("orders-1", 0): NoError,
            KafkaTopicPartition("payments", 0): TopicAuthorizationFailedError}
        assert root.all_offsets("cleanup-group") == (NONE, {("payments", 0): 1})
        with pytest.raises(GroupAuthorizationFailedError):  # READ on reader-group only
            reader.delete_group_offsets("reader-group", [KafkaTopicPartition("orders-1", 2)])
        conn = acl_broker.conn("reader")
        try:
            answer = conn.offset_delete("reader-group", "orders-1", [2])
            assert (answer.error_code, answer.topics) == (GROUP_AUTHORIZATION_FAILED, [])
        finally:
            conn.close()
        assert root.all_offsets("reader-group")[1][("orders-1", 2)] == 1
    finally:
        cleaner.close()
        reader.close()
        root.close()
        doomed = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY,
                                  "User:cleaner", None, AclOperation.ANY,
                                  AclPermissionType.ANY)
        for future in client.delete_acls([doomed], request_timeout=15).values():
            assert len(future.result(15)) == len(grants)


def test_acls_decide_every_operation(acl_broker: AclBroker) -> None:
    check_grants(acl_broker)


def test_acls_do_not_cross_tenants(acl_broker: AclBroker) -> None:
    """reader's ACLs are acme's: it may not log in to another tenant, and once an ACL there
    lets it, it reaches nothing of acme and nothing of that tenant."""
    acl_broker.refused("reader", "other")
    root = acl_broker.conn("admin", "other")
    assert grant(root, ACL_GROUP, "unused", "User:reader") == NONE
    other = acl_broker.conn("reader", "other")
    try:
        for name in (f"{TENANT}/default/orders-1", f"persistent://{TENANT}/default/orders-1",
                     "orders-1"):
            assert other.fetch(name, 0)[0] in (TOPIC_AUTHORIZATION_FAILED,)
        assert other.metadata(None).topics == []
        # acme's group ACL does not cross (checked first, as Kafka); with a group of the
        # tenant it may read, acme's topic is still out of reach
        assert other.simple_commit("reader-group", f"{TENANT}/default/orders-1", {0: 0}) == \
            {0: GROUP_AUTHORIZATION_FAILED}
        assert other.simple_commit("unused", f"{TENANT}/default/orders-1", {0: 0}) == \
            {0: TOPIC_AUTHORIZATION_FAILED}
    finally:
        other.close()
        assert revoke(root, ACL_GROUP, "unused", "User:reader") == (NONE, 1)
        root.close()


def test_partition_cap_tells_nothing_of_topics_one_may_not_alter(
        acl_broker: AclBroker) -> None:
    """The 10,000-partitions cap counts only topics the caller may alter, as Kafka does, so
    an existing hidden topic and a missing one answer alike; a name twice in one request
    answers INVALID_REQUEST."""
    reader = acl_broker.admin("reader")
    for name in ("orders-secret", "no-such-topic"):
        with pytest.raises(confluent_kafka.KafkaException) as refused:
            reader.create_partitions([NewPartitions(name, 50_000)])[name].result(15)
        assert refused.value.args[0].name() == "TOPIC_AUTHORIZATION_FAILED"
    admin = acl_broker.admin()
    with pytest.raises(confluent_kafka.KafkaException) as capped:
        admin.create_partitions([NewPartitions("payments", 50_000)])["payments"].result(15)
    assert capped.value.args[0].name() == "POLICY_VIOLATION"
    raw = acl_broker.conn("admin")
    try:
        topic = CreatePartitionsRequest.CreatePartitionsTopic(name="payments", count=5,
                                                              assignments=None)
        answer = raw.call(CreatePartitionsRequest[2](topics=[topic, topic], timeout_ms=5000,
                                                     validate_only=True), 2,
                          CreatePartitionsResponse)
        assert [r.error_code for r in answer.results] == [42, 42]  # INVALID_REQUEST
    finally:
        raw.close()


def test_describe_acls(acl_broker: AclBroker) -> None:
    client = acl_broker.admin()
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                  AclOperation.ANY, AclPermissionType.ANY)
    found = client.describe_acls(everything, request_timeout=15).result(15)
    for binding in GRANTS:
        assert binding in found, (binding, found)
    readers = client.describe_acls(AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, "User:reader", None, AclOperation.ANY,
        AclPermissionType.ANY), request_timeout=15).result(15)
    assert sorted(map(str, readers)) == sorted(
        str(b) for b in GRANTS if b.principal == "User:reader")
    denies = client.describe_acls(AclBindingFilter(
        ResourceType.TOPIC, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
        AclPermissionType.DENY), request_timeout=15).result(15)
    assert [str(b) for b in denies] == [str(GRANTS[2])]
    # MATCH finds every binding that applies to a topic name, literal and prefixed.
    matching = client.describe_acls(AclBindingFilter(
        ResourceType.TOPIC, "orders-secret", ResourcePatternType.MATCH, None, None,
        AclOperation.ANY, AclPermissionType.ANY), request_timeout=15).result(15)
    assert sorted(map(str, matching)) == sorted(map(str, GRANTS[0:1] + GRANTS[2:3]))
    # a filter of any resource type names a topic as its clients know it, as for TOPIC
    any_type = client.describe_acls(AclBindingFilter(
        ResourceType.ANY, "orders-secret", ResourcePatternType.MATCH, None, None,
        AclOperation.ANY, AclPermissionType.ANY), request_timeout=15).result(15)
    assert sorted(map(str, any_type)) == sorted(map(str, matching))


def test_describe_acls_needs_a_superuser(acl_broker: AclBroker) -> None:
    conn = acl_broker.conn("reader")
    try:
        answer = conn.call(DescribeAclsRequest[2](
            resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1,
            principal_filter=None, host_filter=None, operation=1, permission_type=1), 2,
            DescribeAclsResponse)
        assert answer.error_code == CLUSTER_AUTHORIZATION_FAILED
        assert answer.resources == []
    finally:
        conn.close()


def test_non_superuser_cannot_create_acls(acl_broker: AclBroker) -> None:
    client = acl_broker.admin("reader")
    binding = allow(ResourceType.TOPIC, "payments", "reader", AclOperation.ALL)
    futures = client.create_acls([binding], request_timeout=15)
    with pytest.raises(confluent_kafka.KafkaException) as info:
        futures[binding].result(15)
    assert info.value.args[0].code() == confluent_kafka.KafkaError.CLUSTER_AUTHORIZATION_FAILED
    conn = acl_broker.conn("reader")
    try:
        answer = conn.call(CreateAclsRequest[2](creations=[CreateAclsRequest.AclCreation(
            resource_type=2, resource_name="payments", resource_pattern_type=3,
            principal="User:reader", host="*", operation=2, permission_type=3)]), 2,
            CreateAclsResponse)
        assert [r.error_code for r in answer.results] == [CLUSTER_AUTHORIZATION_FAILED]
        assert answer.results[0].error_message
        assert conn.fetch("payments", 0)[0] == TOPIC_AUTHORIZATION_FAILED
    finally:
        conn.close()


def test_delete_acls(acl_broker: AclBroker) -> None:
    client = acl_broker.admin()
    temp = allow(ResourceType.TOPIC, "payments", "temp", AclOperation.WRITE)
    create_acls(client, [temp])
    conn = acl_broker.conn("temp")
    try:
        assert conn.produce("payments", 1) == NONE
    finally:
        conn.close()
    doomed = AclBindingFilter(ResourceType.TOPIC, "payments", ResourcePatternType.LITERAL,
                              "User:temp", None, AclOperation.ANY, AclPermissionType.ANY)
    (future,) = client.delete_acls([doomed], request_timeout=15).values()
    assert [str(b) for b in future.result(15)] == [str(temp)]
    acl_broker.refused("temp")  # its only ACL of the tenant is gone
    # A non-superuser cannot delete ACLs either.
    reader_admin = acl_broker.admin("reader")
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                  AclOperation.ANY, AclPermissionType.ANY)
    (future,) = reader_admin.delete_acls([everything], request_timeout=15).values()
    with pytest.raises(confluent_kafka.KafkaException) as info:
        future.result(15)
    assert info.value.args[0].code() == confluent_kafka.KafkaError.CLUSTER_AUTHORIZATION_FAILED
    remaining = client.describe_acls(everything, request_timeout=15).result(15)
    assert sorted(map(str, remaining)) == sorted(map(str, GRANTS))


def test_acls_survive_a_restart(acl_broker: AclBroker) -> None:
    assert acl_broker.broker.stop() == 0
    acl_file = acl_broker.broker.data_dir / "acls.json"
    assert acl_file.exists()
    acl_broker.broker.start()
    check_grants(acl_broker)
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                  AclOperation.ANY, AclPermissionType.ANY)
    client = acl_broker.admin()
    remaining = client.describe_acls(everything, request_timeout=15).result(15)
    assert sorted(map(str, remaining)) == sorted(map(str, GRANTS))
    got, errors = consume_group(acl_broker.login("reader"), "orders-1", "reader-group", COUNT)
    assert errors == [] and len(got) >= COUNT


def test_create_acls_with_authorization_disabled(tmp_path: Path) -> None:
    issuer = TokenIssuer("hmac", tmp_path / "keys")
    broker = BrokerProcess(tmp_path / "data", {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0", "superUserRoles": "admin",
        **issuer.settings}).start()
    try:
        conn = OpsConnection(broker.port)
        conn.login(TENANT, issuer.token("admin"))
        answer = conn.call(CreateAclsRequest[2](creations=[CreateAclsRequest.AclCreation(
            resource_type=2, resource_name="t", resource_pattern_type=3,
            principal="User:x", host="*", operation=3, permission_type=3)]), 2,
            CreateAclsResponse)
        assert [r.error_code for r in answer.results] == [SECURITY_DISABLED]
        conn.close()
        client = AdminClient(Login(broker.bootstrap, "SASL_PLAINTEXT", TENANT,
                                   issuer.token("admin")).confluent())
        binding = allow(ResourceType.TOPIC, "t", "x", AclOperation.READ)
        with pytest.raises(confluent_kafka.KafkaException) as info:
            client.create_acls([binding], request_timeout=15)[binding].result(15)
        assert info.value.args[0].code() == confluent_kafka.KafkaError.SECURITY_DISABLED
        assert not (tmp_path / "data" / "acls.json").exists()
    finally:
        broker.stop()
