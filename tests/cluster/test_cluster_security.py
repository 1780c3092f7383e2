"""Logins and ACLs on three brokers sharing one PostgreSQL, authorization on: SASL/PLAIN
``token:<JWT>`` logins work through every broker (each client follows the partitions to
the other brokers and logs in there too), an ACL created or deleted through one broker
takes effect on the others, and the whole cluster stopped with SIGTERM and started again
keeps its topics, records, committed offsets and ACLs."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest

from tests.clients import Rec, make_records
from tests.cluster.test_cluster import PARTITIONS
from tests.cluster.test_cluster_propagation import (
    _acl,
    create_acls,
    delete_acl,
    eventually,
    topic_error,
)
from tests.cluster_helpers import Cluster, running_cluster
from tests.group_helpers import FAST_GROUPS, wait_until
from tests.security_helpers import (
    CONSUMERS,
    NONE,
    PRODUCERS,
    SASL_AUTHENTICATION_FAILED,
    TOPIC_AUTHORIZATION_FAILED,
    Login,
    TenantLogins,
    TokenIssuer,
    check_roundtrip,
    consume_confluent,
    produce_confluent,
)

TENANT = TenantLogins.tenant
GROUP_RESOURCE = 3


@dataclass
class Secured(TenantLogins):
    """The cluster, and the issuer of the tokens its brokers accept."""

    cluster: Cluster
    issuer: TokenIssuer


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    root = Path(tmp_path_factory.mktemp("secured"))
    issuer = TokenIssuer("hmac", root / "keys")
    admin = Login("", "SASL_PLAINTEXT", TENANT, issuer.token("admin")).confluent()
    del admin["bootstrap.servers"]
    with running_cluster(root, settings={
            "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0", "authorizationEnabled": "true",
            "superUserRoles": "admin", "allowAutoTopicCreation": "false",
            **FAST_GROUPS, **issuer.settings}, client=admin) as cluster:
        yield Secured(cluster, issuer)


def records(count: int, base_ts: int) -> list[Rec]:
    """make_records spread over this module's partitions."""
    return [dataclasses.replace(rec, partition=i % PARTITIONS)
            for i, rec in enumerate(make_records(count, base_ts))]


def group_acl(role: str) -> dict[str, Any]:
    """READ on the group id tests.clients' assign-only consumers carry (librdkafka looks
    its coordinator up even so)."""
    return {**_acl("unused-assign-only", role), "resource_type": GROUP_RESOURCE}


def create_topic(secured: Secured, topic: str) -> None:
    conn = secured.conn(secured.cluster.brokers[0])
    try:
        assert conn.create_topic(topic, PARTITIONS) == NONE
    finally:
        conn.close()


def test_logins_work_through_every_broker(secured: Secured, topic_name: str) -> None:
    """Each client bootstraps from another broker and logs in wherever a partition leads."""
    create_topic(secured, topic_name)
    brokers = secured.cluster.brokers
    assert set(secured.cluster.leaders(topic_name).values()) == {0, 1, 2}
    sent: list[Rec] = []
    for i, produce in enumerate(PRODUCERS.values()):
        recs = records(PARTITIONS * 5, 1_700_000_000_000 + 1000 * i)
        produce(secured.login(brokers[i]), topic_name, recs)
        sent += recs
    for i, consume in enumerate(CONSUMERS.values()):
        got = consume(secured.login(brokers[(i + 1) % len(brokers)]), topic_name, len(sent),
                      PARTITIONS)
        check_roundtrip(sent, got)


def test_an_acl_created_through_one_broker_is_enforced_on_the_others(
        secured: Secured, topic_name: str) -> None:
    create_topic(secured, topic_name)
    first, second, third = secured.cluster.brokers
    recs = records(PARTITIONS * 2, 1_700_000_000_000)
    produce_confluent(secured.login(first), topic_name, recs)
    # reader holds no ACL of the tenant yet: no broker lets it log in
    assert [secured.login_error(broker, "reader") for broker in (second, third)] == \
        [SASL_AUTHENTICATION_FAILED] * 2
    grant = _acl(topic_name, "reader")
    admin = secured.conn(first)
    try:
        create_acls(admin, [grant, group_acl("reader")])
    finally:
        admin.close()
    eventually(lambda: all(secured.login_error(broker, "reader") == NONE
                           for broker in (second, third)),
               "the new ACLs letting reader log in on the other brokers")
    readers = [secured.conn(broker, "reader") for broker in (second, third)]
    try:
        eventually(lambda: all(topic_error(r, topic_name) == NONE for r in readers),
                   "the new ACL enforced on the other brokers")
        check_roundtrip(recs, consume_confluent(secured.login(third, "reader"), topic_name,
                                                len(recs), PARTITIONS))
        admin = secured.conn(second)  # deleted through another broker
        try:
            delete_acl(admin, grant)
        finally:
            admin.close()
        eventually(lambda: all(topic_error(r, topic_name) == TOPIC_AUTHORIZATION_FAILED
                               for r in readers), "the deleted ACL gone on the other brokers")
    finally:
        for reader in readers:
            reader.close()


def test_a_cluster_stopped_and_started_again_keeps_everything(
        secured: Secured, topic_name: str) -> None:
    """SIGTERM to every broker at once, then the same broker ids on the same database:
    the topic, its records, a group's committed offsets and an ACL are all there."""
    cluster = secured.cluster
    create_topic(secured, topic_name)
    recs = records(PARTITIONS * 10, 1_700_000_000_000)
    produce_confluent(secured.login(cluster.brokers[0]), topic_name, recs)
    group = f"g-{topic_name}"
    committed = {p: p + 1 for p in range(PARTITIONS)}
    consumer = confluent_kafka.Consumer({**secured.login(cluster.brokers[1]).confluent(),
                                         "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[confluent_kafka.TopicPartition(topic_name, p, o)
                                 for p, o in committed.items()], asynchronous=False)
    finally:
        consumer.close()
    admin = secured.conn(cluster.brokers[2])
    try:
        create_acls(admin, [_acl(topic_name, "reader"), group_acl("reader")])
    finally:
        admin.close()

    cluster.stop_all_at_once()
    cluster.start()

    wait_until(lambda: set(cluster.leaders(topic_name).values()) == {0, 1, 2}, 30,
               "the partitions to spread over the three brokers again")
    for broker in cluster.brokers:
        reader = secured.conn(broker, "reader")
        try:
            assert topic_error(reader, topic_name) == NONE
        finally:
            reader.close()
        assert secured.login_error(broker, "stranger") == SASL_AUTHENTICATION_FAILED
    check_roundtrip(recs, consume_confluent(secured.login(cluster.brokers[0], "reader"),
                                            topic_name, len(recs), PARTITIONS))
    consumer = confluent_kafka.Consumer({**secured.login(cluster.brokers[2]).confluent(),
                                         "group.id": group})
    try:
        found = consumer.committed([confluent_kafka.TopicPartition(topic_name, p)
                                    for p in range(PARTITIONS)], timeout=30)
    finally:
        consumer.close()
    assert {tp.partition: tp.offset for tp in found} == committed
