"""Security acceptance 2: several listeners with their own advertised addresses, start-up
refusing listener and security mistakes, and the per-listener connection limits."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka.protocol.admin import DescribeClusterRequest, DescribeClusterResponse
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
)

from tests.broker_process import REPO, BrokerProcess, refused_to_start
from tests.raw import RawConnection
from tests.security_helpers import (
    NONE,
    SecureConnection,
    TlsFiles,
    TokenIssuer,
    make_tls,
)

BROKER_ID = 7
ADVERTISED = {"INTERNAL": ("internal.example", 19092),
              "EXTERNAL": ("external.example", 19093),
              "SECURE": ("secure.example", 19094)}


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> tuple[TlsFiles, TokenIssuer]:
    base = Path(tmp_path_factory.mktemp("listener-material"))
    return make_tls(base / "tls"), TokenIssuer("hmac", base / "keys")


@pytest.fixture(scope="module")
def multi(tmp_path_factory: pytest.TempPathFactory,
          material: tuple[TlsFiles, TokenIssuer]) -> Iterator[BrokerProcess]:
    """Three listeners (PLAINTEXT, SASL_PLAINTEXT, SASL_SSL), each advertising elsewhere."""
    tls, issuer = material
    broker = BrokerProcess(Path(tmp_path_factory.mktemp("multi")), {
        "brokerId": str(BROKER_ID),
        "kafkaListeners": "INTERNAL://127.0.0.1:0,EXTERNAL://127.0.0.1:0,SECURE://127.0.0.1:0",
        "kafkaProtocolMap": "INTERNAL:PLAINTEXT,EXTERNAL:SASL_PLAINTEXT,SECURE:SASL_SSL",
        "kafkaAdvertisedListeners": ",".join(
            f"{name}://{host}:{port}" for name, (host, port) in ADVERTISED.items()),
        **issuer.settings, **tls.broker_settings(),
    }).start()
    yield broker
    broker.stop()


def connect(broker: BrokerProcess, listener: str,
            material: tuple[TlsFiles, TokenIssuer]) -> SecureConnection:
    tls, issuer = material
    conn = SecureConnection(broker.ports[listener], ca=tls.ca if listener == "SECURE" else None)
    if listener != "INTERNAL":
        conn.login("acme", issuer.token("app"))
    return conn


def find_coordinator(conn: RawConnection, group: str, version: int) -> tuple[int, str, int]:
    if version >= 4:
        answer = conn.call(FindCoordinatorRequest[version](key_type=0, coordinator_keys=[group]),
                           version, FindCoordinatorResponse)
        (found,) = answer.coordinators
        assert found.error_code == NONE and found.key == group
        return found.node_id, found.host, found.port
    if version >= 1:
        request = FindCoordinatorRequest[version](key=group, key_type=0)
    else:
        request = FindCoordinatorRequest[version](key=group)
    answer = conn.call(request, version, FindCoordinatorResponse)
    assert answer.error_code == NONE
    return answer.node_id, answer.host, answer.port


@pytest.mark.parametrize("listener", ["INTERNAL", "EXTERNAL", "SECURE"])
def test_each_listener_advertises_its_own_address(
        multi: BrokerProcess, material: tuple[TlsFiles, TokenIssuer], listener: str) -> None:
    expected = ADVERTISED[listener]
    conn = connect(multi, listener, material)
    try:
        for version in (1, 4, 9, 12):
            meta = conn.metadata([], version=version)
            assert [(b.node_id, b.host, b.port) for b in meta.brokers] == \
                [(BROKER_ID, *expected)], (version, meta.brokers)
            assert meta.controller_id == BROKER_ID
        for version in range(5):
            assert find_coordinator(conn, "some-group", version) == (BROKER_ID, *expected)
        for version in (0, 1):
            fields: dict[str, bool | int] = {"include_cluster_authorized_operations": False}
            if version >= 1:
                fields["endpoint_type"] = 1
            cluster = conn.call(DescribeClusterRequest[version](**fields), version,
                                DescribeClusterResponse)
            assert cluster.error_code == NONE
            assert cluster.controller_id == BROKER_ID
            assert [(b.broker_id, b.host, b.port) for b in cluster.brokers] == \
                [(BROKER_ID, *expected)]
    finally:
        conn.close()


def test_same_cluster_id_and_broker_id_on_every_listener(
        multi: BrokerProcess, material: tuple[TlsFiles, TokenIssuer]) -> None:
    ids = set()
    for listener in ADVERTISED:
        conn = connect(multi, listener, material)
        try:
            meta = conn.metadata([])
            ids.add((meta.cluster_id, meta.controller_id, meta.brokers[0].node_id))
        finally:
            conn.close()
    assert len(ids) == 1
    assert next(iter(ids))[1:] == (BROKER_ID, BROKER_ID)
    assert f"broker {BROKER_ID}, listeners" in multi.log_text()


def test_ready_line_names_each_listener_with_its_advertised_address(
        multi: BrokerProcess) -> None:
    line = multi.wait_for_log("edge-broker ready")
    for name, (host, port) in ADVERTISED.items():
        assert f"{name}://127.0.0.1:{multi.ports[name]}" in line
        assert f"advertised {host}:{port}" in line
    assert "(PLAINTEXT," in line and "(SASL_PLAINTEXT," in line and "(SASL_SSL," in line


def test_unadvertised_listener_advertises_its_bind_address(
        tmp_path: Path, material: tuple[TlsFiles, TokenIssuer]) -> None:
    broker = BrokerProcess(tmp_path / "data", {
        "brokerId": str(BROKER_ID),
        "kafkaListeners": "INTERNAL://127.0.0.1:0,EXTERNAL://127.0.0.1:0",
        "kafkaProtocolMap": "INTERNAL:PLAINTEXT,EXTERNAL:PLAINTEXT",
        "kafkaAdvertisedListeners": "EXTERNAL://external.example:19093",
    }).start()
    try:
        for listener, expected in (("INTERNAL", ("127.0.0.1", broker.ports["INTERNAL"])),
                                   ("EXTERNAL", ("external.example", 19093))):
            conn = SecureConnection(broker.ports[listener])
            try:
                meta = conn.metadata([])
                assert [(b.node_id, b.host, b.port) for b in meta.brokers] == \
                    [(BROKER_ID, *expected)]
                assert find_coordinator(conn, "g", 3) == (BROKER_ID, *expected)
            finally:
                conn.close()
    finally:
        broker.stop()


# -- configuration mistakes -------------------------------------------------------------

def run_cli(tmp_path: Path, **settings: str) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "edge.cli", "--set", f"dataDir={tmp_path / 'data'}"]
    for key, value in settings.items():
        args += ["--set", f"{key}={value}"]
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=30)


def test_sasl_listener_without_token_keys_is_refused(tmp_path: Path) -> None:
    refused_to_start(run_cli(tmp_path, kafkaListeners="SASL_PLAINTEXT://127.0.0.1:0"),
                     "tokenSecretKey", "tokenPublicKey")


def test_sasl_ssl_listener_without_token_keys_is_refused(
        tmp_path: Path, material: tuple[TlsFiles, TokenIssuer]) -> None:
    tls, _issuer = material
    refused_to_start(run_cli(tmp_path, kafkaListeners="EXT://127.0.0.1:0",
                             kafkaProtocolMap="EXT:SASL_SSL", **tls.broker_settings()),
                     "tokenSecretKey")


@pytest.mark.parametrize("protocol", ["SSL", "SASL_SSL"])
def test_tls_listener_without_certificate_files_is_refused(
        tmp_path: Path, material: tuple[TlsFiles, TokenIssuer], protocol: str) -> None:
    _tls, issuer = material
    refused_to_start(run_cli(tmp_path, kafkaListeners=f"{protocol}://127.0.0.1:0",
                             **issuer.settings),
                     "tlsCertificateFilePath", "tlsKeyFilePath")


def test_tls_listener_with_missing_certificate_file_names_the_file(
        tmp_path: Path, material: tuple[TlsFiles, TokenIssuer]) -> None:
    tls, _issuer = material
    missing = tmp_path / "nowhere.pem"
    result = run_cli(tmp_path, kafkaListeners="SSL://127.0.0.1:0",
                     tlsCertificateFilePath=str(missing), tlsKeyFilePath=str(tls.key))
    refused_to_start(result, str(missing))


def test_listener_name_without_protocol_is_refused(tmp_path: Path) -> None:
    refused_to_start(run_cli(tmp_path, kafkaListeners="INTERNAL://127.0.0.1:0,OTHER://127.0.0.1:0",
                             kafkaProtocolMap="INTERNAL:PLAINTEXT"),
                     "kafkaListeners", "OTHER", "not in the protocol map")


def test_listener_name_that_is_no_protocol_without_a_map_is_refused(tmp_path: Path) -> None:
    refused_to_start(run_cli(tmp_path, kafkaListeners="INTERNAL://127.0.0.1:0"),
                     "kafkaListeners", "INTERNAL", "is not a security protocol")


def test_duplicate_listener_names_are_refused(tmp_path: Path) -> None:
    refused_to_start(run_cli(tmp_path, kafkaListeners="INTERNAL://127.0.0.1:0,internal://127.0.0.1:0",
                             kafkaProtocolMap="INTERNAL:PLAINTEXT"),
                     "kafkaListeners", "duplicate listener name 'INTERNAL'")


def test_advertised_name_without_listener_is_refused(tmp_path: Path) -> None:
    refused_to_start(run_cli(tmp_path, kafkaListeners="INTERNAL://127.0.0.1:0",
                             kafkaProtocolMap="INTERNAL:PLAINTEXT,EXTERNAL:PLAINTEXT",
                             kafkaAdvertisedListeners="INTERNAL://a.example:1,EXTERNAL://b.example:2"),
                     "kafkaAdvertisedListeners", "EXTERNAL")


def test_unknown_sasl_mechanism_is_refused(
        tmp_path: Path, material: tuple[TlsFiles, TokenIssuer]) -> None:
    _tls, issuer = material
    refused_to_start(run_cli(tmp_path, kafkaListeners="SASL_PLAINTEXT://127.0.0.1:0",
                             saslAllowedMechanisms="PLAIN,SCRAM-SHA-256", **issuer.settings),
                     "saslAllowedMechanisms", "SCRAM-SHA-256")


def test_listener_mechanisms_for_unknown_listener_are_refused(
        tmp_path: Path, material: tuple[TlsFiles, TokenIssuer]) -> None:
    _tls, issuer = material
    refused_to_start(run_cli(tmp_path, kafkaListeners="SASL_PLAINTEXT://127.0.0.1:0",
                             saslListenerMechanisms="NOPE:PLAIN", **issuer.settings),
                     "saslListenerMechanisms", "NOPE")


# -- connection limits ------------------------------------------------------------------

def api_versions_ok(conn: RawConnection) -> bool:
    answer = conn.call(ApiVersionsRequest[0](), 0, ApiVersionsResponse)
    return answer.error_code == NONE


def test_max_connections_per_listener(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", {
        "kafkaListeners": "A://127.0.0.1:0,B://127.0.0.1:0",
        "kafkaProtocolMap": "A:PLAINTEXT,B:PLAINTEXT",
        "maxConnectionsPerListener": "2",
    }).start()
    try:
        first, second = RawConnection(broker.ports["A"]), RawConnection(broker.ports["A"])
        assert api_versions_ok(first) and api_versions_ok(second)
        extra = RawConnection(broker.ports["A"])
        assert extra.closed_by_peer(5.0)
        extra.close()
        broker.wait_for_log(r"refusing connection from .* on A: 2 connections is the limit")
        # The limit is per listener: B still takes connections.
        on_b = RawConnection(broker.ports["B"])
        assert api_versions_ok(on_b)
        on_b.close()
        # The held connections keep working.
        assert api_versions_ok(first) and api_versions_ok(second)
        first.close()
        second.close()
        # Once they are gone, the listener serves new connections again.
        deadline = time.monotonic() + 10
        while True:
            fresh = RawConnection(broker.ports["A"])
            try:
                if api_versions_ok(fresh):
                    break
            except (ConnectionError, OSError):
                pass
            finally:
                fresh.close()
            assert time.monotonic() < deadline, "listener A never served again"
            time.sleep(0.1)
        assert broker.alive()
    finally:
        broker.stop()


def tls_client(port: int, ca: Path) -> ssl.SSLSocket:
    """A TLS connection to ``port`` with its handshake done (ssl.SSLError, OSError: not)."""
    context = ssl.create_default_context(cafile=str(ca))
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        return context.wrap_socket(raw, server_hostname="localhost")
    except BaseException:
        raw.close()
        raise


def test_connections_in_the_tls_handshake_count_against_the_listener_cap(
        tmp_path: Path, material: tuple[TlsFiles, TokenIssuer]) -> None:
    """Sockets that never start their TLS handshake hold their place from the accept on
    (they used to be counted only after the handshake, for up to a minute each): one
    more is closed at once, TLS client or not, and the places come back as they close."""
    tls, _issuer = material
    broker = BrokerProcess(tmp_path / "data", {
        "kafkaListeners": "SSL://127.0.0.1:0,PLAINTEXT://127.0.0.1:0",
        "maxConnectionsPerListener": "3", **tls.broker_settings(),
    }).start()
    try:
        port = broker.ports["SSL"]
        idle = [RawConnection(port) for _ in range(3)]  # no ClientHello, ever
        extra = RawConnection(port)
        assert extra.closed_by_peer(5.0)
        extra.close()
        broker.wait_for_log(r"refusing connection from .* on SSL: 3 connections is the limit")
        with pytest.raises((ssl.SSLError, OSError)):
            tls_client(port, tls.ca).close()
        # the cap is per listener
        assert api_versions_ok(RawConnection(broker.ports["PLAINTEXT"]))
        for conn in idle:
            conn.close()
        deadline = time.monotonic() + 10
        while True:
            try:
                tls_client(port, tls.ca).close()
                break
            except (ssl.SSLError, OSError):
                assert time.monotonic() < deadline, "the places never came back"
                time.sleep(0.1)
        assert broker.alive()
    finally:
        broker.stop()


def test_a_tls_handshake_not_begun_ends_at_the_handshake_timeout(
        tmp_path: Path, material: tuple[TlsFiles, TokenIssuer]) -> None:
    tls, _issuer = material
    broker = BrokerProcess(tmp_path / "data", {
        "kafkaListeners": "SSL://127.0.0.1:0", "tlsHandshakeTimeoutMs": "500",
        **tls.broker_settings(),
    }).start()
    try:
        silent = RawConnection(broker.port)
        assert silent.closed_by_peer(20.0)
        silent.close()
        broker.wait_for_log(r"closing connection from .* on SSL: TLS handshake not complete "
                            r"within 0\.5 s")
        tls_client(broker.port, tls.ca).close()  # a real handshake is in time
    finally:
        broker.stop()


def test_max_connections_per_ip_counts_across_listeners_with_overrides(
        tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", {
        "kafkaListeners": "A://127.0.0.1:0,B://127.0.0.1:0",
        "kafkaProtocolMap": "A:PLAINTEXT,B:PLAINTEXT",
        "maxConnectionsPerIp": "2", "maxConnectionsPerIpOverrides": "127.0.0.2:3",
    }).start()
    try:
        held = [RawConnection(broker.ports["A"]), RawConnection(broker.ports["B"])]
        assert all(api_versions_ok(conn) for conn in held)
        extra = RawConnection(broker.ports["B"])
        assert extra.closed_by_peer(5.0)
        extra.close()
        broker.wait_for_log(r"refusing connection from 127\.0\.0\.1:\d+ on B: 2 connections "
                            r"from 127\.0\.0\.1 is the limit \(maxConnectionsPerIp\)")
        # another address has its own count, and its override
        other = [RawConnection(broker.ports["A"], source="127.0.0.2") for _ in range(3)]
        assert all(api_versions_ok(conn) for conn in other)
        fourth = RawConnection(broker.ports["A"], source="127.0.0.2")
        assert fourth.closed_by_peer(5.0)
        fourth.close()
        for conn in held + other:
            conn.close()
        deadline = time.monotonic() + 10
        while True:
            fresh = RawConnection(broker.ports["B"])
            try:
                if api_versions_ok(fresh):
                    break
            except OSError:
                pass
            finally:
                fresh.close()
            assert time.monotonic() < deadline, "127.0.0.1 never served again"
            time.sleep(0.1)
    finally:
        broker.stop()


@pytest.mark.parametrize(("settings", "fragment"), [
    ({"maxConnectionsPerIp": "0"}, "maxConnectionsPerIpOverrides"),
    ({"maxConnectionsPerIpOverrides": "envoy.local:100"}, "ADDRESS:COUNT"),
    ({"maxConnectionsPerIpOverrides": "10.0.0.1:-1"}, "10.0.0.1:-1"),
])
def test_per_ip_settings_are_checked(tmp_path: Path, settings: dict[str, str],
                                     fragment: str) -> None:
    refused_to_start(run_cli(tmp_path, **settings), fragment)


def test_an_open_file_limit_below_the_listener_caps_is_warned_of_and_soft_raised(
        tmp_path: Path) -> None:
    """The soft limit goes up to the hard one (as the JVM raises Kafka's); when even that
    is below the listeners' caps plus the margin, one warning says so."""
    broker = BrokerProcess(tmp_path / "data", {
        "kafkaListeners": "A://127.0.0.1:0,B://127.0.0.1:0",
        "kafkaProtocolMap": "A:PLAINTEXT,B:PLAINTEXT",
        "maxConnectionsPerListener": "3000"})
    broker.launcher = ["prlimit", "--nofile=1024:4096"]
    broker.start()
    try:
        assert broker.proc is not None
        limits = Path(f"/proc/{broker.proc.pid}/limits").read_text()
        (line,) = [row for row in limits.splitlines() if row.startswith("Max open files")]
        assert line.split()[3:5] == ["4096", "4096"], line
        warned = [row for row in broker.lines if "open-file limit is 4096" in row]
        assert len(warned) == 1 and " WARNING " in warned[0], warned
        assert "at least 7024" in warned[0]
    finally:
        broker.stop()
    roomy = BrokerProcess(tmp_path / "data2", {"maxConnectionsPerListener": "1000"})
    roomy.launcher = ["prlimit", "--nofile=1024:4096"]
    roomy.start()
    try:
        assert not [row for row in roomy.lines if "open-file limit" in row]
    finally:
        roomy.stop()


def test_idle_connections_are_closed(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", {"connectionMaxIdleMs": "1000"}).start()
    try:
        idle = RawConnection(broker.port)
        busy = RawConnection(broker.port)
        assert api_versions_ok(idle) and api_versions_ok(busy)
        started = time.monotonic()
        # The busy connection keeps talking for 2.5 s and stays open.
        while time.monotonic() - started < 2.5:
            assert api_versions_ok(busy)
            time.sleep(0.3)
        assert idle.closed_by_peer(1.0)
        assert api_versions_ok(busy)
        busy.close()
        idle.close()
        broker.wait_for_log(r"closing idle connection from")
        # Never-used connections are closed too.
        silent = RawConnection(broker.port)
        t0 = time.monotonic()
        assert silent.closed_by_peer(5.0)
        assert 0.8 <= time.monotonic() - t0 < 4.0
        silent.close()
    finally:
        broker.stop()
