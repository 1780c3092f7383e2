"""The xds-server against hostile clients, and its guarded doors.

A plain gRPC client stands for whoever reaches the gRPC port: its NACK messages and node
ids reach one bounded, escaped log line and a bounded status entry, forgotten once its
stream closes; a node id beyond 256 bytes is refused; one address cannot hold every
stream slot, so a real Envoy from another address still gets its listeners.  With mutual
TLS only a client holding a certificate of the given CA gets a stream (a real Envoy, from
a bootstrap written by ``envoy-config --xds ... --xds-tls-cert``); the admin endpoint
wants its token when given one, and a non-loopback address needs mTLS or a token.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import grpc
import pytest
import yaml

from edge.envoy.ads import MAX_NODE_ID_BYTES, TEXT_LIMIT
from edge.envoy.snapshot import CLUSTER_TYPE, LISTENER_TYPE
from edge.envoy.source import PlanSource
from edge.envoy.xds_server import XdsServer
from tests.envoy_helpers import AdsClient, EnvoyProcess, XdsProcess, envoy_config
from tests.ports import free_ports
from tests.security_helpers import make_tls

_UNSERVED = "type.googleapis.com/nothing.served.Here"
"""A type this server does not serve: a stream asking for it is never answered."""


def _wait(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def _brokers_file(directory: Path) -> Path:
    envoy_port, internal = free_ports(2)
    path = directory / "brokers.txt"
    path.write_text(f"0=127.0.0.1:{envoy_port}@127.0.0.1:{internal}\n")
    return path


@pytest.fixture
def xds(tmp_path: Path) -> Iterator[XdsProcess]:
    process = XdsProcess("--brokers-file", str(_brokers_file(tmp_path))).start()
    try:
        yield process
    finally:
        process.stop()


def test_a_nack_message_cannot_forge_a_log_line_and_is_bounded(xds: XdsProcess) -> None:
    forged = "2026-01-01 00:00:00,000 INFO edge.envoy.xds: xds: ACK from node prod: forged"
    client = AdsClient(xds.grpc_port, node="hostile")
    try:
        client.send(CLUSTER_TYPE)
        first = client.receive()
        client.send(CLUSTER_TYPE, "", first.nonce, error=f"bad\n{forged}\n" + "x" * 100_000)
        line = xds.wait_for_log(r"NACK from node hostile")
        status = xds.status()
    finally:
        client.close()
    assert not any(entry.startswith("2026-01-01") for entry in xds.lines), xds.lines
    assert "bad\\n2026-01-01" in line and "more characters]" in line
    assert max(len(entry) for entry in xds.lines) < 2 * TEXT_LIMIT
    message = status["nodes"]["hostile"]["rejected"]["clusters"]["message"]
    assert message.startswith("bad\\n2026") and len(message) < TEXT_LIMIT + 40


def test_node_ids_are_bounded_and_a_closed_node_is_forgotten(xds: XdsProcess) -> None:
    for node in ("n" * (MAX_NODE_ID_BYTES + 1), "é" * 200, "x" * (2 << 20), ""):
        client = AdsClient(xds.grpc_port, node=node)
        try:
            client.send(CLUSTER_TYPE)
            with pytest.raises(grpc.RpcError) as refused:
                client.receive()
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        finally:
            client.close()
    longest = "n" * MAX_NODE_ID_BYTES
    client = AdsClient(xds.grpc_port, node=longest)
    try:
        client.send(CLUSTER_TYPE)
        assert client.receive().type_url == CLUSTER_TYPE
        assert list(xds.status()["nodes"]) == [longest]
    finally:
        client.close()
    _wait(lambda: xds.status()["nodes"] == {})
    xds.wait_for_log(r"xds: node n+ disconnected")
    assert max(len(entry) for entry in xds.lines) < 2 * TEXT_LIMIT


def _envoy_from(directory: Path, xds_port: int, admin_port: int, source: str = "127.0.0.1",
                *tls: str) -> EnvoyProcess:
    """A real Envoy on ``envoy-config --xds`` whose connection to the xds-server leaves
    from address ``source`` (all of 127/8 is this host)."""
    bootstrap = yaml.safe_load(envoy_config(
        "--xds", f"127.0.0.1:{xds_port}", "--admin-port", str(admin_port), *tls))
    xds_cluster = bootstrap["static_resources"]["clusters"][0]
    xds_cluster["upstream_bind_config"] = {"source_address": {"address": source,
                                                              "port_value": 0}}
    path = directory / "dynamic.yaml"
    path.write_text(yaml.safe_dump(bootstrap, sort_keys=False))
    return EnvoyProcess(path, admin_port)


def _node_count_is(server: XdsServer, count: int) -> bool:
    return len(server.status_dict()["nodes"]) == count


def test_one_address_cannot_take_every_stream_from_envoys(tmp_path: Path) -> None:
    # the server holds 3 streams; a client holding them all used to lock every Envoy out
    server = XdsServer(PlanSource(brokers_file=str(_brokers_file(tmp_path))),
                       ("127.0.0.1", 0), ("127.0.0.1", 0), poll_interval=3600,
                       max_streams=3, max_streams_per_peer=2)
    server.start()
    hostile = [AdsClient(server.grpc_port, node=f"hostile-{i}") for i in range(3)]
    envoy = _envoy_from(tmp_path, server.grpc_port, free_ports(1)[0], "127.0.0.2")
    try:
        for count, client in enumerate(hostile[:2], 1):  # in turn: the third is refused
            client.send(_UNSERVED)
            _wait(partial(_node_count_is, server, count))
        hostile[2].send(_UNSERVED)
        with pytest.raises(grpc.RpcError) as refused:
            hostile[2].receive()
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        _wait(lambda: len(server.status_dict()["nodes"]) == 2)
        envoy.start(listeners=1)  # from 127.0.0.2: its own share of the streams
        _wait(lambda: "edge-broker-envoy" in server.status_dict()["nodes"])
        assert server.status_dict()["nodes"]["edge-broker-envoy"]["acked"].keys() == {
            "clusters", "listeners"}
    finally:
        envoy.stop()
        for client in hostile:
            client.close()
        server.stop()


def test_envoy_gets_its_config_over_mutual_tls_and_nobody_else_does(tmp_path: Path) -> None:
    tls = make_tls(tmp_path / "tls")
    xds = XdsProcess("--brokers-file", str(_brokers_file(tmp_path)),
                     "--xds-tls-cert", str(tls.cert), "--xds-tls-key", str(tls.key),
                     "--xds-client-ca", str(tls.ca)).start()
    envoy = _envoy_from(tmp_path, xds.grpc_port, free_ports(1)[0], "127.0.0.1",
                        "--xds-tls-cert", str(tls.client_cert), "--xds-tls-key",
                        str(tls.client_key), "--xds-ca", str(tls.ca))
    ca = tls.ca.read_bytes()
    strangers = [
        AdsClient(xds.grpc_port, node="plain"),
        AdsClient(xds.grpc_port, node="no-client-cert",
                  credentials=grpc.ssl_channel_credentials(ca)),
    ]
    try:
        envoy.start(listeners=1)
        _wait(lambda: list(xds.status()["nodes"]) == ["edge-broker-envoy"])
        for stranger in strangers:
            stranger.send(LISTENER_TYPE)
            with pytest.raises(grpc.RpcError) as refused:
                stranger.receive()
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert list(xds.status()["nodes"]) == ["edge-broker-envoy"]
    finally:
        envoy.stop()
        for stranger in strangers:
            stranger.close()
        xds.stop()


def test_the_admin_endpoint_wants_its_token(tmp_path: Path) -> None:
    token_file = tmp_path / "admin-token"
    token_file.write_text("s3cret-admin-token-0123456789\n")
    xds = XdsProcess("--brokers-file", str(_brokers_file(tmp_path)),
                     "--admin-token-file", str(token_file)).start()
    try:
        for path, method in (("/status", "GET"), ("/reload", "POST")):
            with pytest.raises(urllib.error.HTTPError) as refused:
                xds.admin_call(path, method)
            assert refused.value.code == 401
        xds.admin_token = "wrong-token-0123456789"
        with pytest.raises(urllib.error.HTTPError):
            xds.status()
        xds.admin_token = "s3cret-admin-token-0123456789"
        assert xds.status()["version"] == xds.reload()["version"]
    finally:
        xds.stop()


@pytest.mark.parametrize(("args", "message"), [
    (("--listen", "0.0.0.0:0"), "--listen 0.0.0.0:0 is not a loopback address"),
    (("--admin", "0.0.0.0:0"), "--admin 0.0.0.0:0 is not a loopback address"),
    (("--xds-tls-cert", "server.pem"), "--xds-tls-cert, --xds-tls-key and --xds-client-ca"
                                       " go together"),
    (("--max-streams-per-peer", "0"), "--max-streams-per-peer must be at least 1"),
])
def test_xds_server_refuses_an_unguarded_door(args: tuple[str, ...], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "edge.cli", "xds-server", "--broker", "0=127.0.0.1:1@127.0.0.1:2",
         "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", *args],
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2 and message in result.stderr, result.stderr
