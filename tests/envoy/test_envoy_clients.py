"""Envoy acceptance 2 and 3: clients bootstrap through Envoy only.

The broker's two SASL_PLAINTEXT listeners advertise two Envoys (per-listener advertised
addresses): one proxies plaintext, the other terminates TLS with a test CA's
certificate.  Metadata and FindCoordinator name Envoy's addresses; confluent-kafka
produces, consumes in a group and runs a transaction through Envoy with SASL/PLAIN
``token:`` logins and with OAUTHBEARER; a TLS client trusting the CA connects, one that
does not is refused.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.broker_process import BrokerProcess
from tests.clients import present
from tests.envoy_helpers import (
    EnvoyProcess,
    brokers_of,
    find_coordinator,
    metadata,
    write_config,
)
from tests.ports import free_ports
from tests.security_helpers import SecureConnection, TlsFiles, TokenIssuer, make_tls


@dataclass
class Edge:
    """A broker behind two Envoys: ``plain_port`` (plaintext) and ``tls_port`` (TLS)."""

    broker: BrokerProcess
    issuer: TokenIssuer
    tls: TlsFiles
    plain: EnvoyProcess
    tls_envoy: EnvoyProcess
    plain_port: int
    tls_port: int


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    root = Path(tmp_path_factory.mktemp("envoy-clients"))
    issuer = TokenIssuer("hmac", root)
    tls = make_tls(root / "tls")
    internal, internal_tls, plain_port, tls_port, admin, admin_tls = free_ports(6)
    settings = {
        "brokerId": "0",
        "kafkaListeners": f"PLAIN_EDGE://127.0.0.1:{internal},"
                          f"TLS_EDGE://127.0.0.1:{internal_tls}",
        "kafkaProtocolMap": "PLAIN_EDGE:SASL_PLAINTEXT,TLS_EDGE:SASL_PLAINTEXT",
        "kafkaAdvertisedListeners": f"PLAIN_EDGE://127.0.0.1:{plain_port},"
                                    f"TLS_EDGE://127.0.0.1:{tls_port}",
        "saslAllowedMechanisms": "PLAIN,OAUTHBEARER",
        "groupInitialRebalanceDelayMs": "0",
        "groupMinSessionTimeoutMs": "1000",
        **issuer.settings,
    }
    conf = root / "broker.properties"
    conf.write_text("".join(f"{k}={v}\n" for k, v in settings.items()), encoding="utf-8")
    broker = BrokerProcess(root / "data", settings)
    plain_config = write_config(root, "plain.yaml", "--config", str(conf), "--listener",
                                "PLAIN_EDGE", "--admin-port", str(admin),
                                "--access-log", "stdout")
    tls_config = write_config(root, "tls.yaml", "--config", str(conf), "--listener",
                              "TLS_EDGE", "--tls-cert", str(tls.cert), "--tls-key",
                              str(tls.key), "--admin-port", str(admin_tls))
    plain = EnvoyProcess(plain_config, admin)
    tls_envoy = EnvoyProcess(tls_config, admin_tls)
    try:
        broker.start()
        plain.start()
        tls_envoy.start()
        yield Edge(broker, issuer, tls, plain, tls_envoy, plain_port, tls_port)
    finally:
        plain.stop()
        tls_envoy.stop()
        if broker.alive():
            broker.stop()


def plain_client(edge: Edge, role: str = "app") -> dict[str, Any]:
    return {"bootstrap.servers": f"127.0.0.1:{edge.plain_port}",
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN",
            "sasl.username": "public", "sasl.password": "token:" + edge.issuer.token(role)}


def oauth_client(edge: Edge, role: str = "app") -> dict[str, Any]:
    def oauth_cb(_config: str) -> tuple[str, float]:
        return edge.issuer.token(role), time.time() + 3600

    return {"bootstrap.servers": f"127.0.0.1:{edge.plain_port}",
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "OAUTHBEARER",
            "oauth_cb": oauth_cb}


def tls_client(edge: Edge) -> dict[str, Any]:
    return {"bootstrap.servers": f"127.0.0.1:{edge.tls_port}",
            "security.protocol": "SASL_SSL", "ssl.ca.location": str(edge.tls.ca),
            "sasl.mechanisms": "PLAIN", "sasl.username": "public",
            "sasl.password": "token:" + edge.issuer.token("app")}


def create_topic(conf: dict[str, Any], name: str, partitions: int = 3) -> None:
    admin = AdminClient(conf)
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)


def produce(conf: dict[str, Any], topic: str, values: list[bytes]) -> None:
    producer = confluent_kafka.Producer({**conf, "acks": "all", "linger.ms": 5})
    errors: list[object] = []
    for i, value in enumerate(values):
        producer.produce(topic, value=value, partition=i % 3,
                         on_delivery=lambda err, _msg: errors.append(err) if err else None)
    assert producer.flush(30) == 0
    assert errors == []


def transaction(conf: dict[str, Any], topic: str, tid: str, values: list[bytes]) -> None:
    producer = confluent_kafka.Producer({**conf, "transactional.id": tid, "linger.ms": 5})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i, value in enumerate(values):
        producer.produce(topic, value=value, partition=i % 3)
    producer.commit_transaction(30)


def consume_group(conf: dict[str, Any], topic: str, group: str, count: int,
                  timeout: float = 45.0) -> list[bytes]:
    consumer = confluent_kafka.Consumer({
        **conf, "group.id": group, "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "isolation.level": "read_committed",
        "session.timeout.ms": 6000})
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < count and time.monotonic() < deadline:
            for msg in consumer.consume(100, 0.5):
                assert msg.error() is None, msg.error()
                got.append(present(msg.value()))
        consumer.commit(asynchronous=False)
        committed = consumer.committed(consumer.assignment(), timeout=10)
        assert sum(tp.offset for tp in committed if tp.offset > 0) >= count
    finally:
        consumer.close()
    return got


def test_metadata_and_find_coordinator_name_envoy(edge: Edge) -> None:
    conn = SecureConnection(edge.plain_port)
    try:
        conn.login("public", edge.issuer.token("app"))
        assert brokers_of(metadata(conn)) == [(0, "127.0.0.1", edge.plain_port)]
        for key_type, key in ((0, "some-group"), (1, "some-transactional-id")):
            found = find_coordinator(conn, key, key_type)
            assert found.error_code == 0, found
            assert (found.node_id, found.host, found.port) == (0, "127.0.0.1",
                                                               edge.plain_port)
    finally:
        conn.close()


@pytest.mark.parametrize("mechanism", ["PLAIN", "OAUTHBEARER"])
def test_produce_group_and_transaction_through_envoy(edge: Edge, mechanism: str) -> None:
    conf = plain_client(edge) if mechanism == "PLAIN" else oauth_client(edge)
    topic = f"through-envoy-{mechanism.lower()}"
    create_topic(conf, topic)
    before = edge.plain.stats()["tcp.kafka_broker_0.downstream_cx_total"]
    plain_values = [f"{mechanism}-plain-{i}".encode() for i in range(20)]
    txn_values = [f"{mechanism}-txn-{i}".encode() for i in range(10)]
    produce(conf, topic, plain_values)
    transaction(conf, topic, f"tid-{mechanism}", txn_values)
    got = consume_group(conf, topic, f"group-{mechanism}", 30)
    assert sorted(got) == sorted(plain_values + txn_values)
    assert edge.plain.stats()["tcp.kafka_broker_0.downstream_cx_total"] > before
    if mechanism == "OAUTHBEARER":
        edge.broker.wait_for_log(r"OAUTHBEARER token accepted: principal app")


def test_tls_at_envoy_for_clients_trusting_the_ca(edge: Edge) -> None:
    conf = tls_client(edge)
    create_topic(conf, "through-envoy-tls", 3)
    values = [f"tls-{i}".encode() for i in range(9)]
    produce(conf, "through-envoy-tls", values)
    assert sorted(consume_group(conf, "through-envoy-tls", "group-tls", 9)) == sorted(values)
    conn = SecureConnection(edge.tls_port, ca=edge.tls.ca)
    try:
        conn.login("public", edge.issuer.token("app"))
        assert brokers_of(metadata(conn)) == [(0, "127.0.0.1", edge.tls_port)]
    finally:
        conn.close()
    assert edge.tls_envoy.stats()[f"listener.127.0.0.1_{edge.tls_port}.ssl.handshake"] > 0


def test_tls_at_envoy_refuses_clients_not_trusting_the_ca(edge: Edge) -> None:
    untrusting = ssl.create_default_context()  # the system CAs, without the test CA
    with socket.create_connection(("127.0.0.1", edge.tls_port), timeout=5) as sock, \
            pytest.raises(ssl.SSLCertVerificationError):
        untrusting.wrap_socket(sock, server_hostname="localhost")
    conf = tls_client(edge)
    del conf["ssl.ca.location"]  # librdkafka's default trust store lacks the test CA
    admin = AdminClient({**conf, "log_level": 0})
    with pytest.raises(confluent_kafka.KafkaException) as refused:
        admin.list_topics(timeout=3)
    # the handshake fails (certificate verify failed): the only broker is down
    assert refused.value.args[0].code() == confluent_kafka.KafkaError._TRANSPORT, refused.value
    plaintext = socket.create_connection(("127.0.0.1", edge.tls_port), timeout=5)
    try:  # a plaintext Kafka request is no TLS hello: a TLS alert, then the close
        plaintext.sendall(b"\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\x00\x00")
        answer = b""
        while chunk := plaintext.recv(100):
            answer += chunk
        assert answer[:1] in (b"", b"\x15")  # 0x15: TLS alert record
    finally:
        plaintext.close()
