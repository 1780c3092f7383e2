"""Issue 16 §5: Envoy follows the cluster registry.

Brokers sharing one PostgreSQL database register there with a lease.  ``edge-broker
xds-server --registry URL`` serves a listener and a cluster per live broker (its listener
of one name: the advertised address is Envoy's port for it, the bound one where Envoy
forwards) and pushes a new version when a broker joins or leaves; a real Envoy applies it
without a restart.  A client reaches every broker through one bootstrap address.  Also:
TLS at Envoy with SNI routing from the registry, a registry that cannot be read (the last
snapshot keeps serving, one log line per cause), and ``envoy-config --registry``.
"""

from __future__ import annotations

import logging
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
import yaml
from confluent_kafka.admin import AdminClient

from broker_core.storage.cluster import BrokerRecord, ListenerAddress
from broker_core.storage.pg_cluster import PgCluster
from broker_core.storage.pg_database import READER_NAME, Database
from edge.envoy.model import EnvoyPlan
from edge.envoy.registry import RegistryBrokers
from edge.envoy.source import PlanSource
from edge.envoy.xds_server import XdsServer
from tests.broker_process import BrokerProcess
from tests.clients import (
    consume_confluent,
    create_topic,
    make_records,
    present,
    produce_confluent,
)
from tests.envoy_helpers import (
    EnvoyProcess,
    XdsProcess,
    brokers_of,
    brokers_via,
    envoy_config,
    envoy_config_error,
    envoy_on_xds,
    metadata,
)
from tests.group_helpers import wait_until
from tests.ports import free_ports
from tests.postgres_server import shared_server
from tests.raw import RawConnection
from tests.security_helpers import TlsFiles, make_tls


@pytest.fixture
def database_url() -> str:
    """A new database on the session's PostgreSQL server."""
    return shared_server().new_database_url()


class Cluster:
    """Brokers of one database, each advertising its own address (Envoy's) for PLAINTEXT."""

    def __init__(self, root: Path, url: str) -> None:
        self.root = root
        self.url = url
        self.brokers: dict[int, BrokerProcess] = {}

    def start(self, broker_id: int, advertised: str) -> BrokerProcess:
        process = BrokerProcess(self.root / f"b{broker_id}", {
            "brokerId": str(broker_id), "storageUrl": self.url,
            "kafkaAdvertisedListeners": f"PLAINTEXT://{advertised}"})
        self.brokers[broker_id] = process.start()
        return process

    def stop(self) -> None:
        for process in self.brokers.values():
            if process.alive():
                process.stop()


@pytest.fixture
def cluster(tmp_path: Path, database_url: str) -> Iterator[Cluster]:
    brokers = Cluster(tmp_path, database_url)
    try:
        yield brokers
    finally:
        brokers.stop()


def _leaders(bootstrap: str, topic: str) -> set[int]:
    """The brokers leading a partition of ``topic``, as Metadata through ``bootstrap`` says."""
    found = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return {p.leader for p in found.topics[topic].partitions.values()}


