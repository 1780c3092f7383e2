"""What the operator reads: a port that is taken stops start-up with one line (exit 2)
and leaves nothing listening; a client resetting its connection is one INFO line, not a
traceback; a client repeating the same mistake cannot flood the log."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.metadata import MetadataRequest

from edge.app import BrokerApp, StartupError
from edge.config import load_config
from edge.log_limits import RepeatedWarningFilter
from tests.broker_process import REPO, BrokerProcess
from tests.ports import free_port
from tests.protocol.test_bad_input import create, produce
from tests.raw import RawConnection, record_batch
from tests.security_helpers import (
    SecureConnection,
    TlsFiles,
    TokenIssuer,
    make_tls,
)


@pytest.fixture
def busy_port() -> Iterator[int]:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    yield int(holder.getsockname()[1])
    holder.close()


def test_a_busy_port_stops_startup_with_one_line(tmp_path: Path, busy_port: int) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "edge.cli", "--set", f"dataDir={tmp_path}",
         "--set", f"kafkaListeners=PLAINTEXT://127.0.0.1:{busy_port}"],
        cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "cannot start" in line]
    assert errors == [f"edge-broker: cannot start: cannot listen on "
                      f"PLAINTEXT://127.0.0.1:{busy_port}: Address already in use"]
    assert not any(" ERROR " in line for line in result.stderr.splitlines())


def test_a_failed_start_leaves_no_listener_open(tmp_path: Path, busy_port: int) -> None:
    first = free_port()
    config = load_config(None, [
        f"dataDir={tmp_path}", "kafkaProtocolMap=A:PLAINTEXT,B:PLAINTEXT",
        f"kafkaListeners=A://127.0.0.1:{first},B://127.0.0.1:{busy_port}"])

    async def start() -> BrokerApp:
        app = BrokerApp(config)
        with pytest.raises(StartupError, match=f"B://127.0.0.1:{busy_port}"):
            await app.start()
        return app

    app = asyncio.run(start())
    assert app.servers == []
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", first), timeout=5).close()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(Path(tmp_path_factory.mktemp("data"))).start()
    yield process
    process.stop()


def test_a_client_reset_is_one_line_without_a_traceback(broker: BrokerProcess,
                                                        topic_name: str) -> None:
    conn = RawConnection(broker.port)
    assert create(conn, topic_name) == 0
    batch = record_batch(200, value=b"z" * 1000)
    for _ in range(20):
        produce(conn, topic_name, batch)
    part = FetchRequest.FetchTopic.FetchPartition(
        partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
        log_start_offset=-1, partition_max_bytes=8 << 20)
    fetch = conn.request_bytes(FetchRequest[11](
        replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=8 << 20, isolation_level=0,
        session_id=0, session_epoch=-1, topics=[FetchRequest.FetchTopic(
            topic=topic_name, partitions=[part])], forgotten_topics_data=[], rack_id=""), 11)
    for _ in range(3):  # responses larger than the socket buffers, then a reset
        victim = socket.create_connection(("127.0.0.1", broker.port))
        victim.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        victim.sendall((struct.pack(">i", len(fetch)) + fetch) * 4)
        time.sleep(0.3)
        victim.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        victim.close()  # RST
    broker.wait_for_log("connection from .* lost: Connection reset by peer")
    conn.close()
    assert broker.alive()
    assert "Traceback" not in broker.log_text()
    assert not any(" ERROR " in line for line in broker.lines)


def tls_handshake(port: int, tls: TlsFiles) -> socket.socket:
    """A plain socket over which a TLS handshake was done (so the test can then write
    bytes that are not TLS records)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    session = ssl.create_default_context(cafile=str(tls.ca)).wrap_bio(
        incoming, outgoing, server_hostname="localhost")
    while True:
        try:
            session.do_handshake()
            break
        except ssl.SSLWantReadError:
            sock.sendall(outgoing.read())
            incoming.write(sock.recv(65536))
    sock.sendall(outgoing.read())
    return sock


