"""Security acceptance 3: tenant isolation, tried as an attacker.

Tenant A (username ``a``) owns topic ``t`` (``a/default/t``) with records and a consumer
group ``g`` with committed offsets. Tenant B logs in with its own valid token (username
``b``) and tries to list, describe, produce to, consume from, delete, trim, grow and
re-create A's topic, and to read, commit and delete A's group offsets. Every attempt that
names A's resources gets the authorization error, B's group ``g`` is B's own group, and A's
data, offsets and group are unchanged afterwards. authorizationEnabled is false: the
tenant boundary holds without ACLs.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka
import kafka
import kafka.errors
import pytest

from tests.broker_process import BrokerProcess
from tests.clients import present
from tests.group_helpers import FAST_GROUPS
from tests.security_helpers import (
    GROUP_ID_NOT_FOUND,
    NONE,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_TOPIC_OR_PARTITION,
    Login,
    OpsConnection,
    TokenIssuer,
)

UNKNOWN_TOPIC_ID = 100
INVALID_TOPIC_EXCEPTION = 17
PARTITIONS = 3
PER_PARTITION = 10
A_COMMITS = {0: 4, 1: 7, 2: 10}
A_TOPIC_NAMES = ["a/default/t", "persistent://a/default/t"]


@dataclass
class Tenants:
    broker: BrokerProcess
    issuer: TokenIssuer
    a_topic_id: uuid.UUID

    def conn(self, username: str, role: str) -> OpsConnection:
        conn = OpsConnection(self.broker.port)
        conn.login(username, self.issuer.token(role))
        return conn

    def a(self) -> OpsConnection:
        return self.conn("a", "alice")

    def b(self) -> OpsConnection:
        return self.conn("b", "bob")

    def login(self, username: str, role: str) -> Login:
        return Login(self.broker.bootstrap, "SASL_PLAINTEXT", username, self.issuer.token(role))


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenants]:
    base = Path(tmp_path_factory.mktemp("tenants"))
    issuer = TokenIssuer("hmac", base / "keys")
    broker = BrokerProcess(base / "data", {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0", **FAST_GROUPS, **issuer.settings,
    }).start()
    try:
        setup = Tenants(broker, issuer, uuid.UUID(int=0))
        a = setup.a()
        assert a.create_topic("t", PARTITIONS) == NONE
        for p in range(PARTITIONS):
            assert a.produce("t", PER_PARTITION, partition=p, value=f"a-{p}".encode()) == NONE
        # A's group g: a real consumer joins, reads everything and commits chosen offsets.
        consumer = confluent_kafka.Consumer({
            **setup.login("a", "alice").confluent(), "group.id": "g",
            "enable.auto.commit": False, "auto.offset.reset": "earliest"})
        consumer.subscribe(["t"])
        seen = 0
        deadline = time.monotonic() + 30
        while seen < PARTITIONS * PER_PARTITION and time.monotonic() < deadline:
            for msg in consumer.consume(100, 0.5):
                assert msg.error() is None, msg.error()
                seen += 1
        assert seen == PARTITIONS * PER_PARTITION
        consumer.commit(offsets=[confluent_kafka.TopicPartition("t", p, o)
                                 for p, o in A_COMMITS.items()], asynchronous=False)
        consumer.close()
        meta = a.metadata(["t"])
        setup.a_topic_id = meta.topics[0].topic_id
        a.close()
        yield setup
    finally:
        broker.stop()


def a_state(tenants: Tenants) -> dict[str, Any]:
    """Everything of A's that B must not change, as A sees it."""
    a = tenants.a()
    try:
        meta = a.metadata(["t"])
        (topic,) = meta.topics
        assert topic.error_code == NONE
        records = {}
        bounds = {}
        for p in range(len(topic.partitions)):
            error, found = a.fetch("t", p)
            assert error == NONE
            records[p] = found
            bounds[p] = (a.list_offset("t", p, -2), a.list_offset("t", p, -1))
        group_error, offsets = a.all_offsets("g")
        described = a.describe_group("g")
        return {
            "partitions": len(topic.partitions), "topic_id": topic.topic_id,
            "records": records, "bounds": bounds, "group_error": group_error,
            "offsets": offsets, "group": (described.error_code, described.group_state,
                                          described.protocol_type),
            "groups": sorted(a.list_groups()),
        }
    finally:
        a.close()


