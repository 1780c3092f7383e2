"""Rights Kafka checks on the cluster and on transactional ids, with authorizationEnabled=true.

As Kafka checks them: AddPartitionsToTxn v4 and later (the brokers' batched form, with
``verify_only``) need CLUSTER_ACTION on the cluster (else the whole request is answered
CLUSTER_AUTHORIZATION_FAILED), and even then a topic of another tenant answers
TOPIC_AUTHORIZATION_FAILED; DescribeConfigs of the BROKER resource needs DESCRIBE_CONFIGS on
the cluster, and IncrementalAlterConfigs of it ALTER_CONFIGS there (checked before the
configs, none of which is dynamic here); InitProducerId without a transactional id needs
IDEMPOTENT_WRITE on the cluster or WRITE on some topic (KIP-679); a transactional Produce
needs WRITE on its transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED); WriteTxnMarkers
needs CLUSTER_ACTION on the cluster and WRITE on each topic; DescribeTransactions needs
DESCRIBE on the transactional id (checked before anything else of it) and lists only the
topics the caller may DESCRIBE. Tenant ``a``'s superuser has a topic and an open
transaction; the other roles log in with ACLs of their own tenants.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import confluent_kafka
import pytest
from kafka.protocol.admin import (
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)
from kafka.protocol.producer import AddPartitionsToTxnRequest, AddPartitionsToTxnResponse

from tests.broker_process import BrokerProcess
from tests.security_helpers import (
    ACL_ALL,
    ACL_ALTER_CONFIGS,
    ACL_CLUSTER,
    ACL_CLUSTER_ACTION,
    ACL_DESCRIBE,
    ACL_DESCRIBE_CONFIGS,
    ACL_GROUP,
    ACL_IDEMPOTENT_WRITE,
    ACL_TOPIC,
    ACL_TRANSACTIONAL_ID,
    ACL_WRITE,
    CLUSTER_AUTHORIZATION_FAILED,
    DENY,
    NONE,
    PREFIXED,
    TOPIC_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    Login,
    SecureConnection,
    TokenIssuer,
    grant,
)
from tests.txn_helpers import READ_COMMITTED, READ_UNCOMMITTED, TxnConnection, batch

BROKER = 4
INVALID_REQUEST = 42


class Conn(SecureConnection, TxnConnection):
    """A SASL login with the transaction helpers."""


@dataclass
class Secured:
    broker: BrokerProcess
    issuer: TokenIssuer
    pid: int
    epoch: int

    def login(self, tenant: str, role: str) -> Conn:
        conn = Conn(self.broker.port, timeout=60)
        conn.login(tenant, self.issuer.token(role))
        return conn

    def member(self, tenant: str, role: str) -> Conn:
        """A login of ``role`` to ``tenant``, given a group ACL there to be let in."""
        root = self.login(tenant, "admin")
        assert grant(root, ACL_GROUP, f"{role}-group", f"User:{role}") == NONE
        return self.login(tenant, role)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    base = Path(tmp_path_factory.mktemp("cluster-rights"))
    issuer = TokenIssuer("hmac", base / "keys")
    broker = BrokerProcess(base / "data", {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0", "authorizationEnabled": "true",
        "superUserRoles": "admin", **issuer.settings}).start()
    try:
        a = Conn(broker.port, timeout=60)
        a.login("a", issuer.token("admin"))
        assert a.create_topic("t", 2) == NONE
        pid, epoch = a.init_ok("a-tx")
        assert a.add_partitions("a-tx", pid, epoch, {"t": [1]}) == {("t", 1): NONE}
        yield Secured(broker, issuer, pid, epoch)
    finally:
        broker.stop()


def verify_only(conn: Conn, pid: int, epoch: int, topic: str, partitions: list[int],
                verify: bool = True) -> tuple[int, list[int]]:
    """AddPartitionsToTxn v4; the top-level error and each partition's."""
    R = AddPartitionsToTxnRequest
    T = R.AddPartitionsToTxnTransaction
    answer = conn.call(R[4](transactions=[T(
        transactional_id="a-tx", producer_id=pid, producer_epoch=epoch, verify_only=verify,
        topics=[T.AddPartitionsToTxnTopic(name=topic, partitions=partitions)])]),
        4, AddPartitionsToTxnResponse)
    codes = [p.partition_error_code for txn in answer.results_by_transaction
             for topic_result in txn.topic_results
             for p in topic_result.results_by_partition]
    return answer.error_code, codes


