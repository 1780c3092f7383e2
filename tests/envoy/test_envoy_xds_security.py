"""The xds-server against hostile clients, and its guarded doors.

A plain gRPC client stands for whoever reaches the gRPC port: its NACK messages and node
ids reach one bounded, escaped log line and a bounded status entry, forgotten once its
stream closes; a node id beyond 256 bytes is refused; one address cannot hold every
stream slot, so a real Envoy from another address still gets its listeners.  With mutual
TLS only a client holding a certificate of the given CA gets a stream (a real Envoy, from
a bootstrap written by ``envoy-config --xds ... --xds-tls-cert``); the admin endpoint
wants its token when given one, and a non-loopback address needs mTLS or a token.
A peer that sends without reading the answers is held to a few requests (the rest wait in
gRPC's flow control, not in the server's memory), a request over 1 MiB ends its stream,
and the admin endpoint closes idle connections and refuses those beyond its cap.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
import urllib.error
from collections.abc import Callable, Generator, Iterator
from functools import partial
from pathlib import Path
from typing import cast

import grpc
import pytest
import yaml
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

from edge.envoy.ads import (
    MAX_NODE_ID_BYTES,
    TEXT_LIMIT,
    AdsStatus,
    AggregatedDiscoveryServicer,
)
from edge.envoy.model import BrokerRoute, EnvoyPlan
from edge.envoy.resources import clusters, listeners
from edge.envoy.snapshot import CLUSTER_TYPE, LISTENER_TYPE, SnapshotStore
from edge.envoy.source import PlanSource
from edge.envoy.stream_inbox import MAX_WAITING_REQUESTS
from edge.envoy.xds_server import MAX_REQUEST_BYTES, XdsServer
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
    for node in ("n" * (MAX_NODE_ID_BYTES + 1), "é" * 200, "x" * (512 << 10), ""):
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
    hostile: list[AdsClient] = []
    envoy = _envoy_from(tmp_path, server.grpc_port, free_ports(1)[0], "127.0.0.2")
    try:
        # in turn (a client opens its stream when made: made at once, any two of them could
        # take the address's two streams): the third is refused
        for count in range(1, 4):
            hostile.append(AdsClient(server.grpc_port, node=f"hostile-{count}"))
            hostile[-1].send(_UNSERVED)
            if count < 3:
                _wait(partial(_node_count_is, server, count))
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


# -- a peer that sends and never reads --------------------------------------------------

class _Requests:
    """An endless ADS request stream (each asks for the clusters again), counting the
    requests the server took; it ends when :meth:`end` is called."""

    def __init__(self) -> None:
        self.taken = 0
        self._ended = threading.Event()

    def __iter__(self) -> _Requests:
        return self

    def __next__(self) -> discovery_pb2.DiscoveryRequest:
        if self._ended.is_set():
            raise StopIteration
        self.taken += 1
        return discovery_pb2.DiscoveryRequest(node=base_pb2.Node(id="flood"),
                                              type_url=CLUSTER_TYPE)

    def end(self) -> None:
        self._ended.set()


class _Context:
    """What the servicer asks of gRPC's servicer context, for a stream driven by hand."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[], None]] = []

    def peer(self) -> str:
        return "ipv4:127.0.0.1:40000"

    def add_callback(self, callback: Callable[[], None]) -> bool:
        self.callbacks.append(callback)
        return True

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise AssertionError(f"stream refused: {code} {details}")


