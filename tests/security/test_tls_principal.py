"""The principal of a client certificate on SSL listeners (``tlsPrincipal``): in CN mode a
certificate without exactly one common name is a failed login, never ANONYMOUS (the
principal of a connection without a certificate); in DN mode the whole subject, RFC 4514.
SASL_SSL listeners ask for no client certificate, and TLS spoken to a plain-text listener
is named as such."""

from __future__ import annotations

import ssl
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from listeners.tls import TlsConfigError, TlsSettings, server_context
from tests.broker_process import BrokerProcess
from tests.security_helpers import ClientAuthority, Login, TokenIssuer, audit_events, create_topic

ClientConfig = dict[str, str | int | float | bool]


def ssl_client(port: int, authority: ClientAuthority,
               cert: tuple[Path, Path] | None) -> ClientConfig:
    config: ClientConfig = {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SSL",
              "ssl.ca.location": str(authority.ca), "socket.timeout.ms": "5000"}
    if cert is not None:
        config |= {"ssl.certificate.location": str(cert[0]),
                   "ssl.key.location": str(cert[1])}
    return config


def create_error(config: ClientConfig, topic: str) -> str | None:
    """The error name of a CreateTopics of ``topic`` (None: created); ``_REFUSED`` when
    the client could not get an answer at all."""
    client = AdminClient(config)
    try:
        client.create_topics([NewTopic(topic, 1, 1)], request_timeout=8)[topic].result(15)
    except confluent_kafka.KafkaException as exc:
        name = exc.args[0].name()
        return name if name.endswith("AUTHORIZATION_FAILED") else "_REFUSED"
    except FutureTimeout:
        return "_REFUSED"
    return None


def mtls_broker(tmp_path: Path, authority: ClientAuthority, **settings: str) -> BrokerProcess:
    """SSL listener requiring certificates; a PLAINTEXT one for internal readers, trusted
    as ``superUserRoles=ANONYMOUS`` (the documented pattern)."""
    return BrokerProcess(tmp_path / "data", {
        "kafkaListeners": "SSL://127.0.0.1:0,PLAINTEXT://127.0.0.1:0",
        **authority.broker_settings(), "authorizationEnabled": "true",
        "superUserRoles": "ANONYMOUS", "allowAutoTopicCreation": "false", **settings,
    }).start()


def test_certificate_without_one_common_name_is_refused(tmp_path: Path) -> None:
    authority = ClientAuthority(tmp_path / "certs")
    no_cn = authority.client("no-cn", (NameOID.ORGANIZATION_NAME, "Partner"))
    two_cns = authority.client("two-cns", (NameOID.COMMON_NAME, "admin"),
                               (NameOID.ORGANIZATIONAL_UNIT_NAME, "x"),
                               (NameOID.COMMON_NAME, "mallory"))
    bob = authority.client("bob", (NameOID.COMMON_NAME, "bob"))
    broker = mtls_broker(tmp_path, authority)
    try:
        port = broker.ports["SSL"]
        # before: ANONYMOUS (no CN) or admin (the first CN), a superuser: CREATED
        assert create_error(ssl_client(port, authority, no_cn), "partner") == "_REFUSED"
        assert create_error(ssl_client(port, authority, two_cns), "mallory") == "_REFUSED"
        assert create_error(ssl_client(port, authority, bob), "bob") == \
            "TOPIC_AUTHORIZATION_FAILED"  # one CN: the principal bob, as before
        plain = f"127.0.0.1:{broker.ports['PLAINTEXT']}"
        topics = AdminClient({"bootstrap.servers": plain}).list_topics(timeout=10).topics
        assert "partner" not in topics and "mallory" not in topics
        refused = [e for e in audit_events(plain)
                   if e["kind"] == "authentication" and e["mechanism"] == "SSL"]
        assert {e["outcome"] for e in refused} == {"failure"}
        reasons = " ".join(str(e["reason"]) for e in refused)
        assert "'O=Partner' has no common name" in reasons
        assert "'CN=mallory,OU=x,CN=admin' has 2 common names" in reasons
        lines = [line for line in broker.lines if "client certificate from" in line]
        assert lines and all("refused" in line and "on SSL" in line for line in lines)
        assert broker.alive()
    finally:
        broker.stop()


