"""What a broker advertises and where it listens: an advertised wildcard stops start-up with
one line; a listener bound to every interface advertises the host's name in Metadata and
FindCoordinator (not the wildcard); ``[::1]`` serves the three clients over IPv6, and
``[::]`` is dual-stack: IPv4 clients come in too, seen by their IPv4 address."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import kafka
import pytest

from listeners.hosts import machine_host_name
from tests.broker_process import REPO, BrokerProcess
from tests.clients import (
    Rec,
    consume_aiokafka,
    consume_confluent,
    consume_kafka_python,
    create_topic,
    produce_aiokafka,
    produce_confluent,
    produce_kafka_python,
)
from tests.envoy_helpers import brokers_of, find_coordinator, metadata
from tests.group_helpers import wait_until
from tests.raw import RawConnection


@pytest.mark.parametrize("advertised", ["PLAINTEXT://0.0.0.0:9092", "PLAINTEXT://[::]:9092"])
def test_an_advertised_wildcard_stops_startup_with_one_line(tmp_path: Path,
                                                            advertised: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "edge.cli", "--set", f"dataDir={tmp_path}",
         "--set", "kafkaListeners=PLAINTEXT://0.0.0.0:0",
         "--set", f"kafkaAdvertisedListeners={advertised}"],
        cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    host = advertised.removeprefix("PLAINTEXT://").rsplit(":", 1)[0].strip("[]")
    assert result.stderr.splitlines() == [
        f"edge-broker: configuration error: invalid value {advertised!r} for "
        f"'kafkaAdvertisedListeners': listener {advertised!r}: advertised listeners cannot "
        f"use the nonroutable meta-address {host} (every interface), which clients cannot "
        "connect to; give a host name or IP address that clients can reach"]
    assert not (tmp_path / "meta.properties").exists()


@pytest.mark.parametrize("bind", ["0.0.0.0", "[::]"])
def test_a_broker_on_every_interface_advertises_the_host_name(tmp_path: Path,
                                                              bind: str) -> None:
    # it advertised 0.0.0.0 (or ::): every remote client was sent to itself
    name = machine_host_name()
    assert name is not None
    broker = BrokerProcess(tmp_path, {"kafkaListeners": f"PLAINTEXT://{bind}:0",
                                      "storageUrl": "memory://"}).start()
    try:
        assert f"(PLAINTEXT, advertised {name}:{broker.port})" in broker.lines[-1]
        conn = RawConnection(broker.port, "127.0.0.1")  # IPv4, also into [::]
        try:
            assert brokers_of(metadata(conn)) == [(0, name, broker.port)]
            coordinator = find_coordinator(conn, "a-group")
            assert coordinator.error_code == 0
            assert (coordinator.node_id, coordinator.host, coordinator.port) == (
                0, name, broker.port)
        finally:
            conn.close()
    finally:
        assert broker.stop() == 0


def _records(count: int) -> list[Rec]:
    now = int(time.time() * 1000)
    return [Rec(0, f"k{i}".encode(), f"v{i}".encode(), (), now + i) for i in range(count)]


def test_an_ipv6_loopback_listener_serves_the_three_clients(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path, {"kafkaListeners": "PLAINTEXT://[::1]:0",
                                      "storageUrl": "memory://"}).start()
    try:
        bootstrap = f"[::1]:{broker.port}"
        assert f"advertised ::1:{broker.port})" in broker.lines[-1]
        recs = _records(3)
        for client, produce, consume in [
                ("confluent", produce_confluent, consume_confluent),
                ("kafka-python", produce_kafka_python, consume_kafka_python),
                ("aiokafka", produce_aiokafka, consume_aiokafka)]:
            create_topic(bootstrap, client, 1)
            produce(bootstrap, client, recs, "none")
            got = consume(bootstrap, client, len(recs), 1)
            assert [g.rec for g in got] == recs, client
    finally:
        assert broker.stop() == 0


def test_the_ipv6_wildcard_is_dual_stack(tmp_path: Path) -> None:
    # [::] was bound IPv6-only: IPv4 clients were refused, and 0.0.0.0 may not share its port
    broker = BrokerProcess(tmp_path, {"kafkaListeners": "PLAINTEXT://[::]:0",
                                      "storageUrl": "memory://"}).start()
    try:
        recs = _records(3)
        create_topic(f"127.0.0.1:{broker.port}", "both", 1)
        produce_confluent(f"127.0.0.1:{broker.port}", "both", recs, "none")
        got = consume_kafka_python(f"[::1]:{broker.port}", "both", len(recs), 1)
        assert [g.rec for g in got] == recs
        # an IPv4 client of the dual-stack socket is seen by its IPv4 address (as by Java),
        # so that ACL hosts and quotas by IP match as on an IPv4 listener
        consumer = kafka.KafkaConsumer("both", bootstrap_servers=f"127.0.0.1:{broker.port}",
                                       group_id="g", auto_offset_reset="earliest")
        try:
            wait_until(lambda: bool(consumer.assignment()), 30, "the consumer to join",
                       step=lambda: consumer.poll(200))
            admin = kafka.KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{broker.port}")
            try:
                (member,) = admin.describe_groups(["g"])["g"]["members"]
            finally:
                admin.close()
        finally:
            consumer.close()
        assert member["client_host"] == "/127.0.0.1"  # not /::ffff:127.0.0.1
    finally:
        assert broker.stop() == 0