@pytest.fixture
def unchanged(tenants: Tenants) -> Iterator[None]:
    """Check A's topic, records, offsets and group before and after the test."""
    before = a_state(tenants)
    assert before["partitions"] == PARTITIONS
    assert before["offsets"] == {("t", p): o for p, o in A_COMMITS.items()}
    assert before["group"] == (NONE, "Empty", "consumer")
    for p in range(PARTITIONS):
        assert [o for o, _k, _v in before["records"][p]] == list(range(PER_PARTITION))
        assert {v for _o, _k, v in before["records"][p]} == {f"a-{p}".encode()}
        assert before["bounds"][p] == ((NONE, 0), (NONE, PER_PARTITION))
    yield
    assert a_state(tenants) == before


# -- topics -------------------------------------------------------------------------------

def test_b_does_not_list_a_topics(tenants: Tenants, unchanged: None) -> None:
    b = tenants.b()
    try:
        assert b.create_topic("b-own") == NONE
        for version in (1, 9, 12):
            listed = b.metadata(None, version=version)
            names = [t.name for t in listed.topics]
            assert "b-own" in names
            assert not any(n.startswith(("a/", "persistent://a/")) for n in names), names
            if version >= 10:
                assert tenants.a_topic_id not in [t.topic_id for t in listed.topics]
    finally:
        b.close()


def test_b_cannot_describe_a_topic(tenants: Tenants, unchanged: None) -> None:
    b = tenants.b()
    try:
        for version in (1, 9, 12):
            meta = b.metadata(A_TOPIC_NAMES, version=version, auto_create=True)
            assert [(t.name, t.error_code) for t in meta.topics] == \
                [(n, TOPIC_AUTHORIZATION_FAILED) for n in A_TOPIC_NAMES]
            assert all(not t.partitions for t in meta.topics)
        for name in A_TOPIC_NAMES:
            assert b.describe_configs(name) == TOPIC_AUTHORIZATION_FAILED
            assert b.list_offset(name, 0, -1)[0] == TOPIC_AUTHORIZATION_FAILED
            assert b.list_offset(name, 0, -2)[0] == TOPIC_AUTHORIZATION_FAILED
    finally:
        b.close()


def test_b_cannot_describe_a_topic_by_id(tenants: Tenants, unchanged: None) -> None:
    """Metadata v12 by id, as Kafka answers it (ids are not secret): A's id answers
    TOPIC_AUTHORIZATION_FAILED with the name null and no partitions; an id that names no
    topic answers UNKNOWN_TOPIC_ID."""
    from kafka.protocol.metadata import MetadataRequest, MetadataResponse
    b = tenants.b()
    unknown_id = uuid.uuid4()
    try:
        request = MetadataRequest[12](
            topics=[MetadataRequest.MetadataRequestTopic(name=None, topic_id=topic_id)
                    for topic_id in (tenants.a_topic_id, unknown_id)],
            allow_auto_topic_creation=False, include_topic_authorized_operations=False)
        meta = b.call(request, 12, MetadataResponse)
        refused, unknown = meta.topics
        assert (refused.error_code, refused.name, refused.topic_id) == (
            TOPIC_AUTHORIZATION_FAILED, None, tenants.a_topic_id)
        assert not refused.partitions
        assert (unknown.error_code, unknown.name, unknown.topic_id) == (
            UNKNOWN_TOPIC_ID, None, unknown_id)
        assert not unknown.partitions
    finally:
        b.close()


def test_b_cannot_produce_to_a_topic(tenants: Tenants, unchanged: None) -> None:
    b = tenants.b()
    try:
        for name in A_TOPIC_NAMES:
            for p in range(PARTITIONS):
                assert b.produce(name, 3, partition=p, value=b"evil") == \
                    TOPIC_AUTHORIZATION_FAILED
    finally:
        b.close()
    # A stock producer gets the same answer as a delivery error.
    errors: list[Any] = []
    producer = confluent_kafka.Producer({**tenants.login("b", "bob").confluent(),
                                         "message.timeout.ms": 10000})
    producer.produce("a/default/t", value=b"evil", partition=0,
                     on_delivery=lambda err, _msg: errors.append(err))
    producer.flush(15)
    assert len(errors) == 1 and errors[0] is not None
    assert errors[0].code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED


def read_for(consumer: confluent_kafka.Consumer, seconds: float) -> tuple[int, list[int]]:
    """Consume for ``seconds``, then close: the records read and the error codes seen."""
    errors: list[int] = []
    records = 0
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for msg in consumer.consume(100, 0.5):
                if msg.error() is not None:
                    errors.append(present(msg.error()).code())
                else:
                    records += 1
    finally:
        consumer.close()
    return records, errors