def _dynamic_names(envoy: EnvoyProcess) -> tuple[list[str], list[str]]:
    """Names of the listeners and clusters Envoy got over xDS (``/config_dump``)."""
    dump = yaml.safe_load(envoy.admin("/config_dump"))
    listeners: list[str] = []
    clusters: list[str] = []
    for config in dump["configs"]:
        for item in config.get("dynamic_listeners", []):
            if "active_state" in item:
                listeners.append(item["name"])
        for item in config.get("dynamic_active_clusters", []):
            clusters.append(item["cluster"]["name"])
    return sorted(listeners), sorted(clusters)


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_envoy_follows_brokers_joining_and_leaving(cluster: Cluster, tmp_path: Path) -> None:
    ports = free_ports(4)
    envoy_ports, admin = ports[:3], ports[3]
    bootstrap = f"127.0.0.1:{envoy_ports[0]}"
    cluster.start(0, bootstrap)
    xds = XdsProcess("--registry", cluster.url, "--listener", "plaintext").start()
    envoy = envoy_on_xds(tmp_path, xds.grpc_port, admin)
    try:
        envoy.start(listeners=1)
        pid = envoy.pid
        # a broker reads the topics at start only (the engine caches them per process): the
        # topic is created before the other brokers start, so that every broker knows it
        create_topic(bootstrap, "across-envoy", 3)

        # a second broker registers: Envoy gains its listener and cluster
        cluster.start(1, f"127.0.0.1:{envoy_ports[1]}")
        envoy.wait_for(lambda: len(envoy.listeners()) == 2, 30, "broker 1's listener")
        assert _dynamic_names(envoy) == (["kafka-broker-0", "kafka-broker-1"],
                                         ["kafka-broker-0", "kafka-broker-1"])

        # a client given only Envoy's first port works with the whole cluster
        wait_until(lambda: _leaders(bootstrap, "across-envoy") == {0, 1}, 30,
                   "partitions owned by both brokers")
        first = make_records(60, 1_700_000_000_000)
        produce_confluent(bootstrap, "across-envoy", first, "none")
        got = consume_confluent(bootstrap, "across-envoy", len(first))
        assert sorted(present(g.rec.value) for g in got) == sorted(present(r.value) for r in first)
        assert brokers_via(envoy_ports[0]) == [(i, "127.0.0.1", envoy_ports[i])
                                                 for i in (0, 1)]
        assert envoy.stats()["cluster.kafka-broker-1.upstream_cx_total"] >= 1

        # a third broker registers: Envoy gains its listener and cluster, no restart
        cluster.start(2, f"127.0.0.1:{envoy_ports[2]}")
        xds.wait_for_log(r"\(registry changed\): clusters and listeners changed; listeners:"
                         r" kafka-broker-0, kafka-broker-1, kafka-broker-2", 30)
        envoy.wait_for(lambda: len(envoy.listeners()) == 3, 30, "broker 2's listener")
        assert _dynamic_names(envoy) == ([f"kafka-broker-{i}" for i in range(3)],
                                         [f"kafka-broker-{i}" for i in range(3)])
        envoy.wait_for(lambda: len(brokers_via(envoy_ports[0])) == 3, 30,
                       "Metadata listing 3 brokers")
        assert brokers_via(envoy_ports[0]) == [(i, "127.0.0.1", envoy_ports[i])
                                                 for i in range(3)]
        assert brokers_via(envoy_ports[2]) == [(i, "127.0.0.1", envoy_ports[i])
                                                 for i in range(3)]
        assert envoy.stats()["cluster.kafka-broker-2.upstream_cx_total"] >= 1
        assert envoy.pid == pid

        # broker 1 stops (SIGTERM): its listener and cluster leave Envoy, no restart
        assert cluster.brokers[1].stop() == 0
        xds.wait_for_log(r"\(registry changed\): clusters and listeners changed; listeners:"
                         r" kafka-broker-0, kafka-broker-2$", 30)
        envoy.wait_for(lambda: _dynamic_names(envoy) == (
            ["kafka-broker-0", "kafka-broker-2"], ["kafka-broker-0", "kafka-broker-2"]),
            30, "broker 1's listener and cluster to leave")
        assert sorted(line.split("::")[0] for line in envoy.listeners()) == [
            "kafka-broker-0", "kafka-broker-2"]
        envoy.wait_for(lambda: _refused(envoy_ports[1]), 30, "Envoy to close broker 1's port")
        assert envoy.pid == pid and envoy.proc is not None and envoy.proc.poll() is None

        # the client carries on through the same bootstrap address with brokers 0 and 2
        second = make_records(30, 1_700_000_100_000)
        produce_confluent(bootstrap, "across-envoy", second, "none")
        got = consume_confluent(bootstrap, "across-envoy", len(first) + len(second))
        assert sorted(present(g.rec.value) for g in got) == \
            sorted(present(r.value) for r in first + second)
        envoy.wait_for(lambda: len(brokers_via(envoy_ports[0])) == 2, 30,
                       "Metadata listing 2 brokers")
        assert xds.status()["nodes"]["edge-broker-envoy"]["rejected"] == {}
    finally:
        envoy.stop()
        xds.stop()


