"""Brokers sharing one PostgreSQL database see each other's changes: a topic created,
grown, reconfigured or deleted through one broker, an ACL created or deleted through one,
take effect on the other within a second; producer ids never collide; one cluster id.

First two storages on one database (what a broker's storage sees), then two real broker
processes (brokerId 0 and 1, one ``storageUrl``) driven by real clients and raw requests.
Waits poll with a deadline; nothing asserts how long a change took.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin import (
    CreateAclsRequest,
    CreateAclsResponse,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
)

from broker_core.storage import LogClosed, LogConfig, Storage, TopicExists, open_storage
from broker_core.storage.cluster import BrokerRecord, NotOwner
from broker_core.storage.postgres import PgStorage
from edge.app import cluster_id
from tests.broker_process import BrokerProcess
from tests.clients import make_records
from tests.group_helpers import FAST_GROUPS
from tests.ports import free_port
from tests.postgres_server import PostgresServer, shared_server
from tests.security_helpers import (
    NONE,
    SASL_AUTHENTICATION_FAILED,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_TOPIC_OR_PARTITION,
    OpsConnection,
    TenantLogins,
    TokenIssuer,
    check_roundtrip,
    consume_confluent,
    produce_confluent,
)
from tests.storage.test_storage_engines import TOPIC, append, partition
from tests.txn_helpers import TxnConnection

WITHIN_S = 5.0
NOT_LEADER_OR_FOLLOWER = 6
"""How long a change may take to show on the other broker before a test gives up (the
target is a second; the slack is for a loaded test machine)."""
TENANT = TenantLogins.tenant


def eventually(check: Callable[[], bool], what: str, timeout: float = WITHIN_S) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


# -- two storages on one database ----------------------------------------------------------

@pytest.fixture
def two() -> Iterator[tuple[PgStorage, PgStorage]]:
    url = shared_server().new_database_url()
    first = open_storage(url, LogConfig(segment_bytes=4096))
    second = open_storage(url, LogConfig(segment_bytes=4096))
    assert isinstance(first, PgStorage) and isinstance(second, PgStorage)
    yield first, second
    second.close()
    first.close()


def test_a_second_storage_takes_in_every_topic_change(two: tuple[PgStorage, PgStorage]
                                                      ) -> None:
    a, b = two
    info = a.create_topic(TOPIC, 1, {"retention.ms": "1000"})
    assert b.topic(TOPIC) == info  # a miss is looked up in the database at once
    old = partition(b)
    a.add_partitions(TOPIC, 3)
    a.alter_topic_configs(TOPIC, {"retention.ms": "2000"})
    assert not b.refresh().gone
    grown = b.topic(TOPIC)
    assert grown is not None and grown.num_partitions == 3
    assert grown.configs == {"retention.ms": "2000"}
    assert partition(b) is old and partition(b, index=2).next_offset == 0
    assert [t.name for t in b.topics()] == [TOPIC]

    a.delete_topic(TOPIC)
    changes = b.refresh()
    assert list(changes.gone) == [TOPIC] and changes.gone[TOPIC][0] is old
    assert b.topic(TOPIC) is None and b.topics() == [] and b.partition(TOPIC, 0) is None
    with pytest.raises(LogClosed):
        append(old, 1)

    first = a.create_topic(TOPIC, 2, {})
    assert b.topic(TOPIC) == first
    mine = partition(b)
    a.delete_topic(TOPIC)
    a.create_topic(TOPIC, 1, {})  # deleted and created again between two refreshes
    changes = b.refresh()
    assert list(changes.gone) == [TOPIC] and changes.gone[TOPIC][0] is mine
    renewed = b.topic(TOPIC)
    assert renewed is not None and renewed.topic_id != first.topic_id
    assert renewed.num_partitions == 1 and partition(b) is not mine


def test_a_second_storage_refuses_a_topic_the_first_created_and_grows_from_its_count(
        two: tuple[PgStorage, PgStorage]) -> None:
    a, b = two
    assert b.topic(TOPIC) is None
    a.create_topic(TOPIC, 1, {})
    with pytest.raises(TopicExists):
        b.create_topic(TOPIC, 1, {})
    a.add_partitions(TOPIC, 2)  # b still caches one partition
    assert b.add_partitions(TOPIC, 3).num_partitions == 3
    assert not a.refresh().gone
    grown = a.topic(TOPIC)
    assert grown is not None and grown.num_partitions == 3


def test_a_refresh_never_undoes_a_later_change_of_this_storage(
        two: tuple[PgStorage, PgStorage]) -> None:
    """A snapshot read before this storage's own change (a refresh racing a CreateTopics)
    must not drop the topic it just created."""
    _a, b = two
    stale = b._snapshot()
    b.create_topic(TOPIC, 1, {})
    with b._lock:
        b._apply(stale, [TOPIC])
    assert b.topic(TOPIC) is not None and not b.refresh().gone


def test_key_value_writes_are_reported_to_the_other_storage(
        two: tuple[PgStorage, PgStorage]) -> None:
    a, b = two
    b.refresh()
    assert not b.refresh().kv_changed
    a.kv.put("acls.json", b"[]")
    assert b.refresh().kv_changed
    assert not b.refresh().kv_changed
    assert not a.kv.compare_and_set("acls.json", None, b"[]")
    assert not b.refresh().kv_changed  # a refused compare_and_set changed nothing
    assert a.kv.compare_and_set("acls.json", b"[]", b"[1]")
    assert b.refresh().kv_changed and b.kv.get("acls.json") == b"[1]"


def test_a_partitions_compare_and_set_is_fenced_like_its_put(
        two: tuple[PgStorage, PgStorage]) -> None:
    a, b = two
    a.create_topic(TOPIC, 1, {})
    log = a.partition(TOPIC, 0)
    assert log is not None
    log.fence(0)  # the epoch the partition row holds: never claimed
    assert log.state.compare_and_set("claim", None, b"one")
    b.cluster.register(BrokerRecord(1, None, ()), 60_000)  # another broker takes it
    assert b.cluster.claim([(TOPIC, 0)]) == {(TOPIC, 0): 1}
    with pytest.raises(NotOwner):
        log.state.compare_and_set("claim", b"one", b"two")
    with pytest.raises(NotOwner):
        log.state.compare_and_set("other", None, b"two")
    assert log.state.get("claim") == b"one" and log.state.get("other") is None


def test_storages_starting_together_agree_on_one_cluster_id() -> None:
    url = shared_server().new_database_url()
    storages = [open_storage(url) for _ in range(6)]
    start = threading.Barrier(len(storages))

    def decide(storage: Storage) -> str:
        start.wait()
        return cluster_id(storage.kv)

    try:
        with ThreadPoolExecutor(len(storages)) as pool:
            ids = set(pool.map(decide, storages))
    finally:
        for storage in storages:
            storage.close()
    assert len(ids) == 1


# -- two brokers on one database -----------------------------------------------------------

@dataclass
class Pair(TenantLogins):
    """Two brokers on one database, SASL logins with tokens, ACLs enforced."""

    a: BrokerProcess
    b: BrokerProcess
    issuer: TokenIssuer


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    base = Path(tmp_path_factory.mktemp("pair"))
    issuer = TokenIssuer("hmac", base / "keys")
    url = shared_server().new_database_url()
    brokers = [BrokerProcess(base / f"data{n}", {
        "brokerId": str(n), "storageUrl": url,
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0", "authorizationEnabled": "true",
        "superUserRoles": "admin", "allowAutoTopicCreation": "false",
        "metricsPort": str(free_port()), **FAST_GROUPS, **issuer.settings}) for n in (0, 1)]
    try:
        with ThreadPoolExecutor(2) as pool:  # started together: both race for a cluster id
            for started in [pool.submit(broker.start) for broker in brokers]:
                started.result()
        yield Pair(brokers[0], brokers[1], issuer)
    finally:
        for broker in brokers:
            if broker.alive():
                broker.stop()


def describe_configs(conn: OpsConnection, topic: str) -> tuple[int, dict[str, str | None]]:
    """(error, {name: value}) of a topic's DescribeConfigs v4."""
    request = DescribeConfigsRequest[4](resources=[
        DescribeConfigsRequest.DescribeConfigsResource(
            resource_type=2, resource_name=topic, configuration_keys=None)],
        include_synonyms=False, include_documentation=False)
    (result,) = conn.call(request, 4, DescribeConfigsResponse).results
    return int(result.error_code), {c.name: c.value for c in result.configs}


