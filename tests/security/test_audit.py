"""Audit events: failed and successful logins, authorization denials and rejected connections
land in ``public/__kafka/__audit`` as JSON, readable by a Kafka client."""

from __future__ import annotations

import base64
import contextlib
import json
import re
import socket
import ssl
import struct
import time
from dataclasses import asdict
from pathlib import Path

import confluent_kafka
import jwt
import pytest
from confluent_kafka.admin import AdminClient
from kafka.admin import KafkaAdminClient
from kafka.protocol.metadata import MetadataRequest

from edge.audit import AuditEvent
from tests.broker_process import BrokerProcess
from tests.clients import create_topic, present
from tests.operations.test_metrics import sample, scrape
from tests.ports import free_port
from tests.security_helpers import (
    SASL_AUTHENTICATION_FAILED,
    SecureConnection,
    make_tls,
    plain_message,
)
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
                events.append(json.loads(present(msg.value())))
    consumer.close()
    return events


def test_audit_events(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path, {
        "kafkaListeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        "tokenSecretKey": "data:;base64," + base64.b64encode(SECRET).decode(),
        "failedAuthenticationDelayMs": "0",
        # librdkafka retries the forged login without delay: every failure here reported
        "auditDenialsPerWindow": "100000",
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


def test_a_failed_tls_handshake_is_a_rejected_connection(tmp_path: Path) -> None:
    """A client without the required certificate and a client speaking plain Kafka to a
    TLS port: each is one warning and one audit event with the reason."""
    tls = make_tls(tmp_path / "certs")
    broker = BrokerProcess(tmp_path / "data", {
        "kafkaListeners": "SSL://127.0.0.1:0,PLAINTEXT://127.0.0.1:0", **tls.broker_settings(),
        "tlsTrustCertsFilePath": str(tls.ca), "tlsRequireTrustedClientCertOnConnect": "true",
    }).start()
    try:
        port = broker.ports["SSL"]
        context = ssl.create_default_context(cafile=str(tls.ca))  # no client certificate
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                contextlib.suppress(ssl.SSLError, OSError), \
                context.wrap_socket(raw, server_hostname="localhost") as without:
            without.recv(10)  # TLS 1.3: the refusal comes after the client's Finished
        with socket.create_connection(("127.0.0.1", port), timeout=10) as plain:
            plain.sendall(struct.pack(">ihhih", 10, 18, 3, 1, -1))  # ApiVersions in clear
            with contextlib.suppress(OSError):
                assert plain.recv(10) == b""
        events: list[dict[str, object]] = []
        deadline = time.monotonic() + 20
        while len(events) < 2 and time.monotonic() < deadline:
            events = [e for e in read_audit(f"127.0.0.1:{broker.ports['PLAINTEXT']}",
                                            {("connection", "rejected")})
                      if e["listener"] == "SSL" and e["outcome"] == "rejected"]
        reasons = sorted(str(e["reason"]) for e in events)
        assert len(reasons) == 2, events
        assert all(r.startswith("TLS handshake failed: TLS error ") for r in reasons), reasons
        assert any("CERTIFICATE" in r for r in reasons), reasons
        assert all(e["kind"] == "connection" and e["client"] for e in events)
        warned = [line for line in broker.lines if "TLS handshake failed" in line]
        assert len(warned) == 2 and all(" WARNING " in line for line in warned), warned
        assert "Traceback" not in broker.log_text()
    finally:
        broker.stop()


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


def _two_listener_broker(tmp_path: Path, settings: dict[str, str]) -> BrokerProcess:
    """A broker with a PLAINTEXT and a SASL_PLAINTEXT listener taking this module's
    tokens, and ``settings``."""
    return BrokerProcess(tmp_path, {
        "kafkaListeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        "tokenSecretKey": "data:;base64," + base64.b64encode(SECRET).decode(), **settings,
    }).start()


def _bob(broker: BrokerProcess, **settings: int) -> KafkaAdminClient:
    """An admin client logged in as ``bob`` of tenant ``b`` (who may read nothing of
    tenant ``a``)."""
    token = jwt.encode({"sub": "bob", "exp": int(time.time()) + 600}, SECRET,
                       algorithm="HS256")
    return KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{broker.ports['SASL_PLAINTEXT']}",
                            security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                            sasl_plain_username="b", sasl_plain_password="token:" + token,
                            **settings)


def test_denials_of_one_request_naming_thousands_of_topics_are_bounded(tmp_path: Path) -> None:
    """One Metadata request (kafka-python's KafkaAdminClient) naming 2,000 topics of another
    tenant: 2,000 refused checks, but at most ``auditDenialsPerWindow`` denial events and log
    lines per window, and then one event and one line counting the ones left out."""
    broker = _two_listener_broker(tmp_path, {"auditDenialsPerWindow": "5",
                                             "auditDenialWindowMs": "3000"})
    try:
        bob = _bob(broker, request_timeout_ms=120_000)
        try:
            names = [f"a/default/x{i}" for i in range(2_000)]
            answered = bob.describe_topics(names)
        finally:
            bob.close()
        assert {t["error_code"] for t in answered} == {29}  # TOPIC_AUTHORIZATION_FAILED
        assert len(answered) == len(names)

        plain = f"127.0.0.1:{broker.ports['PLAINTEXT']}"

        def denials() -> tuple[list[dict[str, object]], int]:
            """bob's Metadata denial events, and how many they account for."""
            events = [e for e in read_audit(plain, {("authentication", "success")})
                      if e["outcome"] == "denied" and e["principal"] == "bob"
                      and e["api"] == "Metadata"]
            left_out = [re.match(r"(\d+) more denials left out", str(e["reason"]))
                        for e in events if e["resource"] is None]
            return events, sum(1 for e in events if e["resource"] is not None) + sum(
                int(match[1]) for match in left_out if match is not None)

        deadline = time.monotonic() + 60
        events, counted = denials()
        while counted < len(names) and time.monotonic() < deadline:
            time.sleep(0.5)
            events, counted = denials()
        assert counted == len(names), events
        written = [e for e in events if e["resource"] is not None]
        summaries = [e for e in events if e["resource"] is None]
        # one window in all but a very slow run: 5 events, then 1 counting 1,995
        assert summaries and len(written) <= 5 * len(summaries) + 5, events
        assert all(e["tenant"] == "b" and e["kind"] == "authorization" for e in events)
        assert all(str(e["resource"]).startswith("Topic:a/default/x") for e in written), written
        broker.wait_for_log(r"authorization denied: \d+ more denials of bob")
        lines = [line for line in broker.lines if "authorization denied: " in line]
        assert len(lines) == len(events), lines
    finally:
        broker.stop()


def test_failed_logins_of_one_host_are_bounded(tmp_path: Path) -> None:
    """A client with no credentials failing to log in 12 times, and sending a request
    before a login 3 times: at most ``auditDenialsPerWindow`` failure events and lines per
    window for its host and listener, then one event and one line counting the rest."""
    broker = BrokerProcess(tmp_path, {
        "kafkaListeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        "tokenSecretKey": "data:;base64," + base64.b64encode(SECRET).decode(),
        "failedAuthenticationDelayMs": "0",
        "auditDenialsPerWindow": "4", "auditDenialWindowMs": "3000",
    }).start()
    tries = 15
    try:
        port = broker.ports["SASL_PLAINTEXT"]
        for attempt in range(tries):
            conn = SecureConnection(port, timeout=30)
            try:
                if attempt % 5 == 4:  # no login at all
                    conn.send_frame(conn.request_bytes(MetadataRequest[1](topics=None), 1))
                    assert conn.closed_by_peer()
                    continue
                assert conn.handshake("PLAIN").error_code == 0
                answer = conn.authenticate(plain_message("t", f"token:forged-{attempt}"))
                assert answer.error_code == SASL_AUTHENTICATION_FAILED
            finally:
                conn.close()
        plain = f"127.0.0.1:{broker.ports['PLAINTEXT']}"

        def failures() -> tuple[list[dict[str, object]], int]:
            """The failure events, and how many failures they account for."""
            events = [e for e in read_audit(plain, {("authentication", "failure")})
                      if e["outcome"] in ("failure", "rejected")]
            left_out = [re.match(r"(\d+) more failed logins left out", str(e["reason"]))
                        for e in events]
            return events, sum(1 for match in left_out if match is None) + sum(
                int(match[1]) for match in left_out if match is not None)

        deadline = time.monotonic() + 60
        events, counted = failures()
        while counted < tries and time.monotonic() < deadline:
            time.sleep(0.5)
            events, counted = failures()
        assert counted == tries, events
        summaries = [e for e in events if "more failed logins" in str(e["reason"])]
        # one window in all but a very slow run: 4 events, then 1 counting 11
        assert summaries and len(events) - len(summaries) <= 4 * len(summaries) + 4, events
        assert all(e["listener"] == "SASL_PLAINTEXT" for e in events)
        broker.wait_for_log(r"authentication failed: \d+ more failed logins from 127\.0\.0\.1 "
                            "on SASL_PLAINTEXT left out")
        failed = [line for line in broker.lines if re.search(
            r"login from .* failed|closing connection from .*(authentication failed|"
            r"before SASL authentication)", line)]
        assert len(failed) <= 2 * (len(events) - len(summaries)), failed
    finally:
        broker.stop()


def test_rejected_connections_are_bounded_per_host_and_overall(tmp_path: Path) -> None:
    """Ten addresses each opening ten connections that are refused (five failing their
    TLS handshake, five sending a frame too large before a login): at most
    ``auditDenialsPerWindow`` events per host and listener, at most
    ``auditRejectionsPerWindow`` of every address together; the rest are counted into
    summary events, and the metric counts every one. (Each used to be an event: one
    client wrote 2,000 in 0.6 s.)"""
    tls = make_tls(tmp_path / "certs")
    metrics_port = free_port()
    broker = BrokerProcess(tmp_path / "data", {
        "kafkaListeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,"
                          "SASL_PLAINTEXT://127.0.0.1:0",
        "tokenSecretKey": "data:;base64," + base64.b64encode(SECRET).decode(),
        **tls.broker_settings(), "metricsPort": str(metrics_port),
        "auditDenialsPerWindow": "3", "auditRejectionsPerWindow": "12",
        "auditDenialWindowMs": "3000",
    }).start()
    hosts = [f"127.0.0.{i}" for i in range(2, 12)]
    total = 10 * len(hosts)
    try:
        started = time.monotonic()
        for host in hosts:
            for attempt in range(10):
                listener = "SSL" if attempt % 2 else "SASL_PLAINTEXT"
                with socket.create_connection(("127.0.0.1", broker.ports[listener]), timeout=10,
                                              source_address=(host, 0)) as sock:
                    sock.sendall(b"GET / HTTP/1.0\r\n\r\n" if listener == "SSL"
                                 else struct.pack(">i", 10_000_000))
                    with contextlib.suppress(OSError):
                        sock.recv(100)
        elapsed = time.monotonic() - started
        plain = f"127.0.0.1:{broker.ports['PLAINTEXT']}"

        def rejections() -> tuple[list[dict[str, object]], list[dict[str, object]], int]:
            """The events, the summaries among them, and how many rejections they count."""
            events = [e for e in read_audit(plain, {("connection", "rejected")})
                      if e["kind"] == "connection" and e["outcome"] == "rejected"]
            counts = [re.match(r"(\d+) more rejected connections left out", str(e["reason"]))
                      for e in events]
            summaries = [e for e, match in zip(events, counts, strict=True) if match]
            return events, summaries, len(events) - len(summaries) + sum(
                int(match[1]) for match in counts if match is not None)

        deadline = time.monotonic() + 60
        events, summaries, counted = rejections()
        while counted < total and time.monotonic() < deadline:
            time.sleep(0.5)
            events, summaries, counted = rejections()
        assert counted == total, events
        windows = 1 + int(elapsed // 3)
        assert len(events) - len(summaries) <= 12 * windows, events
        assert len(events) <= 13 * windows + 2 * len(hosts) * windows, events
        per_host: dict[tuple[str, str], int] = {}
        for event in events:
            if event not in summaries:
                key = (str(event["client"]).rsplit(":", 1)[0], str(event["listener"]))
                per_host[key] = per_host.get(key, 0) + 1
        assert max(per_host.values()) <= 3 * windows, per_host
        broker.wait_for_log(r"connection rejected: \d+ more rejected connections left out of "
                            r"the audit \(12 reported per 3 s from all addresses")
        assert sample(scrape(metrics_port), r"kop_server_rejected_connections_total\{.*\}") \
            == total
    finally:
        broker.stop()


def test_an_events_document_is_every_field_in_order() -> None:
    event = AuditEvent(kind="authentication", outcome="success", listener="SASL_PLAINTEXT",
                       client="127.0.0.1:5000", principal="alice", tenant="acme",
                       mechanism="PLAIN")
    document = event.document(1234)
    assert list(document.items()) == list((asdict(event) | {"time": 1234}).items())
    stamped = AuditEvent(kind="connection", outcome="rejected", listener="L", client="c",
                         reason="why", time=99)
    assert stamped.document(1234) == asdict(stamped)


@pytest.mark.parametrize("window_ms", ["10000", "100"])
def test_repeated_denials_are_written_once_a_second_and_counted(tmp_path: Path,
                                                               window_ms: str) -> None:
    """A client repeating one refused request: identical denials within a second of the
    first written are left out of the audit, and counted in one more event at the end of
    that second (``count``), so the events' counts sum to the denials. With denial windows
    shorter than that second (100 ms, one event each), the windows' summary events, which
    count what their window left out, are written as they are, never folded into the
    second's count (that lost their counts)."""
    broker = _two_listener_broker(tmp_path, {
        "auditDenialsPerWindow": "100000" if window_ms == "10000" else "1",
        "auditDenialWindowMs": window_ms})
    try:
        bob = _bob(broker)
        try:
            for request in range(30):
                (answer,) = bob.describe_topics(["a/default/x"])
                assert answer["error_code"] == 29  # TOPIC_AUTHORIZATION_FAILED
                if window_ms == "100" and request % 3 == 2:
                    time.sleep(0.15)  # past a window: its summary is written
        finally:
            bob.close()
        plain = f"127.0.0.1:{broker.ports['PLAINTEXT']}"

        def denials() -> list[dict[str, object]]:
            return [e for e in read_audit(plain, {("authentication", "success")})
                    if e["outcome"] == "denied" and e["principal"] == "bob"]

        events = denials()
        deadline = time.monotonic() + 30
        while sum(int(str(e["count"])) for e in events) < 30 and time.monotonic() < deadline:
            time.sleep(0.5)
            events = denials()
        time.sleep(1.5)  # anything counted twice would be written by now
        events = denials()
        assert sum(int(str(e["count"])) for e in events) == 30, events
        assert len(events) < 30, events  # the first code: a few events of count 1
        assert all(e["api"] == "Metadata" and e["resource"] in ("Topic:a/default/x", None)
                   for e in events), events
    finally:
        broker.stop()