def test_dn_mode_names_the_whole_subject(tmp_path: Path) -> None:
    authority = ClientAuthority(tmp_path / "certs")
    app = authority.client("app", (NameOID.ORGANIZATION_NAME, "Acme"),
                           (NameOID.COMMON_NAME, "app"))
    partner = authority.client("partner", (NameOID.ORGANIZATION_NAME, "Partner"))
    broker = mtls_broker(tmp_path, authority, tlsPrincipal="DN")
    try:
        plain = AdminClient({"bootstrap.servers": f"127.0.0.1:{broker.ports['PLAINTEXT']}"})
        binding = AclBinding(ResourceType.TOPIC, "dn-topic", ResourcePatternType.LITERAL,
                             "User:CN=app,O=Acme", "*", AclOperation.ALL,
                             AclPermissionType.ALLOW)
        plain.create_acls([binding])[binding].result(10)
        port = broker.ports["SSL"]
        assert create_error(ssl_client(port, authority, app), "dn-topic") is None
        # no CN is no refusal in DN mode, and no superuser either: the principal O=Partner
        assert create_error(ssl_client(port, authority, partner), "dn-topic2") == \
            "TOPIC_AUTHORIZATION_FAILED"
        denied = [e for e in audit_events(f"127.0.0.1:{broker.ports['PLAINTEXT']}")
                  if e["outcome"] == "denied"]
        assert {e["principal"] for e in denied} == {"O=Partner"}
    finally:
        broker.stop()


def test_sasl_ssl_listener_asks_for_no_client_certificate(tmp_path: Path) -> None:
    """tlsRequireTrustedClientCertOnConnect is for SSL listeners (KIP-684): a SASL_SSL
    client without a certificate logs in (before: the TLS handshake was refused)."""
    authority = ClientAuthority(tmp_path / "certs")
    issuer = TokenIssuer("hmac", tmp_path)
    broker = BrokerProcess(tmp_path / "data", {
        "kafkaListeners": "INTERNAL://127.0.0.1:0,EXTERNAL://127.0.0.1:0",
        "kafkaProtocolMap": "INTERNAL:SSL,EXTERNAL:SASL_SSL",
        **authority.broker_settings(), **issuer.settings}).start()
    try:
        login = Login(f"127.0.0.1:{broker.ports['EXTERNAL']}", "SASL_SSL", "acme",
                      issuer.token(), authority.ca)
        create_topic(login, "over-sasl-ssl")
        producer = confluent_kafka.Producer(login.confluent())
        producer.produce("over-sasl-ssl", b"no client certificate")
        assert producer.flush(10) == 0
        without = AdminClient(ssl_client(broker.ports["INTERNAL"], authority, None))
        with pytest.raises(confluent_kafka.KafkaException):  # SSL still requires one
            without.list_topics(timeout=3)
        assert broker.alive()
    finally:
        broker.stop()


def test_tls_on_a_plaintext_listener_is_named(tmp_path: Path) -> None:
    authority = ClientAuthority(tmp_path / "certs")
    broker = BrokerProcess(tmp_path / "data", {"kafkaListeners": "PLAINTEXT://127.0.0.1:0"}
                           ).start()
    try:
        client = AdminClient(ssl_client(broker.port, authority, None))
        with pytest.raises(confluent_kafka.KafkaException):
            client.list_topics(timeout=3)
        line = broker.wait_for_log("TLS on a listener without TLS")
        assert "outside 1.." not in line and "on PLAINTEXT" in line
        assert broker.alive()
    finally:
        broker.stop()


def test_encrypted_key_is_a_configuration_error(tmp_path: Path) -> None:
    """No pass phrase prompt on the terminal (a broker under a tty waited there)."""
    authority = ClientAuthority(tmp_path / "certs")
    key = serialization.load_pem_private_key(authority.key.read_bytes(), None)
    assert isinstance(key, rsa.RSAPrivateKey)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret")))
    with pytest.raises(TlsConfigError, match="encrypted keys are not supported"):
        server_context(TlsSettings(str(authority.cert), str(encrypted)))


def test_no_renegotiation(tmp_path: Path) -> None:
    """Renegotiation is off in the context itself, whatever OpenSSL's build allows."""
    authority = ClientAuthority(tmp_path / "certs")
    context = server_context(TlsSettings(str(authority.cert), str(authority.key)))
    assert context.options & ssl.OP_NO_RENEGOTIATION
