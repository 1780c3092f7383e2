"""Listeners behind a proxy that speaks the PROXY protocol v2 (``proxyProtocolTrustedAddresses``):
only the trusted addresses may connect, each connection starts with a header within the
deadline, and the client the header names is the connection's peer: the audit's client,
the per-address cap, the ACL host. The broker runs as a process; the tests send headers
over raw sockets, as Envoy would."""

from __future__ import annotations

import base64
import socket
import ssl
import struct
from pathlib import Path

import pytest
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from tests.broker_process import BrokerProcess, refused_to_start
from tests.proxy_headers import tlv, v2_header
from tests.raw import RawConnection
from tests.security.test_audit import read_audit
from tests.security.test_security_listeners import api_versions_ok, run_cli
from tests.security_helpers import make_tls

SECRET = b"proxy-test-secret-of-32-bytes!!!"


def proxied(port: int, client: tuple[str, int] | None, source: str = "127.0.0.1",
            after: bytes = b"") -> RawConnection:
    """A connection from ``source`` that starts with a header naming ``client`` (None:
    LOCAL) and ``after`` in the same segment."""
    conn = RawConnection(port, source=source)
    conn.sock.sendall(v2_header(client, tlvs=tlv(0x04, b"\x00" * 3)) + after)
    return conn


def api_versions_frame(conn: RawConnection) -> bytes:
    payload = conn.request_bytes(ApiVersionsRequest[0](), 0)
    return struct.pack(">i", len(payload)) + payload


def answered(conn: RawConnection) -> bool:
    """Whether the ApiVersions request sent behind the header is answered."""
    frame = conn.read_frame()
    return bool(ApiVersionsResponse[0].decode(frame[4:]).error_code == 0)


def warnings_with(broker: BrokerProcess, text: str) -> list[str]:
    return [line for line in broker.lines if text in line]


def test_only_trusted_senders_may_connect(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", {
        "kafkaListeners": "PLAINTEXT://127.0.0.1:0",
        "proxyProtocolTrustedAddresses": "PLAINTEXT:127.0.0.2+10.0.0.0/8",
    }).start()
    try:
        intruder = proxied(broker.port, ("10.1.2.3", 5555))  # from 127.0.0.1: not trusted
        assert intruder.closed_by_peer(5.0)
        intruder.close()
        broker.wait_for_log(r"WARNING .*closing connection from 127\.0\.0\.1:\d+ on PLAINTEXT: "
                            r"127\.0\.0\.1 is not a trusted proxy")
        # the trusted proxy's clients are served, the header and a frame in one segment
        envoy = RawConnection(broker.port, source="127.0.0.2")
        envoy.sock.sendall(v2_header(("10.1.2.3", 5555)) + api_versions_frame(envoy))
        assert answered(envoy)
        assert api_versions_ok(envoy)
        envoy.close()
        # and its own connections (LOCAL: health checks)
        health = proxied(broker.port, None, source="127.0.0.2")
        assert api_versions_ok(health)
        health.close()
        assert len(warnings_with(broker, "not a trusted proxy")) == 1
        assert broker.alive()
    finally:
        broker.stop()


def test_garbage_and_a_stalled_header_close_the_connection(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", {
        "kafkaListeners": "PLAINTEXT://127.0.0.1:0", "tlsHandshakeTimeoutMs": "500",
        "proxyProtocolTrustedAddresses": "PLAINTEXT:127.0.0.1",
    }).start()
    try:
        kafka = RawConnection(broker.port)  # a Kafka client straight to the broker
        kafka.sock.sendall(api_versions_frame(kafka))
        assert kafka.closed_by_peer(5.0)
        kafka.close()
        text = RawConnection(broker.port)  # version 1
        text.sock.sendall(b"PROXY TCP4 10.1.2.3 10.0.0.9 5555 9092\r\n")
        assert text.closed_by_peer(5.0)
        text.close()
        stalled = RawConnection(broker.port)
        stalled.sock.sendall(v2_header(("10.1.2.3", 5555))[:20])
        assert stalled.closed_by_peer(20.0)
        stalled.close()
        broker.wait_for_log(r"WARNING .*on PLAINTEXT: PROXY protocol header not complete "
                            r"within 0\.5 s")
        assert len(warnings_with(broker, "no PROXY protocol v2 signature")) == 2
        assert len(warnings_with(broker, "not complete within")) == 1
        good = proxied(broker.port, ("10.1.2.3", 5555))
        assert api_versions_ok(good)
        good.close()
        assert broker.alive() and "Traceback" not in broker.log_text()
    finally:
        broker.stop()