def test_a_peer_that_never_reads_is_held_to_a_few_requests() -> None:
    # the server's reader thread queued every request while the serving thread could not
    # send: 1500 requests of 1 MB took the server from 86 to 1289 MiB
    store = SnapshotStore()
    plan = EnvoyPlan((BrokerRoute.parse("0=127.0.0.1:19092@127.0.0.1:29092"),))
    store.update(listeners(plan), clusters(plan))
    requests = _Requests()
    responses = cast(Generator[discovery_pb2.DiscoveryResponse, None, None],
                     AggregatedDiscoveryServicer(store, AdsStatus()).StreamAggregatedResources(
                         requests, cast(grpc.ServicerContext, _Context())))
    most = MAX_WAITING_REQUESTS + 1  # waiting in the server, and one in its reader's hand
    try:
        answered = 1
        assert next(responses).type_url == CLUSTER_TYPE  # then the peer reads nothing
        _wait(lambda: requests.taken >= answered + most)
        time.sleep(0.5)  # room to run ahead: the old reader took thousands meanwhile
        assert requests.taken <= answered + most
        for _ in range(50):  # the peer reads again: the server takes requests again
            assert next(responses).type_url == CLUSTER_TYPE
            answered += 1
            assert requests.taken <= answered + most
        _wait(lambda: requests.taken >= answered + most)
    finally:
        requests.end()
        responses.close()


def test_a_request_over_the_receive_limit_ends_its_stream(xds: XdsProcess) -> None:
    client = AdsClient(xds.grpc_port, node="large")
    try:
        client.requests.put(discovery_pb2.DiscoveryRequest(
            node=base_pb2.Node(id="large"), type_url=CLUSTER_TYPE,
            resource_names=["x" * MAX_REQUEST_BYTES]))
        with pytest.raises(grpc.RpcError) as refused:
            client.receive()
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        client.close()
    fits = AdsClient(xds.grpc_port, node="fits")
    try:
        fits.requests.put(discovery_pb2.DiscoveryRequest(
            node=base_pb2.Node(id="fits"), type_url=CLUSTER_TYPE,
            resource_names=["x" * (MAX_REQUEST_BYTES - 1024)]))
        assert fits.receive().type_url == CLUSTER_TYPE
    finally:
        fits.close()


# -- the admin endpoint's connections ---------------------------------------------------

_TOKEN = "s3cret-admin-token-0123456789"


def _admin_server(directory: Path, connections: int, timeout_s: float) -> XdsServer:
    server = XdsServer(PlanSource(brokers_file=str(_brokers_file(directory))),
                       ("127.0.0.1", 0), ("127.0.0.1", 0), poll_interval=3600,
                       admin_token=_TOKEN, max_admin_connections=connections,
                       admin_timeout_s=timeout_s)
    server.start()
    return server


def _connect(server: XdsServer) -> socket.socket:
    host, port = server.admin_address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=30)


def _status_code(server: XdsServer) -> int:
    """The status code of an authorized GET /status (0: closed without an answer)."""
    conn = _connect(server)
    try:
        conn.sendall(f"GET /status HTTP/1.0\r\nAuthorization: Bearer {_TOKEN}\r\n\r\n"
                     .encode())
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    finally:
        conn.close()
    return int(answer.split(b" ", 2)[1]) if answer else 0


def test_admin_connections_beyond_the_cap_are_refused(tmp_path: Path) -> None:
    # every connection took a thread before the token check: 300 idle connections held
    # 300 threads
    server = _admin_server(tmp_path, connections=2, timeout_s=60.0)
    try:
        idle = [_connect(server) for _ in range(2)]
        try:
            for conn in idle:
                conn.sendall(b"GET /status HTTP/1.1\r\n")  # and never the rest
            late = _connect(server)
            try:
                answer = late.recv(65536)
            finally:
                late.close()
            assert answer.startswith(b"HTTP/1.0 503 ")
            assert b"too many admin connections" in answer
        finally:
            for conn in idle:
                conn.close()
        _wait(lambda: _status_code(server) == 200)  # their places are free again
    finally:
        server.stop()


def test_an_idle_admin_connection_is_closed(tmp_path: Path) -> None:
    server = _admin_server(tmp_path, connections=2, timeout_s=0.5)
    try:
        idle = _connect(server)
        try:
            idle.sendall(b"GET /status HTTP/1.1\r\n")
            assert idle.recv(65536) == b""  # closed by the server, unanswered
        finally:
            idle.close()
        assert _status_code(server) == 200
    finally:
        server.stop()
