"""Quotas on brokers sharing PostgreSQL: a quota altered through one broker is described by
the other and throttles its clients, without a restart; a tenant's ``max_connections``,
``max_stored_bytes``, ``max_topics`` and ``max_partitions`` count what the tenant holds on
every broker, not on the one a request reaches.

Each broker learns the others' connections from their heartbeats and the stored bytes from
its next sum over the database, so the tests wait (polling a broker's usage gauge, with a
deadline) until a broker has seen what another holds before they test it; nothing asserts
how long that took.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.broker_process import BrokerProcess
from tests.cluster_helpers import Cluster, running_cluster
from tests.ports import free_port
from tests.quota_helpers import alter, describe, parts, produce_throttle
from tests.raw import RawConnection
from tests.security_helpers import (
    UNKNOWN_TOPIC_OR_PARTITION,
    Login,
    OpsConnection,
    TokenIssuer,
    plain_message,
)

NOT_LEADER_OR_FOLLOWER = 6
POLICY_VIOLATION = 44
KAFKA_STORAGE_ERROR = 56
VALUE = b"x" * 10_000


def test_a_quota_altered_through_one_broker_applies_on_the_other(tmp_path: Path,
                                                                   topic_name: str) -> None:
    with running_cluster(tmp_path, size=2, settings={"quotaWindowNum": "5"}) as cluster:
        first, second = cluster.brokers
        # before: the second broker does not throttle this client
        assert produce_throttle(RawConnection(second.port), topic_name, 50_000)[1] == 0
        entity = {"client-id": "raw-test"}
        assert alter(RawConnection(first.port), [(entity, {"producer_byte_rate": 1000})]) \
            == [(0, None)]
        conn = RawConnection(second.port)
        deadline = time.monotonic() + 30
        while describe(conn, [])[1].get(parts(entity)) != {"producer_byte_rate": 1000}:
            assert time.monotonic() < deadline, "the second broker never saw the quota"
            time.sleep(0.1)
        # charged whoever leads the partition (an answer NOT_LEADER_OR_FOLLOWER counts too)
        _error, throttle = produce_throttle(RawConnection(second.port), topic_name, 50_000)
        assert throttle > 0


@dataclass
class Tenants:
    """Two brokers with SASL logins on one database, each with its metrics endpoint."""

    cluster: Cluster
    issuer: TokenIssuer
    metrics: dict[int, int]  # broker id -> metrics port

    def broker(self, broker_id: int) -> BrokerProcess:
        return self.cluster.by_id(broker_id)

    def conn(self, broker_id: int, tenant: str, role: str = "alice") -> OpsConnection:
        conn = OpsConnection(self.broker(broker_id).port)
        conn.login(tenant, self.issuer.token(role))
        return conn

    def try_login(self, broker_id: int, tenant: str) -> OpsConnection | None:
        """A logged-in connection, or None when the broker closed it at login."""
        conn = OpsConnection(self.broker(broker_id).port)
        try:
            assert conn.handshake("PLAIN").error_code == 0
            answer = conn.authenticate(plain_message(tenant,
                                                     "token:" + self.issuer.token("alice")))
        except OSError:  # closed without an answer: refused
            conn.close()
            return None
        assert answer.error_code == 0, answer
        return conn

    def usage(self, broker_id: int, tenant: str, quota: str) -> float | None:
        """The broker's ``kop_server_tenant_quota_usage`` of ``tenant`` and ``quota``."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics[broker_id]}/metrics",
                                      timeout=10).read().decode()
        found = re.search(rf'kop_server_tenant_quota_usage\{{quota="{quota}",'
                          rf'tenant="{tenant}"\}} (\S+)', text)
        return None if found is None else float(found[1])

    def set_quota(self, tenant: str, values: dict[str, float]) -> None:
        """Set ``tenant``'s quota through broker 0 and wait until broker 1 describes it."""
        operator = self.conn(0, "ops", "admin")
        assert alter(operator, [({"tenant": tenant}, values)]) == [(0, None)]
        other = self.conn(1, "ops", "admin")
        wait_for(lambda: describe(other, [])[1].get(parts({"tenant": tenant})) == values,
                 f"broker 1 never saw the quota of {tenant}")


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenants]:
    root = Path(tmp_path_factory.mktemp("cluster-tenant-quotas"))
    issuer = TokenIssuer("hmac", root / "keys")
    admin = Login("", "SASL_PLAINTEXT", "ops", issuer.token("admin")).confluent()
    del admin["bootstrap.servers"]
    cluster = Cluster(root, 2, settings={
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0", "superUserRoles": "admin",
        "quotaWindowNum": "5", "tenantUsageCheckIntervalMs": "200",
        **issuer.settings}, client=admin)
    metrics = {}
    for broker_id, broker in zip(cluster.ids, cluster.brokers, strict=True):
        metrics[broker_id] = free_port()
        broker.settings["metricsPort"] = str(metrics[broker_id])
    try:
        yield Tenants(cluster.start(), issuer, metrics)
    finally:
        cluster.stop()


