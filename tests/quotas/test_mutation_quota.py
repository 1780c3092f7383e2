"""KIP-599's ``controller_mutation_rate`` with tenant logins and real clients: set beside
the byte rates in one AlterClientQuotas entry and described back (not on ip entities);
kafka-python's admin client (CreateTopics v7, CreatePartitions v3, DeleteTopics v6)
gets THROTTLING_QUOTA_EXCEEDED per topic once the quota is exceeded, with a throttle time,
and goes through after waiting it; each topic counts its partitions (created, added,
deleted); validate_only counts nothing; user and client-id precedence, and the tenant's
quota as a ceiling over its namespaces'; older versions (confluent-kafka's CreateTopics v4,
kafka-python speaking to a broker it takes for 2.4) are done and throttled, not refused.

The broker measures over 2 one-second samples, so a quota Q allows a burst of 2 x Q
partitions. Each test uses users of its own (buckets are per user). Small quotas
(0.01/s) make the refill during a test negligible, so the throttle time tells the
partitions counted (deficit = throttle x quota) without depending on the machine's speed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.admin import KafkaAdminClient
from kafka.protocol.admin import (
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
)

from tests.broker_process import BrokerProcess
from tests.quota_helpers import EXACT, alter, describe, parts
from tests.security_helpers import Login, OpsConnection, TokenIssuer

M = "controller_mutation_rate"
P = "producer_byte_rate"
INVALID_REQUEST = 42
THROTTLING_QUOTA_EXCEEDED = 89
SLOW = 0.01
"""A quota (partitions per second) whose refill is negligible over a test."""


@dataclass
class MutationBroker:
    broker: BrokerProcess
    issuer: TokenIssuer

    def conn(self, username: str, role: str) -> OpsConnection:
        """A raw connection logged in as ``role`` in tenant[/namespace] ``username``."""
        conn = OpsConnection(self.broker.port)
        conn.login(username, self.issuer.token(role))
        return conn

    def operator(self) -> OpsConnection:
        return self.conn("acme", "admin")

    def login(self, username: str, role: str) -> Login:
        return Login(self.broker.bootstrap, "SASL_PLAINTEXT", username, self.issuer.token(role))

    def kafka_python(self, username: str, role: str, **conf: Any) -> KafkaAdminClient:
        return KafkaAdminClient(**self.login(username, role).kafka_python(), **conf)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MutationBroker]:
    base = Path(tmp_path_factory.mktemp("mutation-quota"))
    issuer = TokenIssuer("hmac", base / "keys")
    broker = BrokerProcess(base / "data", {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0", "superUserRoles": "admin",
        "quotaWindowNum": "2", **issuer.settings}).start()
    try:
        yield MutationBroker(broker, issuer)
    finally:
        broker.stop()


def _set(setup: MutationBroker, entity: dict[str, str | None], rate: float) -> None:
    assert alter(setup.operator(), [(entity, {M: rate})]) == [(0, None)]


def _create(conn: OpsConnection, topics: dict[str, int], version: int = 7
            ) -> tuple[list[int], int]:
    """CreateTopics of ``topics`` (name: partitions) in one request: each topic's error
    and the answer's throttle time."""
    request = CreateTopicsRequest[version](topics=[
        CreateTopicsRequest.CreatableTopic(name=name, num_partitions=count,
                                           replication_factor=1, assignments=[], configs=[])
        for name, count in topics.items()], timeout_ms=5000, validate_only=False)
    answer = conn.call(request, version, CreateTopicsResponse)
    return [int(t.error_code) for t in answer.topics], int(answer.throttle_time_ms)


def _grow(conn: OpsConnection, topic: str, count: int) -> tuple[int, int]:
    """CreatePartitions v3 growing ``topic`` to ``count``: its error and the throttle time."""
    request = CreatePartitionsRequest[3](topics=[CreatePartitionsRequest.CreatePartitionsTopic(
        name=topic, count=count, assignments=None)], timeout_ms=5000, validate_only=False)
    answer = conn.call(request, 3, CreatePartitionsResponse)
    return int(answer.results[0].error_code), int(answer.throttle_time_ms)