def test_b_cannot_consume_a_topic(tenants: Tenants, unchanged: None) -> None:
    b = tenants.b()
    try:
        for name in A_TOPIC_NAMES:
            for p in range(PARTITIONS):
                error, found = b.fetch(name, p)
                assert (error, found) == (TOPIC_AUTHORIZATION_FAILED, [])
    finally:
        b.close()
    # A stock consumer assigned to A's partitions reads nothing (librdkafka does not surface
    # the refusal for assigned partitions; kafka-python refuses '/' in names).
    consumer = confluent_kafka.Consumer({
        **tenants.login("b", "bob").confluent(), "group.id": "b-reader",
        "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition("a/default/t", p, 0)
                     for p in range(PARTITIONS)])
    records, errors = read_for(consumer, 4)
    assert records == 0
    assert set(errors) <= {confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED}, errors


def test_b_cannot_delete_a_topic(tenants: Tenants, unchanged: None) -> None:
    b = tenants.b()
    try:
        for name in A_TOPIC_NAMES:
            assert b.delete_topic(name) == TOPIC_AUTHORIZATION_FAILED
    finally:
        b.close()


def test_deleting_a_topic_by_id_does_not_reveal_its_name(tenants: Tenants,
                                                         unchanged: None) -> None:
    """DeleteTopics v6 by id (with Metadata v10+, the only requests served here that take
    topic ids): A's id answers TOPIC_AUTHORIZATION_FAILED with the name null and nothing
    of it in the message, as Kafka answers an id the caller may not describe; an unknown id
    answers UNKNOWN_TOPIC_ID; B's own topic by id is deleted and named."""
    b = tenants.b()
    try:
        result = b.delete_topic_by_id(tenants.a_topic_id)
        assert result.error_code == TOPIC_AUTHORIZATION_FAILED
        assert result.name is None
        assert result.topic_id == tenants.a_topic_id
        assert "/t" not in (result.error_message or "") and "a/" not in (
            result.error_message or "")
        unknown = b.delete_topic_by_id(uuid.uuid4())
        assert (unknown.error_code, unknown.name) == (UNKNOWN_TOPIC_ID, None)
        assert b.create_topic("by-id", 1) == NONE
        own_id = b.metadata(["by-id"]).topics[0].topic_id
        mine = b.delete_topic_by_id(own_id)
        assert (mine.error_code, mine.name, mine.topic_id) == (NONE, "by-id", own_id)
        assert b.metadata(["by-id"]).topics[0].error_code == UNKNOWN_TOPIC_OR_PARTITION
    finally:
        b.close()


def test_b_cannot_delete_records_of_a_topic(tenants: Tenants, unchanged: None) -> None:
    b = tenants.b()
    try:
        for name in A_TOPIC_NAMES:
            for p in range(PARTITIONS):
                assert b.delete_records(name, p, 5) == TOPIC_AUTHORIZATION_FAILED
                assert b.delete_records(name, p, -1) == TOPIC_AUTHORIZATION_FAILED
    finally:
        b.close()


def test_b_cannot_create_partitions_on_a_topic(tenants: Tenants, unchanged: None) -> None:
    b = tenants.b()
    try:
        for name in A_TOPIC_NAMES:
            assert b.create_partitions(name, PARTITIONS + 2) == TOPIC_AUTHORIZATION_FAILED
    finally:
        b.close()


def test_b_cannot_alter_configs_of_a_topic(tenants: Tenants, unchanged: None) -> None:
    b = tenants.b()
    try:
        for name in A_TOPIC_NAMES:
            assert b.alter_config(name, "retention.ms", "1") == TOPIC_AUTHORIZATION_FAILED
        assert b.create_topic("b-configurable") == NONE
        assert b.alter_config("b-configurable", "retention.ms", "60000") == NONE
    finally:
        b.close()


def test_b_cannot_create_topics_in_a_tenant(tenants: Tenants, unchanged: None) -> None:
    b = tenants.b()
    try:
        assert b.create_topic("a/default/planted") == TOPIC_AUTHORIZATION_FAILED
        assert b.create_topic("persistent://a/other/planted") == TOPIC_AUTHORIZATION_FAILED
        assert b.create_topic("a/default/t", 5) == TOPIC_AUTHORIZATION_FAILED
        # Nor by auto-creation through Metadata or Produce.
        meta = b.metadata(["a/default/planted2"], version=9, auto_create=True)
        assert meta.topics[0].error_code == TOPIC_AUTHORIZATION_FAILED
        assert b.produce("a/default/planted3") == TOPIC_AUTHORIZATION_FAILED
    finally:
        b.close()
    a = tenants.a()
    try:
        meta = a.metadata(["planted", "planted2", "planted3", "a/other/planted"])
        assert [t.error_code for t in meta.topics] == [UNKNOWN_TOPIC_OR_PARTITION] * 4
    finally:
        a.close()


