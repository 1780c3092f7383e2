"""Envoy acceptance 4: source-CIDR rules, the connection limit and the connection rate
limit close connections at Envoy, and Envoy's admin stats count them; the access log
records each connection.  Also client certificates required at Envoy, and SNI routing of
one TLS port to the broker named by the server name."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker_process import BrokerProcess
from tests.envoy_helpers import (
    brokers_of,
    closed_without_answer,
    metadata,
    running_envoy,
    write_config,
)
from tests.ports import free_ports
from tests.raw import RawConnection
from tests.security_helpers import TlsFiles, make_tls


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(Path(tmp_path_factory.mktemp("envoy-policies"))).start()
    yield process
    process.stop()


def _route(broker: BrokerProcess, envoy_port: int) -> str:
    return f"0=127.0.0.1:{envoy_port}@127.0.0.1:{broker.port}"


def test_rbac_denies_a_source_range(broker: BrokerProcess, tmp_path: Path) -> None:
    port, admin = free_ports(2)
    config = write_config(tmp_path, "deny.yaml", "--broker", _route(broker, port),
                          "--deny-cidr", "127.0.0.0/8", "--admin-port", str(admin))
    with running_envoy(config, admin) as envoy:
        assert closed_without_answer(port)
        assert closed_without_answer(port)
        assert envoy.wait_stat("kafka_broker_0.rbac.denied", 2) >= 2
        assert envoy.stats()["cluster.kafka-broker-0.upstream_cx_total"] == 0


def test_rbac_lets_other_sources_through_and_counts_them(broker: BrokerProcess,
                                                         tmp_path: Path) -> None:
    port, admin = free_ports(2)
    config = write_config(tmp_path, "allow.yaml", "--broker", _route(broker, port),
                          "--deny-cidr", "10.0.0.0/8,192.168.0.0/16",
                          "--allow-cidr", "127.0.0.1/32", "--admin-port", str(admin),
                          "--access-log", "stdout")
    with running_envoy(config, admin) as envoy:
        conn = RawConnection(port)
        try:
            assert brokers_of(metadata(conn)) == [(0, "127.0.0.1", broker.port)]
        finally:
            conn.close()
        assert envoy.wait_stat("kafka_broker_0.rbac.allowed") >= 1
        assert envoy.wait_stat("kafka_broker_0.allow.rbac.allowed") >= 1
        assert envoy.stats().get("kafka_broker_0.rbac.denied", 0) == 0
        envoy.wait_for(lambda: any("upstream=kafka-broker-0/127.0.0.1:" in line
                                   for line in envoy.lines), 10, "an access log line")


def test_connection_limit_refuses_the_extra_connection(broker: BrokerProcess,
                                                        tmp_path: Path) -> None:
    port, admin = free_ports(2)
    config = write_config(tmp_path, "limit.yaml", "--broker", _route(broker, port),
                          "--max-connections", "1", "--admin-port", str(admin))
    with running_envoy(config, admin) as envoy:
        first = RawConnection(port)
        try:
            assert brokers_of(metadata(first))[0][0] == 0
            envoy.wait_stat("connection_limit.kafka_broker_0.active_connections", 1)
            assert closed_without_answer(port)
            assert envoy.wait_stat("connection_limit.kafka_broker_0.limited_connections") == 1
            assert brokers_of(metadata(first))[0][0] == 0  # the first one still works
        finally:
            first.close()
        envoy.wait_for(
            lambda: envoy.stats()["connection_limit.kafka_broker_0.active_connections"] == 0,
            10, "the first connection to close")
        again = RawConnection(port)
        try:
            assert brokers_of(metadata(again))[0][0] == 0
        finally:
            again.close()


def test_connection_rate_limit_refuses_connections_over_the_rate(broker: BrokerProcess,
                                                                 tmp_path: Path) -> None:
    port, admin = free_ports(2)
    config = write_config(tmp_path, "rate.yaml", "--broker", _route(broker, port),
                          "--connection-rate", "1/60", "--admin-port", str(admin))
    with running_envoy(config, admin) as envoy:
        first = RawConnection(port)
        try:
            assert brokers_of(metadata(first))[0][0] == 0
        finally:
            first.close()
        assert closed_without_answer(port)
        assert envoy.wait_stat("local_rate_limit.kafka_broker_0.rate_limited") >= 1


def _tls_connection(port: int, tls: TlsFiles, server_name: str = "localhost",
                    client_cert: bool = False) -> RawConnection:
    context = ssl.create_default_context(cafile=str(tls.ca))
    context.check_hostname = False  # the test certificate names localhost only
    if client_cert:
        context.load_cert_chain(str(tls.client_cert), str(tls.client_key))
    conn = RawConnection(port)
    conn.sock = context.wrap_socket(conn.sock, server_hostname=server_name)
    return conn


def test_client_certificates_required_at_envoy(broker: BrokerProcess, tmp_path: Path) -> None:
    tls = make_tls(tmp_path / "tls")
    port, admin = free_ports(2)
    config = write_config(tmp_path, "mtls.yaml", "--broker", _route(broker, port),
                          "--tls-cert", str(tls.cert), "--tls-key", str(tls.key),
                          "--tls-client-ca", str(tls.ca), "--admin-port", str(admin))
    with running_envoy(config, admin):
        conn = _tls_connection(port, tls, client_cert=True)
        try:
            assert brokers_of(metadata(conn))[0][0] == 0
        finally:
            conn.close()
        with pytest.raises((ssl.SSLError, ConnectionError)):
            anonymous = _tls_connection(port, tls)
            try:  # TLS 1.3: the refusal arrives with the first read
                metadata(anonymous)
            finally:
                anonymous.close()


def test_sni_routes_one_port_to_the_named_broker(broker: BrokerProcess,
                                                  tmp_path: Path) -> None:
    tls = make_tls(tmp_path / "tls")
    port, admin, dead = free_ports(3)
    config = write_config(tmp_path, "sni.yaml",
                          "--broker", f"0=kafka-0.test:{port}@127.0.0.1:{broker.port}",
                          "--broker", f"1=kafka-1.test:{port}@127.0.0.1:{dead}",
                          "--sni", "--listen-host", "127.0.0.1", "--tls-cert", str(tls.cert),
                          "--tls-key", str(tls.key), "--admin-port", str(admin))
    with running_envoy(config, admin) as envoy:
        conn = _tls_connection(port, tls, "kafka-0.test")
        try:
            assert brokers_of(metadata(conn))[0][0] == 0
        finally:
            conn.close()
        with pytest.raises((ssl.SSLError, ConnectionError)):  # broker 1 is down
            down = _tls_connection(port, tls, "kafka-1.test")
            try:
                metadata(down)
            finally:
                down.close()
        with pytest.raises((ssl.SSLError, ConnectionError)):  # no broker of that name
            _tls_connection(port, tls, "kafka-9.test").close()
        stats = envoy.stats()
        assert stats["cluster.kafka-broker-0.upstream_cx_total"] >= 1
        assert stats["cluster.kafka-broker-1.upstream_cx_connect_fail"] >= 1
        assert stats[f"listener.127.0.0.1_{port}.no_filter_chain_match"] >= 1