def topic_error(conn: OpsConnection, topic: str) -> int:
    return int(conn.metadata([topic]).topics[0].error_code)


def test_both_brokers_report_the_same_cluster_id(pair: Pair) -> None:
    ids = set()
    for broker in (pair.a, pair.b):
        conn = pair.conn(broker)
        try:
            ids.add(conn.metadata(None).cluster_id)
        finally:
            conn.close()
    assert len(ids) == 1 and None not in ids


def test_a_topic_created_through_one_broker_is_known_on_the_other_at_once(
        pair: Pair, topic_name: str) -> None:
    a, b = pair.conn(pair.a), pair.conn(pair.b)
    try:
        assert a.create_topic(topic_name, 3) == NONE
        # no waiting: the other broker looks a topic it does not know up in the database
        found = b.metadata([topic_name]).topics[0]
        assert found.error_code == NONE and len(found.partitions) == 3
        assert describe_configs(b, topic_name)[0] == NONE
    finally:
        a.close()
        b.close()
    recs = make_records(30, 1_700_000_000_000)
    produce_confluent(pair.login(pair.b), topic_name, recs)
    check_roundtrip(recs, consume_confluent(pair.login(pair.b), topic_name, len(recs)))


def test_config_and_partitions_changed_through_one_broker_show_on_the_other(
        pair: Pair, topic_name: str) -> None:
    a, b = pair.conn(pair.a), pair.conn(pair.b)
    try:
        assert a.create_topic(topic_name, 1) == NONE
        assert describe_configs(b, topic_name)[1]["retention.ms"] != "123456"  # now cached
        assert a.alter_config(topic_name, "retention.ms", "123456") == NONE
        eventually(lambda: describe_configs(b, topic_name)[1]["retention.ms"] == "123456",
                   "the altered retention.ms on the other broker")
        assert a.create_partitions(topic_name, 4) == NONE
        eventually(lambda: len(b.metadata([topic_name]).topics[0].partitions) == 4,
                   "the new partitions on the other broker")
    finally:
        a.close()
        b.close()