def _delete(conn: OpsConnection, topic: str) -> tuple[int, int]:
    """DeleteTopics v6 of ``topic``: its error and the throttle time."""
    request = DeleteTopicsRequest[6](topics=[DeleteTopicsRequest.DeleteTopicState(
        name=topic, topic_id=None)], timeout_ms=5000)
    answer = conn.call(request, 6, DeleteTopicsResponse)
    return int(answer.responses[0].error_code), int(answer.throttle_time_ms)


def _deficit_after(setup: MutationBroker, username: str, role: str) -> float:
    """The partitions ``role`` is over its SLOW quota by, read from the throttle time a
    refused creation answers (on a connection of its own: a refusal mutes the
    connection for that time)."""
    conn = setup.conn(username, role)
    try:
        errors, throttle_ms = _create(conn, {f"probe-{time.monotonic_ns()}": 1})
    finally:
        conn.close()
    assert errors == [THROTTLING_QUOTA_EXCEEDED]
    return throttle_ms / 1000 * SLOW


def _errors(result: dict[str, Any]) -> dict[str, int]:
    return {topic["name"]: topic["error_code"] for topic in result["topics"]}


def test_the_quota_is_set_beside_byte_rates_and_described(setup: MutationBroker) -> None:
    operator = setup.operator()
    entities: list[dict[str, str | None]] = [
        {"user": "tool"}, {"client-id": "ci"}, {"user": "tool", "client-id": "ci"},
        {"user": None}, {"client-id": None}, {"user": None, "client-id": None},
        {"tenant": "globex"}]
    # one entry per entity, the mutation rate beside a byte rate (the whole entry kept)
    assert alter(operator, [(entity, {M: 2.5, P: 1048576.0}) for entity in entities]) == \
        [(0, None)] * len(entities)
    code, found = describe(operator, [("user", EXACT, "tool")], strict=True)
    assert (code, found) == (0, {parts({"user": "tool"}): {M: 2.5, P: 1048576.0}})
    _, everything = describe(operator, [])
    assert all(everything[parts(entity)] == {M: 2.5, P: 1048576.0} for entity in entities)
    # as Kafka: an ip entity takes connection_creation_rate only; a rate is positive
    [(code, message)] = alter(operator, [({"ip": "10.0.0.1"}, {M: 1.0})])
    assert code == INVALID_REQUEST and message and M in message
    [(code, _)] = alter(operator, [({"user": "tool2"}, {M: 0.0})])
    assert code == INVALID_REQUEST
    # removed again: the later tests start from no quota but their own
    assert alter(operator, [(entity, {M: None, P: None}) for entity in entities]) == \
        [(0, None)] * len(entities)


def test_creations_beyond_the_rate_are_refused_until_the_throttle_time_passed(
        setup: MutationBroker) -> None:
    _set(setup, {"user": "creator"}, 1.0)  # a burst of 2 partitions
    client = setup.kafka_python("acme/prod", "creator")
    try:
        # the first topic takes the bucket below zero (6 partitions: 4 s to pay back),
        # accepted as the quota was not exceeded yet; the second is refused
        result = client.create_topics({"burst-a": {"num_partitions": 6},
                                       "burst-b": {"num_partitions": 1}}, raise_errors=False)
        assert _errors(result) == {"burst-a": 0, "burst-b": THROTTLING_QUOTA_EXCEEDED}
        refused = next(t for t in result["topics"] if t["name"] == "burst-b")
        assert "controller_mutation_rate 1 of user/creator exceeded" in refused["error_message"]
        # the refusal's answer carries the time until the quota is no longer exceeded
        conn = setup.conn("acme/prod", "creator")
        errors, throttle_ms = _create(conn, {"burst-b": 1})
        conn.close()
        assert errors == [THROTTLING_QUOTA_EXCEEDED]
        assert 0 < throttle_ms <= 4000
        time.sleep(throttle_ms / 1000 + 0.1)
        # kafka-python waits out the throttle its own answer carried, then goes through
        result = client.create_topics({"burst-b": {"num_partitions": 1}}, raise_errors=False)
        assert _errors(result) == {"burst-b": 0}
        assert {"burst-a", "burst-b"} <= set(client.list_topics())
    finally:
        client.close()


