"""Envoy acceptance 5: ``edge-broker xds-server`` configures a running Envoy over ADS.

A real Envoy starts from a dynamic bootstrap with no listeners; the xds-server adds the
first broker's listener, then a second broker's when the brokers file changes, without
restarting Envoy.  A version Envoy rejects (a port already taken on Envoy's host) is
NACKed, the server reports it, and the last good listeners keep serving.  The ADS
state machine (ACK, NACK, stale nonces, pushes) is also checked with a gRPC client.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_pb2

from edge.envoy.contrib import CONTRIB_ONLY
from edge.envoy.model import BrokerRoute, EdgeOptions
from edge.envoy.snapshot import CLUSTER_TYPE, LISTENER_TYPE
from edge.envoy.source import PlanSource
from edge.envoy.xds_server import XdsServer
from tests.broker_process import BrokerProcess
from tests.envoy_helpers import AdsClient, XdsProcess, brokers_via, envoy_on_xds
from tests.ports import free_ports


def replace_text(path: Path, text: str) -> None:
    """Rewrite a watched file atomically, as an operator should: the server polls it and
    must never see it half written."""
    temp = path.with_suffix(".tmp")
    temp.write_text(text)
    os.replace(temp, path)


def _route(broker_id: int, envoy_port: int, internal_port: int) -> str:
    return BrokerRoute(broker_id, "127.0.0.1", envoy_port, "127.0.0.1", internal_port).spec()


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[int], list[
        BrokerProcess]]]:
    """Two brokers (ids 0 and 1), each advertising its own Envoy port."""
    root = Path(tmp_path_factory.mktemp("envoy-xds"))
    envoy_ports = free_ports(2)
    processes: list[BrokerProcess] = []
    try:
        for broker_id, port in enumerate(envoy_ports):
            processes.append(BrokerProcess(root / f"b{broker_id}", {
                "brokerId": str(broker_id),
                "kafkaAdvertisedListeners": f"PLAINTEXT://127.0.0.1:{port}",
            }).start())
        yield envoy_ports, processes
    finally:
        for process in processes:
            process.stop()


def test_xds_server_adds_a_broker_and_survives_a_rejected_version(
        brokers: tuple[list[int], list[BrokerProcess]], tmp_path: Path) -> None:
    (port0, port1), (broker0, broker1) = brokers
    taken, spare, admin = free_ports(3)
    brokers_file = tmp_path / "brokers.txt"
    brokers_file.write_text(f"# broker 0 only\n{_route(0, port0, broker0.port)}\n")
    xds = XdsProcess("--brokers-file", str(brokers_file)).start()
    envoy = envoy_on_xds(tmp_path, xds.grpc_port, admin)
    try:
        envoy.start(listeners=1)
        pid = envoy.pid
        assert brokers_via(port0) == [(0, "127.0.0.1", port0)]
        xds.wait_for_log(r"ACK from node edge-broker-envoy: listeners version 2")

        # a second broker appears in the watched file: Envoy gets its listener live
        replace_text(brokers_file, brokers_file.read_text() + _route(1, port1, broker1.port)
                                + "\n")
        xds.wait_for_log(r"ACK from node edge-broker-envoy: listeners version 3")
        envoy.wait_for(lambda: len(envoy.listeners()) == 2, 10, "the second listener")
        assert brokers_via(port1) == [(1, "127.0.0.1", port1)]
        assert envoy.pid == pid and envoy.proc is not None and envoy.proc.poll() is None

        # a version Envoy cannot apply: broker 2's port is taken on Envoy's host
        blocker = socket.socket()
        blocker.bind(("127.0.0.1", taken))
        blocker.listen()
        try:
            replace_text(brokers_file, brokers_file.read_text() + _route(2, taken, broker1.port)
                                    + "\n")
            line = xds.wait_for_log(r"NACK from node edge-broker-envoy: listeners version 4")
            assert "kafka-broker-2" in line and "Envoy keeps version 3" in line
            status = xds.status()
            rejected = status["nodes"]["edge-broker-envoy"]["rejected"]["listeners"]
            assert rejected["version"] == "4" and "cannot bind" in rejected["message"]
            assert status["nacks"] >= 1
            # an admin call re-reads the inputs: unchanged, so version 4 stays
            assert xds.reload()["version"] == "4"
            # the last good listeners keep serving
            assert brokers_via(port0) == [(0, "127.0.0.1", port0)]
            assert brokers_via(port1) == [(1, "127.0.0.1", port1)]
            assert sorted(line.split("::")[0] for line in envoy.listeners()) == [
                "kafka-broker-0", "kafka-broker-1"]
        finally:
            blocker.close()

        # a broken brokers file is refused by the server itself: nothing is pushed
        replace_text(brokers_file, "0=this is not a broker\n")
        xds.wait_for_log(r"reload \(file changed\) failed, still serving version 4")
        assert xds.status()["last_reload_error"]

        # the operator fixes the port; the next version is accepted
        replace_text(brokers_file, "".join(f"{_route(*r)}\n" for r in (
            (0, port0, broker0.port), (1, port1, broker1.port), (2, spare, broker1.port))))
        xds.wait_for_log(r"ACK from node edge-broker-envoy: listeners version 5")
        envoy.wait_for(lambda: len(envoy.listeners()) == 3, 10, "the third listener")
        status = xds.status()
        assert status["nodes"]["edge-broker-envoy"]["rejected"] == {}
        # only the listeners changed (broker 2's cluster was already accepted in version 4)
        assert status["nodes"]["edge-broker-envoy"]["acked"] == {"clusters": "4",
                                                                  "listeners": "5"}
        assert brokers_via(spare) == [(1, "127.0.0.1", port1)]  # routed to broker 1
        assert envoy.pid == pid
        assert xds.proc is not None
        xds.proc.send_signal(signal.SIGHUP)  # SIGHUP re-reads the inputs too
        xds.wait_for_log(r"reload \(SIGHUP\): no change, version 5")
    finally:
        envoy.stop()
        xds.stop()


def _first(lines: list[str], text: str) -> int:
    """The index of the first of Envoy's log lines holding ``text``."""
    return next(i for i, line in enumerate(lines) if text in line)