def _tls_metadata(port: int, tls: TlsFiles, server_name: str) -> list[tuple[int, str, int]]:
    context = ssl.create_default_context(cafile=str(tls.ca))
    context.check_hostname = False  # the test certificate names localhost only
    conn = RawConnection(port)
    conn.sock = context.wrap_socket(conn.sock, server_hostname=server_name)
    try:
        return brokers_of(metadata(conn))
    finally:
        conn.close()


def test_sni_on_one_tls_port_follows_the_registry(cluster: Cluster, tmp_path: Path) -> None:
    tls = make_tls(tmp_path / "tls")
    port, admin = free_ports(2)
    cluster.start(0, f"kafka-0.test:{port}")
    xds = XdsProcess("--registry", cluster.url, "--sni", "--listen-host", "127.0.0.1",
                     "--tls-cert", str(tls.cert), "--tls-key", str(tls.key)).start()
    envoy = envoy_on_xds(tmp_path, xds.grpc_port, admin)
    try:
        envoy.start(listeners=1)
        pid = envoy.pid
        assert _tls_metadata(port, tls, "kafka-0.test") == [(0, "kafka-0.test", port)]
        with pytest.raises((ssl.SSLError, ConnectionError)):  # not registered (yet)
            _tls_metadata(port, tls, "kafka-1.test")

        cluster.start(1, f"kafka-1.test:{port}")
        xds.wait_for_log(r"\(registry changed\): clusters and listeners changed", 30)
        envoy.wait_for(lambda: _dynamic_names(envoy)[1] == ["kafka-broker-0",
                                                            "kafka-broker-1"],
                       30, "broker 1's cluster")
        expected = [(0, "kafka-0.test", port), (1, "kafka-1.test", port)]
        envoy.wait_for(lambda: _tls_metadata(port, tls, "kafka-1.test") == expected, 30,
                       "broker 1 reached by its name, listing both brokers")
        assert envoy.stats()["cluster.kafka-broker-1.upstream_cx_total"] >= 1
        assert envoy.pid == pid
    finally:
        envoy.stop()
        xds.stop()


# -- the registry without brokers or Envoy: registrations made through the engine's own code

def _record(broker_id: int, envoy_port: int, bound_port: int) -> BrokerRecord:
    return BrokerRecord(broker_id, None, (
        ListenerAddress("INTERNAL", "PLAINTEXT", "10.0.0.9", 9999, "10.0.0.9", 9999),
        ListenerAddress("EDGE", "PLAINTEXT", "127.0.0.1", envoy_port, "0.0.0.0", bound_port)))


@pytest.fixture
def registry(database_url: str) -> Iterator[Callable[[BrokerRecord], PgCluster]]:
    """Register brokers in the database (as a broker's storage does), deregistered after."""
    members: list[PgCluster] = []
    databases: list[Database] = []

    def register(record: BrokerRecord) -> PgCluster:
        database = Database(database_url, "test")
        databases.append(database)
        member = PgCluster(database, lambda _topic, _partition: None)
        member.register(record, 60_000)
        members.append(member)
        return member

    try:
        yield register
    finally:
        for member in members:
            member.deregister()
        for database in databases:
            database.close()