def test_the_carried_client_is_the_audits_and_the_per_address_caps(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", {
        "kafkaListeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        "proxyProtocolTrustedAddresses": "SASL_PLAINTEXT:127.0.0.1",
        "tokenSecretKey": "data:;base64," + base64.b64encode(SECRET).decode(),
        "maxConnectionsPerIp": "100", "maxConnectionsPerIpOverrides": "203.0.113.7:1",
    }).start()
    try:
        port = broker.ports["SASL_PLAINTEXT"]
        # a Metadata request before a login: a rejected connection, audited by client
        early = proxied(port, ("203.0.113.7", 4242), after=struct.pack(">ihhihi", 14, 3, 1, 7,
                                                                       -1, -1))
        assert early.closed_by_peer(5.0)
        early.close()
        events = read_audit(f"127.0.0.1:{broker.ports['PLAINTEXT']}",
                            {("connection", "rejected")})
        rejected = [e for e in events if e["outcome"] == "rejected"]
        assert [e["client"] for e in rejected] == ["203.0.113.7:4242"], events
        # the cap of 203.0.113.7 counts its connections through the proxy, not the proxy's
        held = proxied(port, ("203.0.113.7", 1))
        assert api_versions_ok(held)
        second = proxied(port, ("203.0.113.7", 2))
        assert second.closed_by_peer(5.0)
        second.close()
        broker.wait_for_log(r"refusing connection from 203\.0\.113\.7:2 on SASL_PLAINTEXT: 1 "
                            r"connections from 203\.0\.113\.7 is the limit")
        others = [proxied(port, ("203.0.113.8", n)) for n in range(3)]
        assert all(api_versions_ok(conn) for conn in others)
        for conn in [held, *others]:
            conn.close()
    finally:
        broker.stop()


class TlsAfterHeader:
    """A TLS client over a socket whose first segment is a header and the ClientHello."""

    def __init__(self, port: int, ca: Path, client: tuple[str, int]) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        context = ssl.create_default_context(cafile=str(ca))
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_hostname="localhost")
        pending = v2_header(client)
        while True:
            try:
                self.tls.do_handshake()
                done = True
            except ssl.SSLWantReadError:
                done = False
            self.sock.sendall(pending + self.outgoing.read())
            pending = b""
            if done:
                return
            self._receive()

    def _receive(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("closed by broker")
        self.incoming.write(data)

    def call(self, frame: bytes) -> bytes:
        """Send ``frame``; the response frame."""
        self.tls.write(frame)
        self.sock.sendall(self.outgoing.read())
        answer = b""
        while len(answer) < 4 or len(answer) < 4 + struct.unpack(">i", answer[:4])[0]:
            try:
                answer += self.tls.read(65536)
            except ssl.SSLWantReadError:
                self._receive()
        return answer[4:]


def test_a_tls_listener_reads_the_header_before_the_handshake(tmp_path: Path) -> None:
    tls = make_tls(tmp_path / "certs")
    broker = BrokerProcess(tmp_path / "data", {
        "kafkaListeners": "SSL://127.0.0.1:0", **tls.broker_settings(),
        "proxyProtocolTrustedAddresses": "SSL:127.0.0.1",
    }).start()
    try:
        client = TlsAfterHeader(broker.port, tls.ca, ("198.51.100.4", 777))
        answer = client.call(struct.pack(">ihhih", 10, 18, 0, 1, -1))  # ApiVersions v0
        assert answer[:4] == struct.pack(">i", 1)
        assert ApiVersionsResponse[0].decode(answer[4:]).error_code == 0
        client.sock.close()
        raw = socket.create_connection(("127.0.0.1", broker.port), timeout=10)
        with pytest.raises((ssl.SSLError, OSError)):  # no header: refused
            ssl.create_default_context(cafile=str(tls.ca)).wrap_socket(
                raw, server_hostname="localhost").close()
        raw.close()
        broker.wait_for_log(r"on SSL: no PROXY protocol v2 signature")
        assert broker.alive() and "Traceback" not in broker.log_text()
    finally:
        broker.stop()


@pytest.mark.parametrize(("value", "fragment"), [
    ("PLAINTEXT:envoy.local", "NAME:ADDRESS+ADDRESS"),
    ("127.0.0.1", "NAME:ADDRESS+ADDRESS"),
    ("OTHER:127.0.0.1", "no listener named 'OTHER'"),
    ("PLAINTEXT:127.0.0.1,plaintext:10.0.0.1", "named twice"),
])
def test_trusted_addresses_are_checked_at_load(tmp_path: Path, value: str,
                                               fragment: str) -> None:
    refused_to_start(run_cli(tmp_path, proxyProtocolTrustedAddresses=value), fragment)