def test_add_partitions_v4_needs_cluster_action(secured: Secured) -> None:
    bob = secured.member("b", "bob")
    pid, epoch = secured.pid, secured.epoch
    assert verify_only(bob, pid, epoch, "a/default/t", [0, 1]) == (
        CLUSTER_AUTHORIZATION_FAILED, [])
    assert verify_only(bob, pid, epoch, "t", [0], verify=False) == (
        CLUSTER_AUTHORIZATION_FAILED, [])
    root_b = secured.login("b", "admin")
    assert grant(root_b, ACL_CLUSTER, "kafka-cluster", "User:bob", ACL_CLUSTER_ACTION) == NONE
    # CLUSTER_ACTION of tenant b says nothing about tenant a's topics
    assert verify_only(bob, pid, epoch, "a/default/t", [0, 1]) == (
        NONE, [TOPIC_AUTHORIZATION_FAILED] * 2)
    root = secured.login("a", "admin")
    code, (in_txn, not_in_txn) = verify_only(root, pid, epoch, "t", [1, 0])
    assert (code, in_txn) == (NONE, NONE) and not_in_txn != NONE


def describe_broker(conn: Conn) -> tuple[int, dict[str, str]]:
    resource = DescribeConfigsRequest.DescribeConfigsResource
    answer = conn.call(DescribeConfigsRequest[4](
        resources=[resource(resource_type=BROKER, resource_name="0", configuration_keys=None)],
        include_synonyms=False, include_documentation=False), 4, DescribeConfigsResponse)
    result = answer.results[0]
    return result.error_code, {c.name: c.value for c in result.configs}


def test_describe_configs_of_the_broker_needs_cluster_describe_configs(
        secured: Secured) -> None:
    carol = secured.member("c", "carol")
    assert describe_broker(carol) == (CLUSTER_AUTHORIZATION_FAILED, {})
    root_c = secured.login("c", "admin")
    assert grant(root_c, ACL_CLUSTER, "kafka-cluster", "User:carol",
                 ACL_DESCRIBE_CONFIGS) == NONE
    code, configs = describe_broker(carol)
    assert code == NONE and "broker.id" in configs
    code, configs = describe_broker(secured.login("a", "admin"))
    assert code == NONE and "broker.id" in configs


def alter_broker(conn: Conn) -> tuple[int, str | None]:
    resource = IncrementalAlterConfigsRequest.AlterConfigsResource
    answer = conn.call(IncrementalAlterConfigsRequest[1](resources=[resource(
        resource_type=BROKER, resource_name="0", configs=[resource.AlterableConfig(
            name="log.retention.ms", config_operation=0, value="1000")])],
        validate_only=False), 1, IncrementalAlterConfigsResponse)
    (result,) = answer.responses
    return result.error_code, result.error_message


