"""Audit events: failed and successful logins, authorization denials and rejected connections
land in ``public/__kafka/__audit`` as JSON, readable by a Kafka client."""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import struct
import time
from pathlib import Path

import confluent_kafka
import jwt
from confluent_kafka.admin import AdminClient

from tests.broker_process import BrokerProcess
from tests.clients import create_topic
from tests.ports import free_port
from tests.test_metrics import sample, scrape
from tests.txn_helpers import wait_until

SECRET = b"audit-test-secret-of-32-bytes!!!"


def read_audit(bootstrap: str, until: set[tuple[str, str]]) -> list[dict[str, object]]:
    """Audit events from the start until every (kind, outcome) in ``until`` was seen."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "audit",
                                         "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition("public/__kafka/__audit", 0, 0)])
    events: list[dict[str, object]] = []
    deadline = time.monotonic() + 20
    while not until <= {(str(e["kind"]), str(e["outcome"])) for e in events} \
            and time.monotonic() < deadline:
        for msg in consumer.consume(100, 1.0):
            if msg.error() is None:
                events.append(json.loads(msg.value()))
    consumer.close()
    return events


def test_audit_events(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path, {
        "kafkaListeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        "tokenSecretKey": "data:;base64," + base64.b64encode(SECRET).decode(),
        "failedAuthenticationDelayMs": "0",
    }).start()
    try:
        plain = f"127.0.0.1:{broker.ports['PLAINTEXT']}"
        sasl = f"127.0.0.1:{broker.ports['SASL_PLAINTEXT']}"
        create_topic(plain, "secret-data", 1)  # public/default/secret-data
        good = jwt.encode({"sub": "mallory", "exp": int(time.time()) + 600}, SECRET,
                          algorithm="HS256")
        for password in ("token:forged", "token:" + good):
            admin = AdminClient({"bootstrap.servers": sasl, "security.protocol": "SASL_PLAINTEXT",
                                 "sasl.mechanisms": "PLAIN", "sasl.username": "evil",
                                 "sasl.password": password})
            with contextlib.suppress(confluent_kafka.KafkaException, TimeoutError):
                admin.describe_configs([confluent_kafka.admin.ConfigResource(
                    "topic", "public/default/secret-data")])[
                    confluent_kafka.admin.ConfigResource(
                        "topic", "public/default/secret-data")].result(5)
        with socket.create_connection(("127.0.0.1", broker.ports["SASL_PLAINTEXT"])) as sock:
            sock.sendall(struct.pack(">ihhihi", 14, 3, 1, 7, -1, -1))  # Metadata before login
            sock.settimeout(5)
            assert sock.recv(10) == b""
        events = read_audit(plain, {("authentication", "failure"), ("authorization", "denied"),
                                    ("authentication", "success"), ("connection", "rejected")})
        kinds = [(e["kind"], e["outcome"]) for e in events]
        assert ("authentication", "failure") in kinds
        assert ("authentication", "success") in kinds
        assert ("connection", "rejected") in kinds
        denied = [e for e in events if e["outcome"] == "denied"]
        assert denied and denied[0]["principal"] == "mallory"
        assert denied[0]["tenant"] == "evil"
        assert "public/default/secret-data" in str(denied[0]["resource"])
        failure = next(e for e in events if e["outcome"] == "failure")
        assert failure["mechanism"] == "PLAIN" and failure["reason"]
        assert all(e["listener"] == "SASL_PLAINTEXT" and e["time"] for e in events)
    finally:
        broker.stop()


def test_audit_can_be_disabled(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path, {"auditEnabled": "false",
                                      "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0",
                                      "tokenSecretKey": "data:;base64,"
                                      + base64.b64encode(SECRET).decode()}).start()
    try:
        with socket.create_connection(("127.0.0.1", broker.port)) as sock:
            sock.sendall(struct.pack(">ihhih", 10, 3, 1, 7, -1))
            sock.settimeout(5)
            assert sock.recv(10) == b""
        broker.stop()
        assert not list(tmp_path.rglob("__audit"))
    finally:
        broker.kill()


def test_audit_events_follow_the_fsync_policy(tmp_path: Path) -> None:
    """The audit topic is appended through the same path as produce: with
    flushIntervalMessages=1 each event is fsynced, though nothing else is written."""
    metrics_port = free_port()
    broker = BrokerProcess(tmp_path / "data", {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0",
        "tokenSecretKey": "data:;base64," + base64.b64encode(SECRET).decode(),
        "failedAuthenticationDelayMs": "0", "metricsPort": str(metrics_port),
        "flushIntervalMessages": "1", "flushIntervalMs": "3600000",
    }).start()
    try:
        broker.wait_for_log(rf"metrics on http://127.0.0.1:{metrics_port}/metrics")
        fsyncs = sample(scrape(metrics_port), "kop_server_fsync_seconds_count")
        admin = AdminClient({"bootstrap.servers": broker.bootstrap,
                             "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN",
                             "sasl.username": "evil", "sasl.password": "token:forged"})
        with contextlib.suppress(confluent_kafka.KafkaException):
            admin.list_topics(timeout=5)
        wait_until(lambda: sample(scrape(metrics_port), "kop_server_fsync_seconds_count")
                   > fsyncs, 20, "an fsync of the audit topic")
    finally:
        broker.stop()