def test_a_broker_replacing_another_goes_make_before_break(tmp_path: Path) -> None:
    """One version adds broker 2 and removes broker 1.  Envoy's rule (xDS, "eventual
    consistency considerations"): CDS before LDS to add, LDS before CDS to remove.  Envoy
    applies its updates in the order they come on the stream, and says so in its log: the
    new cluster before the new listener, the leaving listener before its cluster (sent
    clusters first, broker 1's listener was left a moment with no cluster)."""
    port0, port1, port2, admin = free_ports(4)
    brokers_file = tmp_path / "brokers.txt"
    brokers_file.write_text(f"{_route(0, port0, 1)}\n{_route(1, port1, 2)}\n")
    server = XdsServer(PlanSource(brokers_file=str(brokers_file)), ("127.0.0.1", 0),
                       ("127.0.0.1", 0), poll_interval=3600)
    server.start()
    envoy = envoy_on_xds(tmp_path, server.grpc_port, admin, log_level="debug")
    try:
        envoy.start(listeners=2)
        before = len(envoy.lines)
        replace_text(brokers_file, f"{_route(0, port0, 1)}\n{_route(2, port2, 3)}\n")
        assert server.reload("test")
        version = server.store.version
        _wait(lambda: server.status_dict()["nodes"]["edge-broker-envoy"]["acked"] == {
            "clusters": version, "listeners": version}, timeout=20)
        assert sorted(line.split("::")[0] for line in envoy.listeners()) == [
            "kafka-broker-0", "kafka-broker-2"]
        lines = envoy.lines[before:]
        assert (_first(lines, "cds: add/update cluster 'kafka-broker-2'")
                < _first(lines, "lds: add/update listener 'kafka-broker-2'")), lines
        assert (_first(lines, "lds: remove listener 'kafka-broker-1'")
                < _first(lines, "cds: remove cluster 'kafka-broker-1'")), lines
    finally:
        envoy.stop()
        server.stop()


# -- the ADS state machine, with a gRPC client -------------------------------------------