def test_max_connections_counts_the_tenants_connections_on_every_broker(
        tenants: Tenants) -> None:
    tenants.set_quota("spread", {"max_connections": 3})
    on_first = [tenants.try_login(0, "spread") for _ in range(2)]
    assert all(conn is not None for conn in on_first)
    wait_for(lambda: tenants.usage(1, "spread", "max_connections") == 2,
             "broker 1 never counted broker 0's connections")
    third = tenants.try_login(1, "spread")
    assert third is not None, "the third connection is within the cap"
    assert tenants.try_login(1, "spread") is None, "a fourth one on broker 1 passed the cap"
    wait_for(lambda: tenants.usage(0, "spread", "max_connections") == 3,
             "broker 0 never counted broker 1's connection")
    assert tenants.try_login(0, "spread") is None, "a fourth one on broker 0 passed the cap"
    assert tenants.try_login(0, "others") is not None  # another tenant is not counted
    third.close()  # a connection closed on broker 1 frees a place on broker 0
    wait_for(lambda: tenants.usage(0, "spread", "max_connections") == 2,
             "broker 0 never saw broker 1's connection close")
    assert tenants.try_login(0, "spread") is not None


def test_max_connections_holds_for_logins_on_every_broker_at_once(tenants: Tenants) -> None:
    tenants.set_quota("rush", {"max_connections": 4})
    with ThreadPoolExecutor(12) as pool:  # 6 logins on each broker, all at once
        logins = list(pool.map(lambda i: tenants.try_login(i % 2, "rush"), range(12)))
    admitted = [conn for conn in logins if conn is not None]
    print(f"12 simultaneous logins of a tenant at max_connections 4 on 2 brokers: "
          f"{len(admitted)} admitted")
    assert 1 <= len(admitted) <= 4


def _leaders(conn: OpsConnection, topic: str) -> dict[int, int]:
    """partition -> leader id, as the broker of ``conn`` tells."""
    (found,) = conn.metadata([topic]).topics
    return {int(p.partition_index): int(p.leader_id) for p in found.partitions}


def test_the_storage_quota_counts_what_the_tenant_stored_through_every_broker(
        tenants: Tenants) -> None:
    tenants.set_quota("hoard", {"max_stored_bytes": 200_000})
    conns = {0: tenants.conn(0, "hoard"), 1: tenants.conn(1, "hoard")}
    assert conns[0].create_topic("data", 8) == 0

    def agreed() -> bool:
        views = [_leaders(conn, "data") for conn in conns.values()]
        return views[0] == views[1] and set(views[0].values()) == {0, 1}

    wait_for(agreed, "the brokers never agreed on the partitions' leaders")
    leaders = _leaders(conns[0], "data")
    led = {broker_id: min(p for p, b in leaders.items() if b == broker_id)
           for broker_id in (0, 1)}
    for _ in range(15):  # 150 kB through broker 0
        assert conns[0].produce("data", 1, led[0], VALUE) == 0
    wait_for(lambda: (tenants.usage(1, "hoard", "max_stored_bytes") or 0) >= 150_000,
             "broker 1 never summed what the tenant stored through broker 0")
    codes: list[int] = []
    while len(codes) < 30 and (not codes or codes[-1] == 0):
        code = conns[1].produce("data", 1, led[1], VALUE)
        if code == NOT_LEADER_OR_FOLLOWER:  # not claimed yet: retriable, nothing stored
            time.sleep(0.1)
            continue
        codes.append(code)
    stored = codes.count(0)
    print(f"max_stored_bytes 200000, 150 kB stored through broker 0: broker 1 stored "
          f"{stored} more 10 kB batches, then answered {codes[-1]}")
    assert codes[-1] == KAFKA_STORAGE_ERROR and 1 <= stored <= 6
    # a batch that would take the tenant beyond its cap is refused: it stays just under
    wait_for(lambda: (tenants.usage(0, "hoard", "max_stored_bytes") or 0)
             >= (15 + stored) * len(VALUE),
             "broker 0 never summed what the tenant stored through broker 1")
    assert conns[0].produce("data", 1, led[0], VALUE) == KAFKA_STORAGE_ERROR
    roomy = tenants.conn(1, "roomy")  # another tenant goes on producing
    assert roomy.create_topic("data", 1) == 0
    wait_for(lambda: _leaders(roomy, "data")[0] in (0, 1), "no leader for roomy's topic")
    other = tenants.conn(_leaders(roomy, "data")[0], "roomy")
    wait_for(lambda: other.produce("data", 1, 0, VALUE) == 0, "another tenant was refused")
    for broker_id, partition in led.items():  # DeleteRecords frees it on both brokers
        _error, end = conns[broker_id].list_offset("data", partition)
        assert conns[broker_id].delete_records("data", partition, end) == 0
    for broker_id, partition in led.items():
        wait_for(lambda b=broker_id, p=partition: conns[b].produce("data", 1, p, VALUE) == 0,
                 f"the storage quota never recovered on broker {broker_id}")


