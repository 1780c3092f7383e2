"""SSL listeners with client certificates: required certificates are enforced, and the
certificate's common name is the principal that authorization sees."""

from __future__ import annotations

import json
import time
from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.broker_process import BrokerProcess
from tests.security_helpers import TlsFiles, make_tls


def ssl_config(port: int, tls: TlsFiles, with_cert: bool) -> dict[str, str]:
    config = {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SSL",
              "ssl.ca.location": str(tls.ca), "socket.timeout.ms": "5000"}
    if with_cert:
        config |= {"ssl.certificate.location": str(tls.client_cert),
                   "ssl.key.location": str(tls.client_key)}
    return config


@pytest.fixture
def tls(tmp_path: Path) -> TlsFiles:
    return make_tls(tmp_path / "certs")


def test_required_client_certificate(tmp_path: Path, tls: TlsFiles) -> None:
    broker = BrokerProcess(tmp_path / "data", {
        "kafkaListeners": "SSL://127.0.0.1:0", **tls.broker_settings(),
        "tlsTrustCertsFilePath": str(tls.ca), "tlsRequireTrustedClientCertOnConnect": "true",
    }).start()
    try:
        with_cert = AdminClient(ssl_config(broker.port, tls, True))
        with_cert.create_topics([NewTopic("mtls", 1, 1)])["mtls"].result(10)
        producer = confluent_kafka.Producer(ssl_config(broker.port, tls, True))
        producer.produce("mtls", b"over mutual TLS")
        assert producer.flush(10) == 0
        without = AdminClient(ssl_config(broker.port, tls, False))
        with pytest.raises(confluent_kafka.KafkaException):
            without.list_topics(timeout=3)
        assert broker.alive()
    finally:
        broker.stop()


def test_certificate_common_name_is_the_principal(tmp_path: Path, tls: TlsFiles) -> None:
    broker = BrokerProcess(tmp_path / "data", {
        "kafkaListeners": "SSL://127.0.0.1:0,PLAINTEXT://127.0.0.1:0", **tls.broker_settings(),
        "tlsTrustCertsFilePath": str(tls.ca), "tlsRequireTrustedClientCertOnConnect": "true",
        "authorizationEnabled": "true", "superUserRoles": "ANONYMOUS",  # the plain listener
    }).start()
    try:
        admin = AdminClient(ssl_config(broker.ports["SSL"], tls, True))
        with pytest.raises(confluent_kafka.KafkaException) as denied:
            admin.create_topics([NewTopic("not-allowed", 1, 1)])["not-allowed"].result(10)
        assert denied.value.args[0].name() == "TOPIC_AUTHORIZATION_FAILED"
        consumer = confluent_kafka.Consumer({
            "bootstrap.servers": f"127.0.0.1:{broker.ports['PLAINTEXT']}",
            "group.id": "audit-reader", "enable.auto.commit": False})
        consumer.assign([confluent_kafka.TopicPartition("public/__kafka/__audit", 0, 0)])
        events: list[dict[str, object]] = []
        deadline = time.monotonic() + 15
        while not any(e.get("principal") == "client-role" for e in events) \
                and time.monotonic() < deadline:
            events += [json.loads(m.value()) for m in consumer.consume(50, 1.0)
                       if m.error() is None]
        consumer.close()
        assert any(e["principal"] == "client-role" and e["outcome"] == "denied"
                   for e in events), events
    finally:
        broker.stop()