@pytest.fixture
def ads_server(tmp_path: Path) -> Iterator[tuple[XdsServer, Path]]:
    brokers_file = tmp_path / "brokers.txt"
    brokers_file.write_text("0=127.0.0.1:19092@127.0.0.1:29092\n")
    server = XdsServer(PlanSource(brokers_file=str(brokers_file)), ("127.0.0.1", 0),
                       ("127.0.0.1", 0), poll_interval=3600)
    server.start()
    try:
        yield server, brokers_file
    finally:
        server.stop()


def _listener_names(response: Any) -> list[str]:
    names = []
    for item in response.resources:
        listener = listener_pb2.Listener()
        assert item.Unpack(listener)
        names.append(listener.name)
    return names


def test_ads_ack_nack_stale_nonce_and_push(ads_server: tuple[XdsServer, Path]) -> None:
    server, brokers_file = ads_server
    client = AdsClient(server.grpc_port)
    try:
        client.send(CLUSTER_TYPE)
        clusters = client.receive()
        assert clusters.type_url == CLUSTER_TYPE and clusters.version_info == "2"
        client.send(CLUSTER_TYPE, "2", clusters.nonce)  # ACK
        client.send(LISTENER_TYPE)
        listeners = client.receive()
        assert _listener_names(listeners) == ["kafka-broker-0"]
        client.send(LISTENER_TYPE, "2", listeners.nonce)
        _wait(lambda: server.status_dict()["nodes"]["test-node"]["acked"] == {
            "clusters": "2", "listeners": "2"})

        # a change is pushed: clusters first, then listeners
        replace_text(brokers_file, brokers_file.read_text() + "1=127.0.0.1:19093@127.0.0.1:1\n")
        assert server.reload("test")
        pushed = [client.receive(), client.receive()]
        assert [r.type_url for r in pushed] == [CLUSTER_TYPE, LISTENER_TYPE]
        assert {r.version_info for r in pushed} == {"3"}
        assert _listener_names(pushed[1]) == ["kafka-broker-0", "kafka-broker-1"]

        # a stale nonce (the first listeners response) changes nothing; a NACK is recorded
        client.send(LISTENER_TYPE, "2", listeners.nonce, error="stale, ignored")
        client.send(CLUSTER_TYPE, "3", pushed[0].nonce)
        client.send(LISTENER_TYPE, "2", pushed[1].nonce, error="cannot bind")
        _wait(lambda: server.status.nack_count == 1)
        node = server.status_dict()["nodes"]["test-node"]
        assert node["acked"] == {"clusters": "3", "listeners": "2"}
        assert node["rejected"]["listeners"]["version"] == "3"
        assert node["rejected"]["listeners"]["message"] == "cannot bind"

        # reloading unchanged inputs sends nothing; a fixed plan is sent and ACKed
        assert server.reload("unchanged")
        assert server.store.version == "3"
        replace_text(brokers_file, "0=127.0.0.1:19092@127.0.0.1:29092\n")
        assert server.reload("fixed")
        fixed = [client.receive(), client.receive()]
        # broker 1 removed: its listener goes before its cluster (make before break)
        assert [r.type_url for r in fixed] == [LISTENER_TYPE, CLUSTER_TYPE]
        client.send(LISTENER_TYPE, "4", fixed[0].nonce)
        _wait(lambda: server.status_dict()["nodes"]["test-node"]["rejected"] == {})
        assert server.status_dict()["nodes"]["test-node"]["acked"]["listeners"] == "4"
    finally:
        client.close()


def test_ads_serves_clusters_that_send_the_proxy_protocol(tmp_path: Path) -> None:
    brokers_file = tmp_path / "brokers.txt"
    brokers_file.write_text("0=127.0.0.1:19092@127.0.0.1:29092\n")
    server = XdsServer(PlanSource(brokers_file=str(brokers_file),
                                  options=EdgeOptions(proxy_protocol=True)),
                       ("127.0.0.1", 0), ("127.0.0.1", 0), poll_interval=3600)
    server.start()
    client = AdsClient(server.grpc_port)
    try:
        client.send(CLUSTER_TYPE)
        (item,) = client.receive().resources
        cluster = cluster_pb2.Cluster()
        assert item.Unpack(cluster)
        assert cluster.transport_socket.name == "envoy.transport_sockets.upstream_proxy_protocol"
    finally:
        client.close()
        server.stop()


