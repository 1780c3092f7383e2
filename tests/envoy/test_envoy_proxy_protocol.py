"""A real Envoy with ``envoy-config --proxy-protocol`` in front of a listener that takes the
PROXY protocol from it (``proxyProtocolTrustedAddresses``): the broker sees each client by
its own address, not Envoy's. The client connects from 127.0.0.2; Envoy reaches the broker
from 127.0.0.1."""

from __future__ import annotations

import struct
from pathlib import Path

from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from tests.broker_process import BrokerProcess
from tests.envoy_helpers import EnvoyProcess, write_config
from tests.ports import free_ports
from tests.raw import RawConnection
from tests.security.test_audit import read_audit
from tests.security_helpers import TokenIssuer


def test_a_client_behind_envoy_is_seen_by_its_own_address(tmp_path: Path) -> None:
    issuer = TokenIssuer("hmac", tmp_path)
    internal, edge_port, admin = free_ports(3)
    settings = {
        "brokerId": "0",
        "kafkaListeners": f"EDGE://127.0.0.1:{internal},PLAINTEXT://127.0.0.1:0",
        "kafkaProtocolMap": "EDGE:SASL_PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "kafkaAdvertisedListeners": f"EDGE://127.0.0.1:{edge_port}",
        "proxyProtocolTrustedAddresses": "EDGE:127.0.0.1",
        **issuer.settings,
    }
    conf = tmp_path / "broker.properties"
    conf.write_text("".join(f"{k}={v}\n" for k, v in settings.items()), encoding="utf-8")
    envoy = EnvoyProcess(write_config(tmp_path, "envoy.yaml", "--config", str(conf),
                                      "--listener", "EDGE", "--admin-port", str(admin),
                                      "--proxy-protocol"), admin)
    broker = BrokerProcess(tmp_path / "data", settings)
    try:
        broker.start()
        envoy.start()
        # Kafka through Envoy works: the header is read, the frames after it are the client's
        client = RawConnection(edge_port, source="127.0.0.2")
        answer = client.call(ApiVersionsRequest[0](), 0, ApiVersionsResponse)
        assert answer.error_code == 0
        client.close()
        # a Metadata request before a login is a rejected connection: audited by the
        # client's address and port, not Envoy's
        early = RawConnection(edge_port, source="127.0.0.2")
        own = early.sock.getsockname()
        early.sock.sendall(struct.pack(">ihhihi", 14, 3, 1, 7, -1, -1))
        assert early.closed_by_peer(10.0)
        early.close()
        events = read_audit(f"127.0.0.1:{broker.ports['PLAINTEXT']}",
                            {("connection", "rejected")})
        rejected = [e for e in events if e["outcome"] == "rejected"]
        assert [(e["client"], e["listener"]) for e in rejected] == [
            (f"{own[0]}:{own[1]}", "EDGE")], events
        assert own[0] == "127.0.0.2"
        broker.wait_for_log(r"from 127\.0\.0\.2:\d+")
        assert "not a trusted proxy" not in broker.log_text()
    finally:
        envoy.stop()
        if broker.alive():
            broker.stop()