def test_b_short_names_are_b_topics(tenants: Tenants, unchanged: None) -> None:
    """B's ``t`` is ``b/default/t``: B may create, fill and delete it without touching A's."""
    b = tenants.b()
    try:
        assert b.create_topic("t", 1) == NONE
        assert b.produce("t", 4, value=b"b-data") == NONE
        error, found = b.fetch("t")
        assert error == NONE and [v for _o, _k, v in found] == [b"b-data"] * 4
        error, found = b.fetch("b/default/t")
        assert error == NONE and len(found) == 4
        meta = b.metadata(["t"])
        assert meta.topics[0].topic_id != tenants.a_topic_id
        assert len(meta.topics[0].partitions) == 1
        assert b.delete_records("t", 0, 2) == NONE
        assert b.delete_topic("t") == NONE
    finally:
        b.close()


# -- groups -------------------------------------------------------------------------------

def test_b_cannot_read_a_group_offsets(tenants: Tenants, unchanged: None) -> None:
    b = tenants.b()
    try:
        # B's "g" is B's own group: it has no offsets at all.
        error, offsets = b.all_offsets("g")
        assert (error, offsets) == (NONE, {})
        for version in (1, 5, 7, 8):
            error, found = b.fetch_offsets("g", "a/default/t", [0, 1, 2], version=version)
            assert error == NONE
            assert found == {p: (-1, "", TOPIC_AUTHORIZATION_FAILED) for p in range(3)} or \
                found == {p: (-1, None, TOPIC_AUTHORIZATION_FAILED) for p in range(3)}, found
        # The short name is B's own topic: nothing committed there either.
        error, found = b.fetch_offsets("g", "t", [0, 1, 2])
        assert error == NONE and all(off == -1 for off, _m, _e in found.values())
        assert "g" not in b.list_groups()
        described = b.describe_group("g")
        assert described.group_state == "Dead" and not described.members
    finally:
        b.close()


def test_b_cannot_commit_a_group_offsets(tenants: Tenants, unchanged: None) -> None:
    b = tenants.b()
    try:
        for name in A_TOPIC_NAMES:
            assert b.simple_commit("g", name, {0: 0, 1: 0, 2: 0}) == \
                {p: TOPIC_AUTHORIZATION_FAILED for p in range(3)}
        assert b.all_offsets("g") == (NONE, {})
    finally:
        b.close()


def test_b_cannot_delete_a_group_or_its_offsets(tenants: Tenants, unchanged: None) -> None:
    b = tenants.b()
    try:
        assert b.delete_group("g") == GROUP_ID_NOT_FOUND
        answer = b.offset_delete("g", "a/default/t", [0, 1, 2])
        assert answer.error_code == GROUP_ID_NOT_FOUND or all(
            p.error_code == TOPIC_AUTHORIZATION_FAILED for t in answer.topics
            for p in t.partitions), answer
    finally:
        b.close()


def test_b_group_g_is_a_separate_group(tenants: Tenants, unchanged: None) -> None:
    """B commits in its own ``g`` and deletes it; A's ``g`` never notices."""
    b = tenants.b()
    try:
        assert b.create_topic("bt", 2) == NONE
        assert b.produce("bt", 3, partition=0) == NONE
        assert b.simple_commit("g", "bt", {0: 2, 1: 0}) == {0: NONE, 1: NONE}
        assert b.all_offsets("g") == (NONE, {("bt", 0): 2, ("bt", 1): 0})
        # With its own g existing, B still cannot reach A's offsets through it.
        answer = b.offset_delete("g", "a/default/t", [0, 1, 2])
        assert answer.error_code == NONE
        assert [p.error_code for t in answer.topics for p in t.partitions] == \
            [TOPIC_AUTHORIZATION_FAILED] * 3
        assert "g" in b.list_groups()
        assert b.delete_group("g") == NONE
        assert b.all_offsets("g") == (NONE, {})
        assert b.delete_topic("bt") == NONE
    finally:
        b.close()