def test_envoy_config_writes_every_live_broker(
        database_url: str, registry: Callable[[BrokerRecord], PgCluster]) -> None:
    assert "no brokers to put behind Envoy" in envoy_config_error(
        "--registry", database_url)  # the schema is not even there yet
    registry(_record(4, 19094, 29094))
    registry(_record(3, 19093, 29093))
    left = registry(_record(5, 19095, 29095))
    left.deregister()
    with_password = database_url.replace("edge@", "edge:s3cret@")
    config = envoy_config("--registry", with_password, "--listener", "edge")
    assert "s3cret" not in config  # the command line in the header hides the password
    clusters = yaml.safe_load(config)["static_resources"]["clusters"]
    assert [c["name"] for c in clusters] == ["kafka-broker-3", "kafka-broker-4"]
    endpoint = clusters[0]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
    assert endpoint["endpoint"]["address"]["socket_address"] == {
        "address": "127.0.0.1", "port_value": 29093}  # a wildcard bind: on loopback
    assert "no listener named 'nope' on broker 3 (it has INTERNAL, EDGE)" in \
        envoy_config_error("--registry", database_url, "--listener", "nope")
    assert "expected the brokers' postgres:// storageUrl" in envoy_config_error(
        "--registry", "file:///tmp/x")


def _block_readers(url: str, database: str, allow: bool) -> None:
    """Let no new connection into ``database`` (or again) and cut the registry readers'."""
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {database} ALLOW_CONNECTIONS {allow}".encode())
        if not allow:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                         " WHERE datname = %s AND application_name = %s",
                         (database, READER_NAME))


def test_an_unreadable_registry_keeps_the_last_snapshot(
        database_url: str, registry: Callable[[BrokerRecord], PgCluster],
        caplog: pytest.LogCaptureFixture) -> None:
    registry(_record(1, 19091, 29091))
    server = XdsServer(PlanSource(registry=RegistryBrokers(database_url, "EDGE")),
                       ("127.0.0.1", 0), ("127.0.0.1", 0), poll_interval=0.05)
    database = database_url.rsplit("/", 1)[1]
    caplog.set_level(logging.INFO, logger="edge.envoy.xds")
    server.start()
    try:
        served = server.status_dict()["resources"]["listeners"]
        assert served["names"] == ["kafka-broker-1"]
        registry(_record(2, 19092, 29092))
        wait_until(lambda: server.status_dict()["resources"]["listeners"]["names"] == [
            "kafka-broker-1", "kafka-broker-2"], 30, "broker 2's listener")
        version = server.store.version

        _block_readers(database_url, database, allow=False)
        try:
            wait_until(lambda: server.last_error is not None, 30, "the registry to fail")
            time.sleep(1.0)  # twenty more polls, all failing for the same reason
            failures = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
            assert len(failures) == 1, failures
            assert f"reload (registry changed) failed, still serving version {version}:" \
                   f" broker registry {database_url}:" in failures[0]
            assert "PostgreSQL" in failures[0]
            assert server.store.version == version
            assert server.status_dict()["resources"]["listeners"]["names"] == [
                "kafka-broker-1", "kafka-broker-2"]
        finally:
            _block_readers(database_url, database, allow=True)
        wait_until(lambda: any(f"no change, version {version}" in r.getMessage()
                               for r in caplog.records), 30, "the registry to be read again")
        assert server.last_error is None
        assert server.store.version == version  # nothing changed meanwhile
    finally:
        server.stop()


def test_a_broker_that_cannot_be_routed_is_left_out_and_the_others_follow(
        database_url: str, registry: Callable[[BrokerRecord], PgCluster],
        caplog: pytest.LogCaptureFixture) -> None:
    # one misconfigured broker (here: advertising the port broker 1 advertises) used to
    # fail every reload, so a broker joining after it was never routed
    registry(_record(1, 19091, 29091))
    server = XdsServer(PlanSource(registry=RegistryBrokers(database_url, "EDGE")),
                       ("127.0.0.1", 0), ("127.0.0.1", 0), poll_interval=0.05)
    caplog.set_level(logging.INFO, logger="edge.envoy.xds")
    server.start()
    try:
        registry(_record(2, 19091, 29092))  # the same advertised port as broker 1
        wait_until(lambda: "2" in server.status_dict()["left_out"], 30, "broker 2 left out")
        registry(_record(3, 19093, 29093))
        wait_until(lambda: server.status_dict()["resources"]["listeners"]["names"] == [
            "kafka-broker-1", "kafka-broker-3"], 30, "broker 3's listener")
        assert server.last_error is None
        lines = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
        assert len(lines) == 1 and lines[0].startswith("xds: broker 2 left out"), lines
    finally:
        server.stop()