@pytest.mark.parametrize(("role", "partitions"), [("counts-new", 5), ("counts-added", 3),
                                                  ("counts-deleted", 4)])
def test_each_topic_counts_its_partitions(setup: MutationBroker, role: str,
                                          partitions: int) -> None:
    """A created topic counts its partitions, CreatePartitions the partitions it adds,
    DeleteTopics the deleted topic's partitions."""
    owner = setup.conn("acme/prod", "owner")  # no quota of its own: not counted
    topic = f"{role}-topic"
    assert owner.create_topic(topic, 4 if role == "counts-deleted" else 1) == 0
    owner.close()
    _set(setup, {"user": role}, SLOW)
    conn = setup.conn("acme/prod", role)
    if role == "counts-new":
        assert _create(conn, {f"{role}-new": partitions}) == ([0], 0)
    elif role == "counts-added":
        assert _grow(conn, topic, 1 + partitions) == (0, 0)
    else:
        assert _delete(conn, topic) == (0, 0)
    conn.close()
    # accepted (not exceeded before), it took the bucket of 2 x 0.01 below zero by
    # partitions - 0.02 (plus what refilled since: a fraction of one partition)
    deficit = _deficit_after(setup, "acme/prod", role)
    assert partitions - 0.5 < deficit <= partitions


def test_growing_and_deleting_beyond_the_rate_are_refused_per_topic(
        setup: MutationBroker) -> None:
    owner = setup.conn("acme/prod", "owner")
    for name in ("grow-1", "grow-2", "gone-1"):
        assert owner.create_topic(name, 1) == 0
    owner.close()
    _set(setup, {"user": "grower"}, SLOW)
    client = setup.kafka_python("acme/prod", "grower")
    try:
        result = client.create_partitions({"grow-1": 3, "grow-2": 3}, raise_errors=False)
        assert {t.name: t.error_code for t in result.results} == {
            "grow-1": 0, "grow-2": THROTTLING_QUOTA_EXCEEDED}
    finally:
        client.close()
    conn = setup.conn("acme/prod", "grower")
    error, throttle_ms = _delete(conn, "gone-1")
    conn.close()
    assert error == THROTTLING_QUOTA_EXCEEDED and throttle_ms > 0
    assert "gone-1" in setup.kafka_python("acme/prod", "owner").list_topics()


def test_validate_only_counts_nothing(setup: MutationBroker) -> None:
    owner = setup.conn("acme/prod", "owner")
    assert owner.create_topic("validated-grow", 1) == 0
    owner.close()
    _set(setup, {"user": "validator"}, SLOW)  # a burst of 0.02: one topic, then refused
    client = setup.kafka_python("acme/prod", "validator")
    try:
        for _ in range(3):
            result = client.create_topics({f"dry-{i}": {"num_partitions": 3} for i in range(5)},
                                          validate_only=True, raise_errors=False)
            assert set(_errors(result).values()) == {0}
            grown = client.create_partitions({"validated-grow": 8}, validate_only=True,
                                             raise_errors=False)
            assert [t.error_code for t in grown.results] == [0]
        # nothing was counted: the first real creation is accepted, the next refused
        result = client.create_topics({"wet-1": {"num_partitions": 1},
                                       "wet-2": {"num_partitions": 1}}, raise_errors=False)
        assert _errors(result) == {"wet-1": 0, "wet-2": THROTTLING_QUOTA_EXCEEDED}
    finally:
        client.close()