def test_a_topic_deleted_through_one_broker_is_gone_on_the_other(
        pair: Pair, topic_name: str) -> None:
    a, b = pair.conn(pair.a), pair.conn(pair.b)
    try:
        assert a.create_topic(topic_name, 1) == NONE
        # the other broker caches its partition (it leads it, or the first broker does)
        assert b.produce(topic_name, 2) in (NONE, NOT_LEADER_OR_FOLLOWER)
        assert a.delete_topic(topic_name) == NONE
        eventually(lambda: topic_error(b, topic_name) == UNKNOWN_TOPIC_OR_PARTITION,
                   "the deleted topic unknown on the other broker")
        assert topic_name not in {t.name for t in b.metadata(None).topics}
        assert describe_configs(b, topic_name)[0] == UNKNOWN_TOPIC_OR_PARTITION
        assert b.produce(topic_name, 1) == UNKNOWN_TOPIC_OR_PARTITION
    finally:
        a.close()
        b.close()


def _acl(topic: str, role: str) -> dict[str, Any]:
    """A LITERAL ALLOW of READ (which implies DESCRIBE) on ``topic`` for ``role``."""
    return {"resource_type": 2, "resource_name": topic, "resource_pattern_type": 3,
            "principal": f"User:{role}", "host": "*", "operation": 3, "permission_type": 3}


def create_acls(conn: OpsConnection, acls: list[dict[str, Any]]) -> None:
    answer = conn.call(CreateAclsRequest[2](creations=[
        CreateAclsRequest.AclCreation(**acl) for acl in acls]), 2, CreateAclsResponse)
    assert [r.error_code for r in answer.results] == [NONE] * len(acls)


def delete_acl(conn: OpsConnection, acl: dict[str, Any]) -> None:
    answer = conn.call(DeleteAclsRequest[2](filters=[DeleteAclsRequest.DeleteAclsFilter(
        resource_type_filter=acl["resource_type"], resource_name_filter=acl["resource_name"],
        pattern_type_filter=acl["resource_pattern_type"], principal_filter=acl["principal"],
        host_filter=acl["host"], operation=acl["operation"],
        permission_type=acl["permission_type"])]), 2, DeleteAclsResponse)
    (result,) = answer.filter_results
    assert result.error_code == NONE and len(result.matching_acls) == 1


def test_an_acl_created_through_one_broker_is_enforced_on_the_other(
        pair: Pair, topic_name: str) -> None:
    """Logins too: reader may log in to the tenant once it holds an ACL there, on the other
    broker as well, and no longer once it is deleted (a session under way keeps its
    login, its requests are refused)."""
    admin_a = pair.conn(pair.a)
    reader_b: OpsConnection | None = None
    try:
        assert admin_a.create_topic(topic_name, 1) == NONE
        assert pair.login_error(pair.b, "reader") == SASL_AUTHENTICATION_FAILED
        grant = _acl(topic_name, "reader")
        create_acls(admin_a, [grant])
        eventually(lambda: pair.login_error(pair.b, "reader") == NONE,
                   "the new ACL letting reader log in on the other broker")
        reader_b = pair.conn(pair.b, "reader")
        assert topic_error(reader_b, topic_name) == NONE
        delete_acl(admin_a, grant)
        eventually(lambda: topic_error(reader_b, topic_name) == TOPIC_AUTHORIZATION_FAILED,
                   "the deleted ACL gone on the other broker")
        assert pair.login_error(pair.b, "reader") == SASL_AUTHENTICATION_FAILED
    finally:
        admin_a.close()
        if reader_b is not None:
            reader_b.close()