def test_garbage_after_a_tls_handshake_is_one_line(tmp_path: Path) -> None:
    """Garbage after the handshake, and clients gone before it: INFO lines, no traceback."""
    tls = make_tls(tmp_path / "certs")
    broker = BrokerProcess(tmp_path / "data", {"kafkaListeners": "SSL://127.0.0.1:0",
                                               **tls.broker_settings()}).start()
    try:
        for _ in range(2):
            sock = tls_handshake(broker.port, tls)
            sock.sendall(b"\x17\x03\x03\x00\x20" + b"\x55" * 32)  # a record that fails
            sock.settimeout(10)
            with contextlib.suppress(OSError):
                while sock.recv(65536):
                    pass  # the broker's alert, then its close
            sock.close()
        broker.wait_for_log("connection from .* on SSL lost: TLS error")
        for reset in (False, True):  # gone before any handshake: a probe, a reset
            probe = socket.create_connection(("127.0.0.1", broker.port))
            if reset:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            probe.close()
        broker.wait_for_log("lost during the TLS handshake")
        conn = SecureConnection(broker.port, tls.ca)
        assert create(conn, "after-garbage") == 0
        assert broker.alive()
    finally:
        broker.stop()  # with a TLS client still connected that never answers close_notify
    conn.close()
    assert "Traceback" not in broker.log_text()
    assert "Unhandled exception" not in broker.log_text()
    assert not any(" ERROR " in line for line in broker.lines)


def test_a_repeated_mistake_logs_a_bounded_number_of_lines(
        tmp_path: Path) -> None:
    """100 connections send Metadata before logging in; each is closed with a warning of
    the same cause, of which at most 5 per 10 s reach the log."""
    issuer = TokenIssuer("hmac", tmp_path / "keys")
    broker = BrokerProcess(tmp_path / "data", {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0", **issuer.settings}).start()
    try:
        started = time.monotonic()
        for _ in range(100):
            conn = RawConnection(broker.port)
            conn.send_frame(conn.request_bytes(MetadataRequest[1](topics=None), 1))
            assert conn.closed_by_peer()
            conn.close()
        periods = int((time.monotonic() - started) // 10) + 1
        assert broker.alive()
    finally:
        broker.stop()
    warned = [line for line in broker.lines
              if "request before SASL authentication" in line and " WARNING " in line]
    assert 1 <= len(warned) <= 5 * periods


def test_the_filter_says_how_many_lines_it_suppressed() -> None:
    now = [0.0]
    limiter = RepeatedWarningFilter(burst=2, period=10.0, clock=lambda: now[0])

    def record(message: str, *args: object, level: int = logging.WARNING) -> logging.LogRecord:
        return logging.LogRecord("edge", level, __file__, 1, message, args, None)

    cause = "closing connection from %s: %s"
    passed = [limiter.filter(record(cause, f"peer{i}", "bad")) for i in range(6)]
    assert passed == [True, True, False, False, False, False]
    assert limiter.filter(record("another cause %s", "x"))
    assert limiter.filter(record(cause, "peer", "quiet", level=logging.INFO))
    now[0] = 11.0
    later = record(cause, "peer9", "bad")
    assert limiter.filter(later)
    assert later.getMessage() == ("closing connection from peer9: bad (4 more like this "
                                  "suppressed since 11 s ago)")


def test_causes_invented_by_clients_fall_back_to_the_template() -> None:
    limiter = RepeatedWarningFilter(burst=1, period=10.0, clock=lambda: 0.0, max_causes=2)
    names = ["alpha", "beta", "gamma", "delta", "epsilon"]
    passed = [limiter.filter(logging.LogRecord("edge", logging.WARNING, __file__, 1,
                                               "unknown topic %s", (name,), None))
              for name in names]
    assert passed == [True, True, True, False, False]


def test_ended_windows_forgotten_for_room_say_what_they_suppressed(
        caplog: pytest.LogCaptureFixture) -> None:
    """When the cause table is full, the windows that ended make room; their suppressed
    counts were dropped with them, never written. One line says them first now."""
    now = [0.0]
    limiter = RepeatedWarningFilter(burst=1, period=10.0, clock=lambda: now[0], max_causes=2)

    def record(reason: str) -> logging.LogRecord:
        return logging.LogRecord("edge", logging.WARNING, __file__, 1, f"closing: {reason}",
                                 None, None)

    assert [limiter.filter(record("A")) for _ in range(6)] == [True] + [False] * 5
    assert [limiter.filter(record("B")) for _ in range(3)] == [True, False, False]
    now[0] = 11.0  # both windows ended; two new causes fill the table
    with caplog.at_level(logging.WARNING, logger="edge.log_limits"):
        assert limiter.filter(record("C"))
        assert limiter.filter(record("D"))
    assert [r.getMessage() for r in caplog.records if r.name == "edge.log_limits"] == [
        "7 more warnings of 2 causes whose windows ended were suppressed (those causes "
        "forgotten: more than 2 at once)"]