def test_ads_reload_errors_keep_the_last_good_snapshot(
        ads_server: tuple[XdsServer, Path]) -> None:
    server, brokers_file = ads_server
    brokers_file.write_text("0=127.0.0.1:19092@127.0.0.1:29092\n0=127.0.0.1:1@127.0.0.1:2\n")
    assert not server.reload("duplicate id")
    assert "broker id 0 is described twice" in str(server.last_error)
    assert server.store.version == "2"
    resources = server.store.get(LISTENER_TYPE)
    assert resources is not None and resources.names == ("kafka-broker-0",)


def _wait(condition: Any, timeout: float = 5.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


@pytest.mark.parametrize(("args", "message"), [
    ((), "describe the brokers"),
    (("--broker", "0=a:1@b:2", "--listen", "127.0.0.1"), "--listen '127.0.0.1': expected"),
    (("--brokers-file", "/nonexistent/brokers.txt"), "cannot read brokers file"),
])
def test_xds_server_refuses_to_start_on_bad_inputs(args: tuple[str, ...], message: str) -> None:
    result = subprocess.run([sys.executable, "-m", "edge.cli", "xds-server", *args],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_xds_server_warns_that_the_kafka_broker_filter_needs_contrib_envoy() -> None:
    server = XdsProcess("--broker", _route(0, 19092, 29092), "--kafka-broker-filter").start()
    try:
        warning = server.wait_for_log("WARNING")
    finally:
        server.stop()
    assert warning.endswith(f"WARNING edge.envoy.xds: {CONTRIB_ONLY}")


def _streams(server: XdsServer, node: str) -> int:
    found = server.status_dict()["nodes"].get(node)
    return 0 if found is None else found["streams"]


def _small_server(tmp_path: Path, first_request_s: float) -> XdsServer:
    brokers_file = tmp_path / "brokers.txt"
    brokers_file.write_text("0=127.0.0.1:19092@127.0.0.1:29092\n")
    server = XdsServer(PlanSource(brokers_file=str(brokers_file)), ("127.0.0.1", 0),
                       ("127.0.0.1", 0), poll_interval=3600, max_streams=2,
                       first_request_s=first_request_s)
    server.start()
    return server


def test_streams_beyond_the_bound_are_refused_at_once_not_left_unserved(
        tmp_path: Path) -> None:
    # each stream holds a worker thread: streams that never ask for anything used to queue
    # every later Envoy behind them, unserved; one beyond the bound is refused instead
    server = _small_server(tmp_path, first_request_s=3600)
    idle = [AdsClient(server.grpc_port) for _ in range(2)]
    try:
        for client in idle:  # a type this server does not serve: never an answer
            client.send("type.googleapis.com/nothing.served.Here")
        _wait(lambda: _streams(server, "test-node") == 2, timeout=30)
        late = AdsClient(server.grpc_port)
        try:
            late.send(CLUSTER_TYPE)
            with pytest.raises(grpc.RpcError) as refused:
                late.receive()
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        finally:
            late.close()
    finally:
        for client in idle:
            client.close()
        server.stop()


def test_a_stream_that_asks_nothing_is_closed_and_frees_its_place(tmp_path: Path) -> None:
    server = _small_server(tmp_path, first_request_s=1.0)
    idle = [AdsClient(server.grpc_port) for _ in range(2)]
    try:
        for client in idle:  # closed by the server: the response stream just ends
            with pytest.raises(StopIteration):
                client.receive()
        served = AdsClient(server.grpc_port)
        try:
            served.send(CLUSTER_TYPE)
            assert served.receive().type_url == CLUSTER_TYPE
        finally:
            served.close()
    finally:
        for client in idle:
            client.close()
        server.stop()


def test_an_ack_with_a_made_up_version_keeps_the_rejection_and_the_stream() -> None:
    from edge.envoy.ads import AdsStatus

    status = AdsStatus()
    status.nack("n", CLUSTER_TYPE, "3", "bad")
    status.ack("n", CLUSTER_TYPE, "abc")  # raised ValueError, ending that Envoy's stream
    assert status.as_dict()["n"]["rejected"]
    status.ack("n", CLUSTER_TYPE, "4")
    assert not status.as_dict()["n"]["rejected"]