def topic_series(broker: BrokerProcess, topic: str) -> list[str]:
    """The lines of ``broker``'s ``/metrics`` that name ``topic`` (of any tenant)."""
    port = broker.settings["metricsPort"]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    return [line for line in text.decode().splitlines()
            if not line.startswith("#") and f'/{topic}"' in line]


def test_a_topic_deleted_through_one_broker_drops_its_metrics_on_the_other(
        pair: Pair, topic_name: str) -> None:
    """Each broker counts a topic's records and bytes in its own series; a topic deleted
    through another broker kept them here for good (topic churn grew ``/metrics`` without
    bound). The refresh that learns of the deletion drops them."""
    a, b = pair.conn(pair.a), pair.conn(pair.b)
    try:
        assert a.create_topic(topic_name, 4) == NONE
        led_by_b = [index for index in range(4) if b.produce(topic_name, 3, index) == NONE]
        assert led_by_b, "the second broker leads none of the four partitions"
        assert any("kop_server_messages_in_total" in line
                   for line in topic_series(pair.b, topic_name))
        assert a.delete_topic(topic_name) == NONE
        eventually(lambda: topic_series(pair.b, topic_name) == [],
                   "the deleted topic's series gone from the other broker")
        assert topic_series(pair.a, topic_name) == []
    finally:
        a.close()
        b.close()


def test_acls_created_through_both_brokers_at_once_are_all_kept(
        pair: Pair, topic_name: str) -> None:
    roles = [f"{topic_name}-role{i}" for i in range(16)]

    def create(broker: BrokerProcess, mine: list[str]) -> None:
        conn = pair.conn(broker)
        try:
            for role in mine:
                create_acls(conn, [_acl(topic_name, role)])
        finally:
            conn.close()

    with ThreadPoolExecutor(2) as pool:
        for done in [pool.submit(create, pair.a, roles[0::2]),
                     pool.submit(create, pair.b, roles[1::2])]:
            done.result()

    def described(broker: BrokerProcess) -> set[str]:
        conn = pair.conn(broker)
        try:
            answer = conn.call(DescribeAclsRequest[2](
                resource_type_filter=2, resource_name_filter=topic_name,
                pattern_type_filter=3, principal_filter=None, host_filter=None, operation=1,
                permission_type=1), 2, DescribeAclsResponse)
        finally:
            conn.close()
        assert answer.error_code == NONE
        return {acl.principal for resource in answer.resources for acl in resource.acls}

    wanted = {f"User:{role}" for role in roles}
    eventually(lambda: described(pair.a) == wanted == described(pair.b),
               "every ACL on both brokers")


class PidConnection(OpsConnection, TxnConnection):
    """A logged-in connection that asks for producer ids."""


def test_producer_ids_from_both_brokers_never_collide(pair: Pair) -> None:
    """Idempotent InitProducerId on both brokers at once, across several id blocks."""
    calls = 700

    def ids(broker: BrokerProcess) -> list[int]:
        conn = PidConnection(broker.port)
        conn.login(TENANT, pair.issuer.token("admin"))
        try:
            return [conn.init_ok(None)[0] for _ in range(calls)]
        finally:
            conn.close()

    with ThreadPoolExecutor(4) as pool:
        runs = [pool.submit(ids, broker) for broker in (pair.a, pair.b, pair.a, pair.b)]
        given = [pid for run in runs for pid in run.result()]
    assert len(given) == 4 * calls
    assert len(set(given)) == len(given), "a producer id was handed out twice"


def test_a_database_away_is_logged_once_by_the_refresh_and_once_when_back(
        own_server: PostgresServer, tmp_path: Path, topic_name: str) -> None:
    broker = BrokerProcess(tmp_path / "data",
                           {"storageUrl": own_server.new_database_url()}).start()
    try:
        mark = len(broker.lines)
        own_server.stop()
        broker.wait_for_log("cannot take in what other brokers changed", 30, mark)
        time.sleep(1.5)  # several more rounds fail meanwhile, silently
        own_server.start()
        broker.wait_for_log("reading what other brokers changed works again", 30, mark)
        log = "\n".join(broker.lines[mark:])
        assert log.count("cannot take in what other brokers changed") == 1, log
        assert "Traceback" not in log, log
        conn = OpsConnection(broker.port)
        try:
            assert conn.create_topic(topic_name) == NONE  # the broker carries on
        finally:
            conn.close()
        assert broker.stop() == 0
    finally:
        if broker.alive():
            broker.kill()