def test_topic_and_partition_caps_count_topics_created_through_every_broker(
        tenants: Tenants) -> None:
    tenants.set_quota("few", {"max_topics": 2, "max_partitions": 4})
    first, second = tenants.conn(0, "few"), tenants.conn(1, "few")
    assert first.create_topic("one", 2) == 0
    assert second.create_topic("two", 1) == 0
    names = {0: first, 1: second}
    for broker_id, conn in names.items():  # each broker lists both (the shared metadata)
        wait_for(lambda c=conn: {t.name for t in c.metadata().topics} >= {"one", "two"},
                 f"broker {broker_id} never listed both topics")
    for conn in (first, second):
        assert conn.create_topic("three", 1) == POLICY_VIOLATION  # 3 topics > 2
        assert conn.create_partitions("two", 3) == POLICY_VIOLATION  # 5 partitions > 4
    assert second.create_partitions("two", 2) == 0  # 4 partitions: within the cap
    assert first.delete_topic("one") == 0
    wait_for(lambda: "one" not in {t.name for t in second.metadata().topics},
             "broker 1 never saw the deletion")
    assert second.create_topic("three", 1) == 0


def test_creations_through_both_brokers_at_once_keep_the_topic_cap(tenants: Tenants) -> None:
    """Each broker's own count lets every creation through; the database counts them under
    the tenant's lock, so exactly the cap's worth are created."""
    tenants.set_quota("racy", {"max_topics": 3})
    conns = [tenants.conn(i % 2, "racy") for i in range(8)]
    start = threading.Barrier(len(conns))

    def create(index: int) -> int:
        start.wait(30)
        return conns[index].create_topic(f"t{index}", 1)

    with ThreadPoolExecutor(len(conns)) as pool:
        codes = list(pool.map(create, range(len(conns))))
    assert sorted(codes) == [0] * 3 + [POLICY_VIOLATION] * 5, codes
    for conn in conns:
        conn.close()


def test_auto_creations_through_both_brokers_at_once_keep_the_topic_cap(
        tenants: Tenants) -> None:
    """Metadata auto-creation passes the tenant's caps to the database as CreateTopics
    does: auto-creations through both brokers at once create exactly the cap's worth."""
    tenants.set_quota("autoracy", {"max_topics": 3})
    conns = [tenants.conn(i % 2, "autoracy") for i in range(8)]
    start = threading.Barrier(len(conns))

    def create(index: int) -> int:
        start.wait(30)
        (topic,) = conns[index].metadata([f"t{index}"], auto_create=True).topics
        return int(topic.error_code)

    with ThreadPoolExecutor(len(conns)) as pool:
        codes = list(pool.map(create, range(len(conns))))
    print(f"8 auto-creations through 2 brokers at once, max_topics 3: {codes}")
    assert sorted(codes) == [0] * 3 + [UNKNOWN_TOPIC_OR_PARTITION] * 5, codes
    wait_for(lambda: len(conns[0].metadata().topics) >= 3,
             "broker 0 never listed the topics created through broker 1")
    assert len(conns[0].metadata().topics) == 3
    for conn in conns:
        conn.close()


def test_growth_through_both_brokers_at_once_keeps_the_partition_cap(tenants: Tenants) -> None:
    """Topics grown through both brokers at once: the database counts the partitions under
    the tenant's lock, so the cap holds."""
    tenants.set_quota("growing", {"max_partitions": 6})
    first = tenants.conn(0, "growing")
    assert first.create_topic("a", 1) == 0 and first.create_topic("b", 1) == 0
    conns = [tenants.conn(i % 2, "growing") for i in range(2)]
    wait_for(lambda: {"a", "b"} <= {t.name for t in conns[1].metadata().topics},
             "broker 1 never listed both topics")
    start = threading.Barrier(2)

    def grow(index: int) -> int:
        start.wait(30)
        return conns[index].create_partitions("ab"[index], 4)  # 3 more each: 8 > 6

    with ThreadPoolExecutor(2) as pool:
        codes = list(pool.map(grow, range(2)))
    assert sorted(codes) == [0, POLICY_VIOLATION], codes
    for conn in (first, *conns):
        conn.close()