def test_altering_the_broker_needs_cluster_alter_configs(secured: Secured) -> None:
    erin = secured.member("e", "erin")
    assert alter_broker(erin) == (CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed.")
    root_e = secured.login("e", "admin")
    assert grant(root_e, ACL_CLUSTER, "kafka-cluster", "User:erin", ACL_ALTER_CONFIGS) == NONE
    code, message = alter_broker(erin)
    assert code == INVALID_REQUEST and message is not None
    assert message.startswith("Cannot update these configs dynamically: log.retention.ms")


def test_an_idempotent_producer_needs_idempotent_write_or_write_on_a_topic(
        secured: Secured) -> None:
    root = secured.login("d", "admin")
    assert root.create_topic("x", 1) == NONE
    dave = secured.member("d", "dave")
    assert dave.init_pid(None).error_code == CLUSTER_AUTHORIZATION_FAILED
    assert grant(root, ACL_TOPIC, "x", "User:dave", ACL_WRITE) == NONE
    assert dave.init_pid(None).error_code == NONE
    # a real idempotent producer, with that WRITE
    login = Login(secured.broker.bootstrap, "SASL_PLAINTEXT", "d", secured.issuer.token("dave"))
    producer = confluent_kafka.Producer({**login.confluent(), "enable.idempotence": True,
                                         "message.timeout.ms": 30000})
    errors: list[object] = []
    producer.produce("x", b"v", on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(60) == 0 and errors == [None], errors
    # IDEMPOTENT_WRITE on the cluster does it too
    erin = secured.member("d", "erin")
    assert grant(root, ACL_CLUSTER, "kafka-cluster", "User:erin", ACL_IDEMPOTENT_WRITE) == NONE
    assert erin.init_pid(None).error_code == NONE
    # a WRITE that a DENY takes back does not
    fred = secured.member("d", "fred")
    assert grant(root, ACL_TOPIC, "d/default/", "User:fred", ACL_WRITE, pattern=PREFIXED) == NONE
    assert grant(root, ACL_TOPIC, "d/", "User:fred", ACL_ALL, DENY, PREFIXED) == NONE
    assert fred.init_pid(None).error_code == CLUSTER_AUTHORIZATION_FAILED


def test_a_transactional_produce_needs_write_on_its_transactional_id(
        secured: Secured) -> None:
    root = secured.login("a", "admin")
    assert grant(root, ACL_TOPIC, "t", "User:gina", ACL_WRITE) == NONE
    gina = secured.login("a", "gina")
    records = batch(secured.pid, secured.epoch, 0, 1, transactional=True)
    # WRITE on the topic is not enough to write into a-tx's transaction
    assert gina.produce("t", records, 1, "a-tx") == (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1)
    assert root.produce("t", records, 1, "a-tx")[0] == NONE
    # with WRITE on her own transactional id, her own transaction
    assert grant(root, ACL_TRANSACTIONAL_ID, "g-tx", "User:gina", ACL_WRITE) == NONE
    pid, epoch = gina.init_ok("g-tx")
    assert gina.add_partitions("g-tx", pid, epoch, {"t": [0]}) == {("t", 0): NONE}
    assert gina.produce("t", batch(pid, epoch, 0, 1, transactional=True), 0, "g-tx")[0] == NONE


def test_write_txn_markers_needs_cluster_action_and_write_on_the_topic(
        secured: Secured) -> None:
    """WriteTxnMarkers (an administrator's abort of a hanging transaction): CLUSTER_ACTION on
    the cluster, as Kafka, and WRITE on each topic, so that no tenant ends another's."""
    root = secured.login("a", "admin")
    assert root.create_topic("m", 1) == NONE
    pid, epoch = root.init_ok("m-tx", 600_000)
    assert root.add_partitions("m-tx", pid, epoch, {"m": [0]}) == {("m", 0): NONE}
    assert root.produce("m", batch(pid, epoch, 0, 2, transactional=True), 0, "m-tx")[0] == NONE
    assert root.list_offset("m", 0, READ_COMMITTED) == 0

    hank = secured.member("h", "hank")  # another tenant's role
    assert hank.write_markers(pid, epoch, False, {"a/default/m": [0], "m": [0]}) == {
        ("a/default/m", 0): CLUSTER_AUTHORIZATION_FAILED, ("m", 0): CLUSTER_AUTHORIZATION_FAILED}
    assert grant(secured.login("h", "admin"), ACL_CLUSTER, "kafka-cluster", "User:hank",
                 ACL_CLUSTER_ACTION) == NONE
    # CLUSTER_ACTION of tenant h says nothing about tenant a's topics
    assert hank.write_markers(pid, epoch, False, {"a/default/m": [0]}) == {
        ("a/default/m", 0): TOPIC_AUTHORIZATION_FAILED}

    ivy = secured.member("a", "ivy")  # tenant a's role: CLUSTER_ACTION alone is not enough
    assert grant(root, ACL_CLUSTER, "kafka-cluster", "User:ivy", ACL_CLUSTER_ACTION) == NONE
    assert ivy.write_markers(pid, epoch, False, {"m": [0]}) == {
        ("m", 0): TOPIC_AUTHORIZATION_FAILED}
    assert root.list_offset("m", 0, READ_COMMITTED) == 0  # nothing was written
    assert root.list_offset("m", 0, READ_UNCOMMITTED) == 2
    assert grant(root, ACL_TOPIC, "m", "User:ivy", ACL_WRITE) == NONE
    assert ivy.write_markers(pid, epoch, False, {"m": [0]}) == {("m", 0): NONE}
    assert root.list_offset("m", 0, READ_COMMITTED) == 3
    assert root.committed_values("m", 0) == []


def described(conn: Conn, tid: str) -> tuple[int, list[tuple[str, list[int]]]]:
    """DescribeTransactions of one id: its error code and (topic, partitions) listed."""
    (state,) = conn.describe_transactions([tid]).transaction_states
    return state.error_code, [(t.topic, list(t.partitions)) for t in state.topics]


def test_describe_transactions_needs_describe_on_the_id_and_lists_describable_topics(
        secured: Secured) -> None:
    root = secured.login("h", "admin")
    assert root.create_topic("seen", 1) == NONE and root.create_topic("hidden", 1) == NONE
    pid, epoch = root.init_ok("h-tx")
    assert root.add_partitions("h-tx", pid, epoch, {"seen": [0], "hidden": [0]}) == {
        ("seen", 0): NONE, ("hidden", 0): NONE}
    assert described(root, "h-tx") == (NONE, [("hidden", [0]), ("seen", [0])])
    hank = secured.member("h", "hank")
    assert described(hank, "h-tx") == (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, [])
    # as Kafka, the id is authorized before the coordinator is asked (which refuses "")
    assert described(hank, "") == (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, [])
    assert grant(root, ACL_TRANSACTIONAL_ID, "h-tx", "User:hank", ACL_DESCRIBE) == NONE
    assert described(hank, "h-tx") == (NONE, [])  # he may describe neither topic
    assert grant(root, ACL_TOPIC, "seen", "User:hank", ACL_DESCRIBE) == NONE
    assert described(hank, "h-tx") == (NONE, [("seen", [0])])
