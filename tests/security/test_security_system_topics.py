"""The broker's own topics belong to the broker: a tenant admin cannot reach them.

The default tenant ``public`` also holds the system namespace ``public/__kafka`` (group
offsets, transactions, the ``__audit`` topic with every tenant's logins). An admin of tenant
``public`` (ALL on the cluster, so it manages its tenant's ACLs) tries to grant itself READ
on ``__audit`` and to read it with a real client: the grants naming the namespace are
refused, the wildcard and prefixed grants it may create do not reach it, nor does an ACL
left in ``acls.json`` by an older broker; the superuser still reads it.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from broker_core.storage import open_storage
from edge.acl_store import AclStore
from edge.acls import AclBinding as StoredBinding
from edge.acls import AclOperation as StoredOperation
from edge.acls import AclPattern, AclPermission, AclResource
from tests.broker_process import BrokerProcess
from tests.clients import present
from tests.security_helpers import (
    ACL_GROUP,
    NONE,
    TOPIC_AUTHORIZATION_FAILED,
    Login,
    OpsConnection,
    TokenIssuer,
)
from tests.security_helpers import grant as raw_grant

AUDIT = "public/__kafka/__audit"
OFFSETS = "public/__kafka/__consumer_offsets"
INVALID_REQUEST = 42


def grant(name: str, role: str, operation: AclOperation,
          pattern: ResourcePatternType = ResourcePatternType.LITERAL,
          resource: ResourceType = ResourceType.TOPIC) -> AclBinding:
    return AclBinding(resource, name, pattern, f"User:{role}", "*", operation,
                      AclPermissionType.ALLOW)


def create_error(client: AdminClient, binding: AclBinding) -> int:
    """The error code CreateAcls answers for one binding (0 when created)."""
    (future,) = client.create_acls([binding], request_timeout=15).values()
    try:
        future.result(15)
    except confluent_kafka.KafkaException as error:
        return int(error.args[0].code())
    return NONE


def read_topic(login: Login, topic: str, timeout: float = 15.0
               ) -> tuple[list[dict[str, object]], set[int]]:
    """Subscribe to ``topic`` with confluent-kafka and read it from the start: the JSON
    values and the error codes the consumer reported."""
    consumer = confluent_kafka.Consumer({**login.confluent(), "group.id": "snoop",
                                         "enable.auto.commit": False,
                                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    values: list[dict[str, object]] = []
    errors: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and not errors:
            batch = consumer.consume(100, 0.5)
            for msg in batch:
                if msg.error() is not None:
                    errors.add(int(present(msg.error()).code()))
                else:
                    values.append(json.loads(present(msg.value())))
            if values and not batch:
                break
    finally:
        consumer.close()
    return values, errors


def test_a_tenant_admin_cannot_reach_the_system_namespace(tmp_path: Path) -> None:
    issuer = TokenIssuer("hmac", tmp_path / "keys")
    data = tmp_path / "data"
    # An ACL an older broker accepted from the tenant admin: it must not count any more.
    storage = open_storage(data.as_uri())
    asyncio.run(AclStore(storage.kv).add([StoredBinding(
        "public", AclResource.TOPIC, AUDIT, AclPattern.LITERAL, "User:padmin", "*",
        StoredOperation.READ, AclPermission.ALLOW)]))
    storage.close()
    broker = BrokerProcess(data, {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0", "authorizationEnabled": "true",
        "superUserRoles": "admin", **issuer.settings}).start()
    try:
        superuser = Login(broker.bootstrap, "SASL_PLAINTEXT", "public", issuer.token("admin"))
        tenant_admin = Login(broker.bootstrap, "SASL_PLAINTEXT", "public",
                             issuer.token("padmin"))
        root = AdminClient(superuser.confluent())
        assert create_error(root, grant("kafka-cluster", "padmin", AclOperation.ALL,
                                        resource=ResourceType.BROKER)) == NONE
        # Another tenant logs in (carol holds an ACL of acme): its login is one of the
        # events in __audit.
        acme_root = OpsConnection(broker.port)
        acme_root.login("acme", issuer.token("admin"))
        assert raw_grant(acme_root, ACL_GROUP, "g", "User:carol") == NONE
        acme_root.close()
        other = OpsConnection(broker.port)
        other.login("acme", issuer.token("carol"))
        other.close()

        admin = AdminClient(tenant_admin.confluent())
        cluster_denied = confluent_kafka.KafkaError.CLUSTER_AUTHORIZATION_FAILED
        for binding in (
            grant(AUDIT, "padmin", AclOperation.READ),
            grant("persistent://" + AUDIT, "padmin", AclOperation.ALL),
            grant("public/__kafka/", "padmin", AclOperation.READ, ResourcePatternType.PREFIXED),
            grant("public/__kafka", "padmin", AclOperation.READ, ResourcePatternType.PREFIXED),
            grant("public/__kafka/__a", "padmin", AclOperation.READ,
                  ResourcePatternType.PREFIXED),
            grant("acme/__kafka/__consumer_offsets", "padmin", AclOperation.READ),
        ):
            assert create_error(admin, binding) == cluster_denied, binding
        # Grants of its own tenant are fine, and would match the system topics by pattern.
        for binding in (
            grant("*", "padmin", AclOperation.ALL),
            grant("public/", "padmin", AclOperation.ALL, ResourcePatternType.PREFIXED),
            grant("*", "padmin", AclOperation.ALL, resource=ResourceType.GROUP),
        ):
            assert create_error(admin, binding) == NONE, binding

        values, errors = read_topic(tenant_admin, AUDIT)
        assert values == [] and errors == {TOPIC_AUTHORIZATION_FAILED}
        conn = OpsConnection(broker.port)
        conn.login("public", issuer.token("padmin"))
        try:
            assert conn.create_topic("mine") == NONE
            assert conn.simple_commit("g", "mine", {0: 1}) == {0: NONE}  # makes OFFSETS
            for topic in (AUDIT, OFFSETS, "persistent://" + AUDIT):
                assert conn.fetch(topic, 0) == (TOPIC_AUTHORIZATION_FAILED, [])
                assert conn.metadata([topic]).topics[0].error_code == \
                    TOPIC_AUTHORIZATION_FAILED
                assert conn.list_offset(topic, 0)[0] == TOPIC_AUTHORIZATION_FAILED
                assert conn.describe_configs(topic) == TOPIC_AUTHORIZATION_FAILED
            listed = {t.name for t in conn.metadata(None).topics}
            assert listed == {"mine"}, listed
        finally:
            conn.close()

        # The superuser still reads every tenant's events; an ACL there is refused as one
        # that could never apply.
        events, errors = read_topic(superuser, AUDIT)
        assert errors == set()
        assert any(e["tenant"] == "acme" and e["outcome"] == "success" for e in events)
        assert any(e["principal"] == "padmin" and e["outcome"] == "denied" for e in events)
        raw = OpsConnection(broker.port)
        raw.login("public", issuer.token("admin"))
        try:
            assert raw.fetch(AUDIT, 0)[0] == NONE
        finally:
            raw.close()
        assert create_error(root, grant(AUDIT, "padmin", AclOperation.READ)) == \
            confluent_kafka.KafkaError.INVALID_REQUEST
    finally:
        broker.stop()


@pytest.mark.parametrize("username", ["public", "acme"])
def test_without_acls_a_tenant_login_cannot_read_system_topics(tmp_path: Path,
                                                               username: str) -> None:
    """With authorization disabled the tenant boundary still holds, and the system
    namespace of the login's own tenant is the broker's, not the tenant's."""
    issuer = TokenIssuer("hmac", tmp_path / "keys")
    broker = BrokerProcess(tmp_path / "data", {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0", **issuer.settings}).start()
    try:
        conn = OpsConnection(broker.port)
        conn.login(username, issuer.token("someone"))
        try:
            assert conn.create_topic("mine") == NONE
            assert conn.simple_commit("g", "mine", {0: 1}) == {0: NONE}
            for topic in (AUDIT, f"{username}/__kafka/__consumer_offsets"):
                assert conn.fetch(topic, 0) == (TOPIC_AUTHORIZATION_FAILED, [])
        finally:
            conn.close()
        values, errors = read_topic(
            Login(broker.bootstrap, "SASL_PLAINTEXT", username, issuer.token("someone")),
            AUDIT)
        assert values == [] and errors == {TOPIC_AUTHORIZATION_FAILED}
    finally:
        broker.stop()
