"""Envoy acceptance 4: source-CIDR rules, the connection limit and the connection rate
limit close connections at Envoy, and Envoy's admin stats count them; the access log
records each connection."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker_process import BrokerProcess
from tests.envoy_helpers import (
    brokers_of,
    closed_without_answer,
    free_ports,
    metadata,
    running_envoy,
    write_config,
)
from tests.raw import RawConnection


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
        assert envoy.stats().get("tcp.kafka_broker_0.upstream_cx_total", 0) == 0


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