def _edge_only(broker_id: int, advertised: tuple[str, int], bound: tuple[str, int]
               ) -> BrokerRecord:
    return BrokerRecord(broker_id, None, (ListenerAddress("EDGE", "PLAINTEXT", *advertised,
                                                          *bound),))


def _registry_plan(database_url: str) -> tuple[EnvoyPlan, dict[int, str]]:
    """The plan of the registry's EDGE listeners, and the brokers left out of it (why)."""
    brokers = RegistryBrokers(database_url, "EDGE")
    try:
        plan, left_out = PlanSource(registry=brokers).load_each()
    finally:
        brokers.close()
    assert plan is not None
    return plan, left_out


def test_a_broker_advertising_a_wildcard_or_its_own_port_is_left_out(
        database_url: str, registry: Callable[[BrokerRecord], PgCluster]) -> None:
    # these were routed: clients were told 0.0.0.0 (or ::), or Envoy listened on every
    # interface at the port the broker (on Envoy's host: reached on loopback) listens on
    registry(_record(1, 19091, 29091))
    registry(_edge_only(2, ("0.0.0.0", 19092), ("0.0.0.0", 29092)))  # an older broker
    registry(_edge_only(3, ("::", 19093), ("::", 29093)))
    registry(_edge_only(4, ("kafka-4.example", 29094), ("0.0.0.0", 29094)))
    registry(_edge_only(5, ("kafka-5.example", 29095), ("::", 29095)))
    registry(_edge_only(6, ("kafka-6.example", 19096), ("0.0.0.0", 29096)))  # fine
    plan, left_out = _registry_plan(database_url)
    assert [(b.broker_id, b.advertised_address, b.internal_address) for b in plan.brokers] == [
        (1, f"127.0.0.1:{19091}", "127.0.0.1:29091"),
        (6, "kafka-6.example:19096", "127.0.0.1:29096")]
    assert left_out == {
        2: "broker 2: advertised address 0.0.0.0:19092 is the nonroutable meta-address (every"
           " interface), which clients cannot connect to; advertise Envoy's host name or IP"
           " address",
        3: "broker 3: advertised address [::]:19093 is the nonroutable meta-address (every"
           " interface), which clients cannot connect to; advertise Envoy's host name or IP"
           " address",
        4: "broker 4: Envoy would listen for it on 0.0.0.0:29094, which is the broker's own"
           " listener 127.0.0.1:29094; advertise Envoy's address (another port, or another"
           " host) instead",
        5: "broker 5: Envoy would listen for it on 0.0.0.0:29095, which is the broker's own"
           " listener [::1]:29095; advertise Envoy's address (another port, or another host)"
           " instead"}


def test_a_broker_whose_envoy_listener_overlaps_another_is_left_out(
        database_url: str, registry: Callable[[BrokerRecord], PgCluster]) -> None:
    # Envoy bound 127.0.0.1:19091 for broker 1 and 0.0.0.0:19091 for broker 2 (advertised
    # by name), and gave broker 2's clients (kafka-2 resolving to 127.0.0.1) to broker 1
    registry(_record(1, 19091, 29091))
    registry(_edge_only(2, ("localhost", 19091), ("127.0.0.1", 29092)))
    registry(_edge_only(3, ("127.0.0.3", 19091), ("127.0.0.1", 29093)))  # fine
    plan, left_out = _registry_plan(database_url)
    assert [b.broker_id for b in plan.brokers] == [1, 3]
    assert left_out == {2: "brokers 1 and 2 both take port 19091: Envoy would listen for"
                           " broker 1 on 127.0.0.1:19091 and for broker 2 on 0.0.0.0:19091,"
                           " which overlap (the same address, or every interface), so"
                           " clients of one would reach the other; without SNI each broker"
                           " needs its own port"}