def test_b_consumer_group_g_with_a_stock_client(tenants: Tenants, unchanged: None) -> None:
    """A real consumer of B in group ``g`` subscribed to A's topic gets no records and does
    not join or disturb A's group."""
    consumer = confluent_kafka.Consumer({
        **tenants.login("b", "bob").confluent(), "group.id": "g",
        "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.subscribe(["a/default/t"])
    records, errors = read_for(consumer, 6)
    assert records == 0
    assert confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED in errors, errors


# -- namespaces ---------------------------------------------------------------------------

def test_username_with_namespace_scopes_short_names(tenants: Tenants, unchanged: None) -> None:
    ns1 = tenants.conn("a/ns1", "alice")
    try:
        assert ns1.create_topic("x", 2) == NONE
        assert ns1.produce("x", 2, value=b"ns1") == NONE
        assert [t.name for t in ns1.metadata(None).topics] == ["x"]
        meta = ns1.metadata(["a/ns1/x", "t", "a/default/t"])
        assert [(t.error_code, len(t.partitions)) for t in meta.topics] == \
            [(NONE, 2), (UNKNOWN_TOPIC_OR_PARTITION, 0), (NONE, PARTITIONS)]
    finally:
        ns1.close()
    a = tenants.a()
    try:
        error, found = a.fetch("a/ns1/x")
        assert error == NONE and [v for _o, _k, v in found] == [b"ns1", b"ns1"]
        assert a.metadata(["x"]).topics[0].error_code == UNKNOWN_TOPIC_OR_PARTITION
        assert "x" not in [t.name for t in a.metadata(None).topics]
    finally:
        a.close()
    b = tenants.b()
    try:
        assert b.metadata(["a/ns1/x"]).topics[0].error_code == TOPIC_AUTHORIZATION_FAILED
        assert b.fetch("a/ns1/x")[0] == TOPIC_AUTHORIZATION_FAILED
        b_ns1 = tenants.conn("b/ns1", "bob")
        try:
            assert b_ns1.metadata(["x"]).topics[0].error_code == UNKNOWN_TOPIC_OR_PARTITION
            assert [t.name for t in b_ns1.metadata(None).topics] == []
        finally:
            b_ns1.close()
    finally:
        b.close()


def test_a_login_still_sees_its_data_with_a_stock_client(tenants: Tenants,
                                                         unchanged: None) -> None:
    consumer = kafka.KafkaConsumer(**tenants.login("a", "alice").kafka_python(), group_id="g",
                                   enable_auto_commit=False)
    try:
        tps = [kafka.TopicPartition("t", p) for p in range(PARTITIONS)]
        committed = {tp.partition: consumer.committed(tp) for tp in tps}
        assert committed == A_COMMITS
    finally:
        consumer.close()


# -- system topics and shared group metadata ---------------------------------------------

def test_b_cannot_read_a_system_topics(tenants: Tenants, unchanged: None) -> None:
    b = tenants.b()
    try:
        for name in ("a/__kafka/__consumer_offsets", "persistent://a/__kafka/__consumer_offsets"):
            assert b.metadata([name]).topics[0].error_code == TOPIC_AUTHORIZATION_FAILED
            for p in range(3):
                assert b.fetch(name, p) == (TOPIC_AUTHORIZATION_FAILED, [])
                # Writes to a system topic are refused by name (INVALID_TOPIC_EXCEPTION)
                # whoever asks; either refusal keeps B out.
                assert b.produce(name, 1, partition=p) in (TOPIC_AUTHORIZATION_FAILED,
                                                           INVALID_TOPIC_EXCEPTION)
    finally:
        b.close()


def test_groups_stay_per_tenant_with_shared_group_metadata(tmp_path: Path) -> None:
    """With kafkaEnableMultiTenantMetadata=false every tenant's groups are kept in the one
    metadata namespace; B's group ``g`` must still not be A's group ``g``."""
    issuer = TokenIssuer("hmac", tmp_path / "keys")
    broker = BrokerProcess(tmp_path / "data", {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0",
        "kafkaEnableMultiTenantMetadata": "false", **issuer.settings}).start()
    try:
        a = OpsConnection(broker.port)
        a.login("a", issuer.token("alice"))
        assert a.create_topic("t", 1) == NONE
        assert a.produce("t", 3) == NONE
        assert a.simple_commit("g", "t", {0: 2}) == {0: NONE}
        b = OpsConnection(broker.port)
        b.login("b", issuer.token("bob"))
        seen = {
            "B OffsetFetch g": b.all_offsets("g"),
            "B ListGroups has g": "g" in b.list_groups(),
            "B DescribeGroups g": b.describe_group("g").group_state,
            "B DeleteGroups g": b.delete_group("g"),
            "A OffsetFetch g afterwards": a.all_offsets("g"),
        }
        a.close()
        b.close()
        assert seen == {
            "B OffsetFetch g": (NONE, {}),
            "B ListGroups has g": False,
            "B DescribeGroups g": "Dead",
            "B DeleteGroups g": GROUP_ID_NOT_FOUND,
            "A OffsetFetch g afterwards": (NONE, {("t", 0): 2}),
        }, "\n" + broker.log_text()
    finally:
        broker.stop()
