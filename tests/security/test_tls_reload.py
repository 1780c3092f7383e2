"""TLS files rotated under a running broker: new connections get the new certificate and
trusted CAs (files checked as connections are accepted, and on SIGHUP); files that cannot
be loaded keep the previous certificate with one WARNING; and a TLS connection the broker
closes gives its per-IP slot back soon when the client never answers its close_notify."""

from __future__ import annotations

import base64
import logging
import shutil
import signal
import socket
import ssl
import struct
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from edge.certs import CertFiles, make_certs
from listeners.tls import TlsSettings, server_context
from listeners.tls_source import TlsContextSource
from tests.broker_process import BrokerProcess
from tests.group_helpers import wait_until
from tests.raw import RawConnection

RELOAD_WARNING = "cannot reload the TLS files"
POLL_S = 0.1


def der(pem: Path) -> bytes:
    """The DER bytes of the first certificate of a PEM file."""
    return x509.load_pem_x509_certificate(pem.read_bytes()).public_bytes(
        serialization.Encoding.DER)


def served(port: int) -> bytes:
    """The certificate the broker serves a new connection now (not verified)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), 5) as sock, \
            context.wrap_socket(sock) as tls:
        peer = tls.getpeercert(binary_form=True)
    assert peer is not None
    return peer


def answers(port: int, ca: Path, client: CertFiles | None = None) -> bool:
    """Whether a client trusting ``ca`` (presenting ``client``'s certificate) gets an
    ApiVersions answer over TLS."""
    conn = RawConnection(port, timeout=5)
    try:
        context = ssl.create_default_context(cafile=str(ca))
        if client is not None:
            assert client.client_cert is not None and client.client_key is not None
            context.load_cert_chain(client.client_cert, client.client_key)
        conn.sock = context.wrap_socket(conn.sock, server_hostname="localhost")
        answer = conn.call(ApiVersionsRequest[0](), 0, ApiVersionsResponse)
        return bool(answer.error_code == 0)
    except (OSError, ssl.SSLError):
        return False
    finally:
        conn.close()


def lists_topics(port: int, ca: Path, client: CertFiles | None = None) -> bool:
    """Whether confluent-kafka (librdkafka, OpenSSL) trusting only ``ca`` reads metadata."""
    config: dict[str, str | int | float | bool] = {
        "bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SSL",
        "ssl.ca.location": str(ca), "socket.timeout.ms": "5000", "log_level": "0"}
    if client is not None:
        config |= {"ssl.certificate.location": str(client.client_cert),
                   "ssl.key.location": str(client.client_key)}
    return len(AdminClient(config).list_topics(timeout=10).brokers) == 1


def copy(source: Path, target: Path) -> None:
    """Write ``source``'s bytes over ``target`` in place (same inode, as ``cp`` does)."""
    target.write_bytes(source.read_bytes())


def warnings_logged(broker: BrokerProcess) -> int:
    return sum(RELOAD_WARNING in line for line in broker.lines)


@pytest.fixture
def certs(tmp_path: Path) -> tuple[CertFiles, CertFiles, CertFiles]:
    """Two sets of certificates from two CAs (``old``, ``new``), and the files the broker
    is given (``live``, a copy of ``old``)."""
    old = make_certs(tmp_path / "old", client_cn="old-client", days=2, overwrite=True)
    new = make_certs(tmp_path / "new", client_cn="new-client", days=2, overwrite=True)
    shutil.copytree(tmp_path / "old", tmp_path / "live")
    live = CertFiles(*(tmp_path / "live" / path.name for path in old.written()))
    return old, new, live


def ssl_broker(tmp_path: Path, live: CertFiles, **more: str) -> BrokerProcess:
    return BrokerProcess(tmp_path / "data", {
        "kafkaListeners": "SSL://127.0.0.1:0,PLAINTEXT://127.0.0.1:0",
        "tlsCertificateFilePath": str(live.cert), "tlsKeyFilePath": str(live.key), **more,
    }).start()


def test_rotated_certificate_is_served_and_a_broken_one_is_not(
        tmp_path: Path, certs: tuple[CertFiles, CertFiles, CertFiles]) -> None:
    """An SSL and a SASL_SSL listener (their contexts differ, their files do not): a
    broken change is one WARNING, whichever listener's connections look at the files."""
    old, new, live = certs
    broker = ssl_broker(tmp_path, live, kafkaListeners="SSL://127.0.0.1:0,"
                        "SASL_SSL://127.0.0.1:0,PLAINTEXT://127.0.0.1:0",
                        tokenSecretKey="data:;base64," + base64.b64encode(b"k" * 32).decode())
    try:
        port, sasl_port = broker.ports["SSL"], broker.ports["SASL_SSL"]
        assert served(port) == served(sasl_port) == der(old.cert)
        # the key rotated before its certificate: they do not match, the old pair stays
        copy(new.key, live.key)
        wait_until(lambda: served(port) == der(old.cert) and warnings_logged(broker) > 0,
                   20, "the reload warning", interval=POLL_S)
        assert served(port) == served(sasl_port) == der(old.cert)
        assert answers(port, old.ca)
        time.sleep(1.5)  # past the next look at the unchanged files: no second warning
        assert served(port) == served(sasl_port) == der(old.cert)
        assert warnings_logged(broker) == 1, broker.log_text()
        assert "KEY_VALUES_MISMATCH" in broker.wait_for_log(RELOAD_WARNING)
        # the certificate follows: the new pair is served to new connections
        copy(new.cert, live.cert)
        wait_until(lambda: served(port) == der(new.cert), 20, "the new certificate",
                   interval=POLL_S)
        assert served(sasl_port) == der(new.cert)
        assert lists_topics(port, new.ca)
        assert not answers(port, old.ca)
        broker.wait_for_log(r"reloaded the TLS files of .* \(the files changed\)")
        assert warnings_logged(broker) == 1
        assert broker.alive()
    finally:
        broker.stop()


def test_sighup_reloads_at_once(tmp_path: Path,
                                certs: tuple[CertFiles, CertFiles, CertFiles]) -> None:
    old, new, live = certs
    broker = ssl_broker(tmp_path, live)
    try:
        port = broker.ports["SSL"]
        assert served(port) == der(old.cert)
        copy(new.cert, live.cert)
        copy(new.key, live.key)
        assert broker.proc is not None
        broker.proc.send_signal(signal.SIGHUP)  # no connection in between: only SIGHUP looks
        broker.wait_for_log(r"reloaded the TLS files of .* \(SIGHUP\)")
        assert served(port) == der(new.cert)
        assert lists_topics(port, new.ca)
        assert broker.alive()
    finally:
        broker.stop()


def test_rotated_trust_file_accepts_the_new_ca(
        tmp_path: Path, certs: tuple[CertFiles, CertFiles, CertFiles]) -> None:
    old, new, live = certs
    broker = ssl_broker(tmp_path, live, tlsTrustCertsFilePath=str(live.ca),
                        tlsRequireTrustedClientCertOnConnect="true")
    try:
        port = broker.ports["SSL"]
        assert answers(port, old.ca, old)
        assert not answers(port, old.ca, new)  # a client certificate of the new CA
        copy(new.ca, live.ca)  # the broker's own certificate stays the old one
        wait_until(lambda: answers(port, old.ca, new), 20,
                   "the new CA's client certificate accepted", interval=POLL_S)
        assert lists_topics(port, old.ca, new)
        assert not answers(port, old.ca, old)
    finally:
        broker.stop()


def test_closed_tls_connection_gives_its_slot_back_soon(
        tmp_path: Path, certs: tuple[CertFiles, CertFiles, CertFiles]) -> None:
    old, _new, live = certs
    broker = ssl_broker(tmp_path, live, maxConnectionsPerIp="2")
    try:
        context = ssl.create_default_context(cafile=str(old.ca))
        silent = context.wrap_socket(socket.create_connection(("127.0.0.1",
                                                               broker.ports["SSL"])),
                                     server_hostname="localhost")
        silent.sendall(struct.pack(">i", -5))  # a bad frame size: the broker closes it
        broker.wait_for_log("closing connection from .* on SSL: frame size")
        held = RawConnection(broker.ports["PLAINTEXT"])  # the second slot
        # the client never reads nor answers the close_notify: uvloop's default waited
        # 30 s for it, holding the slot
        wait_until(lambda: plain_answers(broker.ports["PLAINTEXT"]), 15,
                   "the closed TLS connection's slot", interval=0.5)
        held.close()
        silent.close()
    finally:
        broker.stop()


def plain_answers(port: int) -> bool:
    conn = RawConnection(port, timeout=3)
    try:
        return bool(conn.call(ApiVersionsRequest[0](), 0, ApiVersionsResponse).error_code == 0)
    except OSError:
        return False
    finally:
        conn.close()


def test_source_warns_once_per_failing_change(
        tmp_path: Path, certs: tuple[CertFiles, CertFiles, CertFiles],
        caplog: pytest.LogCaptureFixture) -> None:
    """In the test process: every failing state of the files is one WARNING however often
    it is looked at; a good state after it is served; a missing file fails like any."""
    _old, new, live = certs
    settings = TlsSettings(str(live.cert), str(live.key))
    source = TlsContextSource("test", lambda: server_context(settings),
                              (settings.certificate_file, settings.key_file),
                              check_seconds=0)
    first = source.current()
    assert source.current() is first  # unchanged files: the same context
    caplog.set_level(logging.WARNING, "listeners.tls_source")
    live.key.write_bytes(new.key.read_bytes()[:100])  # half written
    assert [source.current() for _ in range(3)] == [first] * 3
    live.key.unlink()
    assert source.current() is first
    copy(new.key, live.key)  # mismatched with the certificate
    assert source.current() is first
    assert len(caplog.records) == 3, caplog.text
    copy(new.cert, live.cert)
    fresh = source.current()
    assert fresh is not first and source.current() is fresh
    assert source.check("SIGHUP") and source.current() is not fresh  # forced
    assert len(caplog.records) == 3