def test_a_user_quota_outranks_a_client_id_quota_and_user_with_client_id_both(
        setup: MutationBroker) -> None:
    operator = setup.operator()
    assert alter(operator, [({"user": "prec"}, {M: SLOW}),
                            ({"client-id": "prec-app"}, {M: 1000.0})]) == [(0, None)] * 2

    def create(role: str, names: list[str]) -> dict[str, int]:
        client = setup.kafka_python("acme/prod", role, client_id="prec-app")
        try:
            return _errors(client.create_topics({name: {"num_partitions": 1}
                                                 for name in names}, raise_errors=False))
        finally:
            client.close()

    # Kafka's order: the user's quota (level 3) before the client id's (level 7)
    assert create("prec", ["prec-1", "prec-2"]) == {"prec-1": 0,
                                                    "prec-2": THROTTLING_QUOTA_EXCEEDED}
    # another user with the same client id gets the client id's quota
    assert create("prec-other", ["other-1", "other-2", "other-3"]) == \
        {"other-1": 0, "other-2": 0, "other-3": 0}
    # user and client id together (level 1) before the user's alone
    assert alter(operator, [({"user": "prec", "client-id": "prec-app"}, {M: 1000.0})]) == \
        [(0, None)]
    assert create("prec", ["prec-3", "prec-4"]) == {"prec-3": 0, "prec-4": 0}


def test_the_tenant_quota_is_a_ceiling_over_its_namespaces(setup: MutationBroker) -> None:
    _set(setup, {"tenant": "ceil"}, SLOW)
    tenant_admin = setup.conn("ceil", "ceil-admin")
    assert alter(tenant_admin, [({"namespace": "ceil/ns"}, {M: 1000.0})]) == [(0, None)]
    conn = setup.conn("ceil/ns", "ceil-user")
    errors, throttle_ms = _create(conn, {"c-1": 1, "c-2": 1})
    conn.close()
    assert errors == [0, THROTTLING_QUOTA_EXCEEDED] and throttle_ms > 0
    # the whole tenant shares the ceiling: another user of another namespace too
    conn = setup.conn("ceil/other", "ceil-user-2")
    assert _create(conn, {"c-3": 1})[0] == [THROTTLING_QUOTA_EXCEEDED]
    conn.close()


def test_older_versions_are_done_and_throttled_not_refused(setup: MutationBroker) -> None:
    # confluent-kafka 2.16 sends CreateTopics v4 and DeleteTopics v4: permissive
    _set(setup, {"user": "old-confluent"}, 1.0)
    throttles: list[float] = []
    conf = setup.login("acme/prod", "old-confluent").confluent()
    conf["throttle_cb"] = lambda event: throttles.append(event.throttle_time)
    client = AdminClient(conf)
    for name, count in (("old-a", 4), ("old-b", 1), ("old-c", 1)):
        client.create_topics([NewTopic(name, count, 1)])[name].result(30)
    for name, future in client.delete_topics(["old-a", "old-b"]).items():
        assert future.result(30) is None, name
    client.poll(0.5)
    assert throttles and max(throttles) > 0
    # kafka-python taking the broker for 2.4 sends CreateTopics v5: every topic created
    _set(setup, {"user": "old-kafka-python"}, SLOW)
    old = setup.kafka_python("acme/prod", "old-kafka-python", api_version=(2, 4))
    try:
        result = old.create_topics({f"old-kp-{i}": {"num_partitions": 2,
                                                   "replication_factor": 1}
                                    for i in range(3)}, raise_errors=False)
        assert set(_errors(result).values()) == {0}
        assert "topic_id" not in result["topics"][0]  # a version before 7
    finally:
        old.close()
    # the same older request, raw: done, and its answer carries the throttle time
    _set(setup, {"user": "old-raw"}, SLOW)
    conn = setup.conn("acme/prod", "old-raw")
    errors, throttle_ms = _create(conn, {"old-raw-1": 1, "old-raw-2": 1}, version=5)
    conn.close()
    assert errors == [0, 0]
    assert 1.5 < throttle_ms / 1000 * SLOW <= 2  # two partitions over the burst of 0.02
