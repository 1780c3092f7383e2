"""What one connection may make the broker hold: a client that pipelines fetches or parks
long polls and never reads, and clients that have not logged in, measured on a real
broker process (its resident memory) with raw sockets."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import pytest
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.protocol.sasl import SaslAuthenticateRequest

from broker_core.storage import FileRegion
from listeners.sendfile import write_parts
from tests.broker_process import BrokerProcess
from tests.protocol.test_bad_input import create, produce
from tests.raw import RawConnection, record_batch
from tests.security.test_audit import read_audit
from tests.security_helpers import (
    NONE,
    SASL_AUTHENTICATION_FAILED,
    Login,
    SecureConnection,
    TokenIssuer,
    plain_message,
)

MIB = 1 << 20
FETCHES = 200
PARKED = 300
PARTITIONS = 24


def rss_bytes(broker: BrokerProcess) -> int:
    """The broker process's resident memory (VmRSS)."""
    assert broker.proc is not None
    for line in Path(f"/proc/{broker.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS line")


def settled_rss(broker: BrokerProcess) -> int:
    """VmRSS once it stops growing (the broker has done what it will with what it read)."""
    last = rss_bytes(broker)
    for _ in range(40):
        time.sleep(0.5)
        now = rss_bytes(broker)
        if abs(now - last) < MIB // 2:
            return now
        last = now
    return last


def fetch_bytes(conn: RawConnection, topic: str, most: int = MIB) -> bytes:
    """A framed Fetch v11 for up to ``most`` bytes of partition 0 from offset 0."""
    part = FetchRequest.FetchTopic.FetchPartition(
        partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
        log_start_offset=-1, partition_max_bytes=most)
    request = FetchRequest[11](replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=most,
                               isolation_level=0, session_id=0, session_epoch=-1,
                               topics=[FetchRequest.FetchTopic(topic=topic, partitions=[part])],
                               forgotten_topics_data=[], rack_id="")
    payload = conn.request_bytes(request, 11)
    return struct.pack(">i", len(payload)) + payload


def test_pipelined_fetches_that_are_never_read_hold_bounded_memory(
        tmp_path: Path, topic_name: str) -> None:
    broker = BrokerProcess(tmp_path).start()
    try:
        setup = RawConnection(broker.port)
        assert create(setup, topic_name) == 0
        batch = record_batch(16, value=b"x" * 1000)  # ~16 KiB: read into memory, no region
        for _ in range(MIB // len(batch) + 1):
            assert produce(setup, topic_name, batch).error_code == 0  # type: ignore[attr-defined]
        setup.send_frame(fetch_bytes(setup, topic_name)[4:])
        assert len(setup.read_frame()) > MIB - 2 * len(batch)  # a fetch answers ~1 MiB
        setup.close()
        before = settled_rss(broker)

        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
        client.connect(("127.0.0.1", broker.port))
        conn = RawConnection.__new__(RawConnection)
        conn.sock, conn.correlation_id = client, 0
        client.sendall(b"".join(fetch_bytes(conn, topic_name) for _ in range(FETCHES)))
        grown = settled_rss(broker) - before
        # every fetch started and held: ~1 MiB each (194 MiB measured before the bound)
        assert grown < 48 * MIB, f"broker grew by {grown / MIB:.0f} MiB"

        client.settimeout(60)
        correlations = []
        for _ in range(FETCHES):
            frame = conn.read_frame()
            assert len(frame) > MIB - 2 * len(batch)
            correlations.append(struct.unpack_from(">i", frame)[0])
        assert correlations == list(range(1, FETCHES + 1))
        client.close()
        assert broker.alive()
    finally:
        broker.stop()


def reading_client(port: int) -> RawConnection:
    """A raw connection whose socket takes little before the broker must hold the rest."""
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
    client.connect(("127.0.0.1", port))
    conn = RawConnection.__new__(RawConnection)
    conn.sock, conn.correlation_id = client, 0
    return conn


def parked_fetch(conn: RawConnection, topic: str, min_bytes: int) -> bytes:
    """A framed Fetch v11 of every partition from offset 0 with a Java consumer's limits
    (50 MiB in all, 1 MiB a partition), parked for two minutes until ``min_bytes`` arrive."""
    parts = [FetchRequest.FetchTopic.FetchPartition(
        partition=p, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
        log_start_offset=-1, partition_max_bytes=MIB) for p in range(PARTITIONS)]
    request = FetchRequest[11](replica_id=-1, max_wait_ms=120_000, min_bytes=min_bytes,
                               max_bytes=50 * MIB, isolation_level=0, session_id=0,
                               session_epoch=-1, topics=[FetchRequest.FetchTopic(
                                   topic=topic, partitions=parts)],
                               forgotten_topics_data=[], rack_id="")
    payload = conn.request_bytes(request, 11)
    return struct.pack(">i", len(payload)) + payload


def produce_everywhere(conn: RawConnection, topic: str, batch: bytes) -> list[int]:
    """One Produce of ``batch`` to every partition (all appended before anything else
    runs); the error codes."""
    data = ProduceRequest.TopicProduceData(name=topic, partition_data=[
        ProduceRequest.TopicProduceData.PartitionProduceData(index=p, records=batch)
        for p in range(PARTITIONS)])
    answer = conn.call(ProduceRequest[9](transactional_id=None, acks=-1, timeout_ms=5000,
                                         topic_data=[data]), 9, ProduceResponse)
    return [part.error_code for part in answer.responses[0].partition_responses]


def test_long_polls_woken_together_hold_bounded_memory(tmp_path: Path,
                                                       topic_name: str) -> None:
    """A client parks many long-poll fetches on one connection and reads nothing; one
    append wakes them all. Each may answer 1.4 MiB: they must not all do so at once."""
    broker = BrokerProcess(tmp_path).start()
    try:
        setup = RawConnection(broker.port)
        assert create(setup, topic_name, PARTITIONS) == 0
        batch = record_batch(60, value=b"x" * 1000)  # under 64 KiB: read into memory
        assert len(batch) < 64 * 1024
        conn = reading_client(broker.port)
        conn.sock.sendall(b"".join(parked_fetch(conn, topic_name, PARTITIONS * len(batch))
                                   for _ in range(PARKED)))
        before = settled_rss(broker)
        assert produce_everywhere(setup, topic_name, batch) == [0] * PARTITIONS
        grown = settled_rss(broker) - before
        # every parked fetch answered at once: 300 x 1.4 MiB (420 MiB measured before);
        # now one runs at a time, as its bound (24 partitions x 1 MiB) exceeds 8 MiB
        assert grown < 32 * MIB, f"broker grew by {grown / MIB:.0f} MiB"

        conn.sock.settimeout(60)
        for correlation in range(1, PARKED + 1):
            frame = conn.read_frame()
            assert struct.unpack_from(">i", frame)[0] == correlation
            answer = FetchResponse[11].decode(frame[4:], version=11)
            parts = answer.responses[0].partitions
            assert [p.partition_index for p in parts] == list(range(PARTITIONS))
            assert all(p.error_code == 0 and bytes(p.records) == batch for p in parts)
        conn.close()
        setup.close()
        assert broker.alive()
    finally:
        broker.stop()


def test_a_request_behind_a_long_poll_larger_than_the_budget_waits_for_it(
        tmp_path: Path, topic_name: str) -> None:
    """A fetch whose limits exceed maxPendingResponseBytes runs alone: the request behind
    it starts once the fetch has answered, even when its long poll outlasts
    connectionMaxIdleMs (the client waits for the broker, not the other way round)."""
    broker = BrokerProcess(tmp_path, {"connectionMaxIdleMs": "1500",
                                      "maxPendingResponseBytes": str(MIB)}).start()
    try:
        conn = RawConnection(broker.port, timeout=30)
        assert create(conn, topic_name, PARTITIONS) == 0
        poll = FetchRequest.FetchTopic.FetchPartition(
            partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
            log_start_offset=-1, partition_max_bytes=8 * MIB)
        fetch = conn.request_bytes(FetchRequest[11](
            replica_id=-1, max_wait_ms=4000, min_bytes=1, max_bytes=8 * MIB,
            isolation_level=0, session_id=0, session_epoch=-1,
            topics=[FetchRequest.FetchTopic(topic=topic_name, partitions=[poll])],
            forgotten_topics_data=[], rack_id=""), 11)
        versions = conn.request_bytes(ApiVersionsRequest[3](
            client_software_name="t", client_software_version="1"), 3)
        conn.sock.sendall(b"".join(struct.pack(">i", len(payload)) + payload
                                   for payload in (fetch, versions)))
        answer = FetchResponse[11].decode(conn.read_frame()[4:], version=11)
        part = answer.responses[0].partitions[0]
        assert part.error_code == 0 and not part.records  # the long poll ran out
        frame = conn.read_frame()
        assert struct.unpack_from(">i", frame)[0] == conn.correlation_id
        assert ApiVersionsResponse[3].decode(frame[4:], version=3).error_code == NONE
        conn.close()
        assert "not read within the idle timeout" not in broker.log_text()
    finally:
        broker.stop()


def test_a_client_that_never_reads_is_closed_after_the_idle_timeout(
        tmp_path: Path, topic_name: str) -> None:
    broker = BrokerProcess(tmp_path, {"connectionMaxIdleMs": "2000",
                                      "maxPendingResponseBytes": str(MIB)}).start()
    try:
        setup = RawConnection(broker.port)
        assert create(setup, topic_name) == 0
        batch = record_batch(16, value=b"x" * 1000)
        for _ in range(MIB // len(batch) + 1):
            assert produce(setup, topic_name, batch).error_code == 0  # type: ignore[attr-defined]
        setup.close()
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
        client.connect(("127.0.0.1", broker.port))
        conn = RawConnection.__new__(RawConnection)
        conn.sock, conn.correlation_id = client, 0
        client.sendall(b"".join(fetch_bytes(conn, topic_name) for _ in range(20)))
        broker.wait_for_log("response bytes not read within the idle timeout", 30)
        assert conn.closed_by_peer()
        client.close()
        assert broker.alive()
    finally:
        broker.stop()


def test_a_slow_but_steady_reader_is_not_idle(tmp_path: Path, topic_name: str) -> None:
    """A consumer that takes a large response a little at a time (64 KiB every 50 ms:
    about 6 s for 8 MiB) makes progress all along: with connectionMaxIdleMs at 2 s it gets
    the whole response and the connection stays for the next fetch."""
    broker = BrokerProcess(tmp_path, {"connectionMaxIdleMs": "2000",
                                      "maxPendingResponseBytes": str(MIB)}).start()
    try:
        setup = RawConnection(broker.port)
        assert create(setup, topic_name) == 0
        batch = record_batch(16, value=b"x" * 1000)
        for _ in range(8 * MIB // len(batch) + 1):
            assert produce(setup, topic_name, batch).error_code == 0  # type: ignore[attr-defined]
        setup.close()
        conn = reading_client(broker.port)
        client = conn.sock
        client.sendall(fetch_bytes(conn, topic_name, 8 * MIB))
        client.settimeout(10)
        received = bytearray()
        while len(received) < 4 or len(received) < 4 + struct.unpack_from(">i", received)[0]:
            chunk = client.recv(64 * 1024)
            assert chunk, f"closed after {len(received)} bytes"
            received += chunk
            time.sleep(0.05)
        assert len(received) > 8 * MIB - 2 * len(batch)
        client.sendall(fetch_bytes(conn, topic_name))
        try:
            assert len(conn.read_frame()) > MIB - 2 * len(batch)
        except ConnectionError:
            raise AssertionError(broker.log_text()[-2000:]) from None
        client.close()
        assert "not read within the idle timeout" not in broker.log_text()
        assert broker.alive()
    finally:
        broker.stop()


def test_a_fetch_asking_for_everything_gets_fetch_max_bytes(tmp_path: Path,
                                                             topic_name: str) -> None:
    """Kafka's ``fetch.max.bytes``: a client asking for 2 GiB gets at most the broker's
    limit, so one fetch of small batches cannot make the broker read a whole log."""
    broker = BrokerProcess(tmp_path, {"fetchMaxBytes": str(MIB)}).start()
    try:
        conn = RawConnection(broker.port)
        assert create(conn, topic_name) == 0
        batch = record_batch(16, value=b"x" * 1000)
        for _ in range(3 * MIB // len(batch)):
            assert produce(conn, topic_name, batch).error_code == 0  # type: ignore[attr-defined]
        conn.send_frame(fetch_bytes(conn, topic_name, 2**31 - 1)[4:])
        size = len(conn.read_frame())
        assert MIB - 2 * len(batch) < size <= MIB + 1024
        conn.close()
    finally:
        broker.stop()


def test_a_region_sent_to_a_slow_reader_is_read_in_chunks(tmp_path: Path) -> None:
    """On TLS (no socket to ``sendfile`` to) or a full socket, a 32 MiB region goes
    through the transport a chunk at a time, not read whole into memory."""
    size = 32 * MIB
    path = tmp_path / "ledger"
    with path.open("wb") as out:
        out.truncate(size)
    file = path.open("rb")
    fd = file.fileno()

    async def exchange() -> tuple[int, int]:
        received = 0
        peak = 0

        async def serve(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal peak
            tracemalloc.start()
            try:
                await write_parts(writer, [b"head", FileRegion(fd, 0, size, b"")], None)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", server.sockets[0].getsockname()[1])
        await asyncio.sleep(0.2)  # the socket fills; the rest waits in the broker
        while chunk := await reader.read(1 << 20):
            received += len(chunk)
        writer.close()
        server.close()
        return received, peak

    try:
        received, peak = asyncio.run(exchange())
    finally:
        file.close()
    assert received == size + 4
    assert peak < 4 * MIB, f"{peak / MIB:.1f} MiB held while sending a 32 MiB region"


# -- before login -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def issuer(tmp_path_factory: pytest.TempPathFactory) -> TokenIssuer:
    return TokenIssuer("hmac", Path(tmp_path_factory.mktemp("keys")))


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory,
                issuer: TokenIssuer) -> Iterator[BrokerProcess]:
    """A SASL_PLAINTEXT listener (and a PLAINTEXT one to read the audit topic); frames of
    connections not logged in may hold 1 MiB."""
    broker = BrokerProcess(Path(tmp_path_factory.mktemp("sasl")), {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0,PLAINTEXT://127.0.0.1:0",
        "maxUnauthenticatedBufferedBytes": str(MIB), **issuer.settings,
    }).start()
    yield broker
    broker.stop()


def api_versions_answered(port: int) -> bool:
    conn = RawConnection(port)
    try:
        answer = conn.call(ApiVersionsRequest[3](client_software_name="t",
                                                 client_software_version="1"), 3,
                           ApiVersionsResponse)
        return bool(answer.error_code == NONE)
    finally:
        conn.close()


def test_a_large_frame_before_login_is_refused_with_one_line(sasl_broker: BrokerProcess) -> None:
    size = 600 * 1024
    conn = RawConnection(sasl_broker.port)
    conn.sock.sendall(struct.pack(">i", size) + b"\0" * 1024)
    assert conn.closed_by_peer()
    conn.close()
    sasl_broker.wait_for_log(f"frame size {size} ")
    lines = [line for line in sasl_broker.lines if f"frame size {size} " in line]
    assert len(lines) == 1 and "524288" in lines[0] and "before authentication" in lines[0]
    assert "Traceback" not in sasl_broker.log_text()
    assert api_versions_answered(sasl_broker.port)
    events = read_audit(f"127.0.0.1:{sasl_broker.ports['PLAINTEXT']}",
                        {("connection", "rejected")})
    assert any(event["outcome"] == "rejected" and "before authentication" in str(event["reason"])
               for event in events)


def test_after_login_the_listener_frame_limit_applies(sasl_broker: BrokerProcess,
                                                      issuer: TokenIssuer,
                                                      topic_name: str) -> None:
    conn = SecureConnection(sasl_broker.port)
    conn.login("public", issuer.token("alice"))
    assert create(conn, topic_name) == 0
    big = record_batch(600, value=b"y" * 1000)  # ~600 KiB in one frame
    assert len(big) > 524288
    answer = produce(conn, topic_name, big)
    assert answer.error_code == NONE  # type: ignore[attr-defined]
    conn.close()


def start_large_frame(port: int, size: int = 500 * 1024, sent: int = 400 * 1024
                      ) -> RawConnection:
    """A connection that sends ``sent`` bytes of a ``size``-byte frame and stops there."""
    conn = RawConnection(port)
    conn.sock.sendall(struct.pack(">i", size) + b"\0" * sent)
    return conn


def test_connections_not_logged_in_share_one_budget(sasl_broker: BrokerProcess) -> None:
    """Each sends 400 KiB of a large frame and stops: two fit in the 1 MiB budget, a
    third is closed, and once the first two go, the budget is free again."""
    first, second = start_large_frame(sasl_broker.port), start_large_frame(sasl_broker.port)
    assert not first.closed_by_peer(1.0) and not second.closed_by_peer(1.0)
    third = start_large_frame(sasl_broker.port)
    assert third.closed_by_peer()
    sasl_broker.wait_for_log("frames of connections not logged in already hold")
    for conn in (first, second, third):
        conn.close()
    deadline = time.monotonic() + 10
    while (sum("closed after 409600 of 512000 frame bytes" in line
               for line in sasl_broker.lines) < 2 and time.monotonic() < deadline):
        time.sleep(0.05)  # until the broker has seen both go
    fourth = start_large_frame(sasl_broker.port)
    assert not fourth.closed_by_peer(1.0)
    fourth.close()
    assert sasl_broker.alive()


def test_a_full_budget_does_not_stop_a_login(sasl_broker: BrokerProcess, issuer: TokenIssuer,
                                             topic_name: str) -> None:
    """Sizes declared by frames that never come hold nothing, and frames that do come fill
    the budget only for frames larger than any login: librdkafka still logs in."""
    before = sum("already hold" in line for line in sasl_broker.lines)
    declared = []
    for _ in range(16):  # 8 MiB declared: eight times the budget
        conn = RawConnection(sasl_broker.port)
        conn.sock.sendall(struct.pack(">i", 524288))
        declared.append(conn)
    holders = [start_large_frame(sasl_broker.port) for _ in range(2)]
    # their bytes read (and held) before the third's: which connection's read crosses
    # the budget depends on how reads interleave
    assert not any(conn.closed_by_peer(1.0) for conn in holders)
    refused = start_large_frame(sasl_broker.port)
    assert refused.closed_by_peer()  # the budget is full of bytes that did arrive
    refused.close()
    login = Login(f"127.0.0.1:{sasl_broker.ports['SASL_PLAINTEXT']}", "SASL_PLAINTEXT",
                  "public", issuer.token("alice"))
    producer = confluent_kafka.Producer({**login.confluent(), "socket.timeout.ms": "10000"})
    producer.produce(topic_name, b"logged in past a full budget")
    assert producer.flush(30) == 0
    assert sum("already hold" in line for line in sasl_broker.lines) == before + 1
    assert all(not conn.closed_by_peer(0.2) for conn in declared + holders)
    for conn in declared + holders:
        conn.close()
    assert sasl_broker.alive()


def test_a_frame_trickled_before_login_gives_its_budget_back(tmp_path: Path,
                                                             issuer: TokenIssuer) -> None:
    """A frame before login must arrive within connectionMaxIdleMs: connections that send
    part of one and wait are closed, and the bytes they held are free again for a large
    frame (a login with a 400 KiB token, answered with its failure)."""
    broker = BrokerProcess(tmp_path, {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0", "connectionMaxIdleMs": "1500",
        "maxUnauthenticatedBufferedBytes": str(MIB), **issuer.settings}).start()
    try:
        holders = [start_large_frame(broker.port, 524288, 500 * 1024) for _ in range(2)]
        for conn in holders:
            assert conn.closed_by_peer(30)
            conn.close()
        broker.wait_for_log("was not complete within the idle timeout")
        conn = SecureConnection(broker.port)
        assert conn.handshake("PLAIN").error_code == NONE
        answer = conn.authenticate(plain_message("public", "token:" + "x" * 400 * 1024))
        assert answer.error_code == SASL_AUTHENTICATION_FAILED
        conn.close()
        assert "already hold" not in broker.log_text()
        assert broker.alive()
    finally:
        broker.stop()


def test_a_small_frame_begun_before_login_must_end_within_the_idle_timeout(
        tmp_path: Path, issuer: TokenIssuer) -> None:
    """A login-sized frame whose size arrived but not all of its bytes: closed after
    connectionMaxIdleMs with one line; a login meanwhile is served."""
    broker = BrokerProcess(tmp_path, {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0", "connectionMaxIdleMs": "1500",
        **issuer.settings}).start()
    try:
        stuck = start_large_frame(broker.port, 100, 10)
        conn = SecureConnection(broker.port)
        assert conn.handshake("PLAIN").error_code == NONE
        conn.close()
        assert stuck.closed_by_peer(30)
        stuck.close()
        broker.wait_for_log("a frame of 100 bytes before authentication was not complete "
                            "within the idle timeout")
        assert broker.alive()
    finally:
        broker.stop()


def test_bytes_sent_while_a_login_fails_are_not_read(tmp_path: Path,
                                                     issuer: TokenIssuer) -> None:
    """While a failed login waits (failedAuthenticationDelayMs), what a client pipelines
    behind it stays in the socket: 40 connections pushing 2 MiB each do not grow the
    broker by 2 MiB each (81 MiB measured before)."""
    broker = BrokerProcess(tmp_path, {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0",
        "failedAuthenticationDelayMs": "60000", **issuer.settings}).start()
    try:
        before = settled_rss(broker)
        conns = []
        for _ in range(40):
            conn = SecureConnection(broker.port)
            assert conn.handshake("PLAIN").error_code == NONE
            conn.send_frame(conn.request_bytes(SaslAuthenticateRequest[2](
                auth_bytes=plain_message("public", "token:forged")), 2))
            pushed = 0
            conn.sock.setblocking(False)
            while pushed < 2 * MIB:
                try:
                    pushed += conn.sock.send(b"\0" * (64 * 1024))
                except BlockingIOError:
                    time.sleep(0.05)
                    try:
                        pushed += conn.sock.send(b"\0" * (64 * 1024))
                    except BlockingIOError:
                        break  # the broker reads no more
            conns.append(conn)
        grown = settled_rss(broker) - before
        assert grown < 24 * MIB, f"broker grew by {grown / MIB:.0f} MiB"
        for conn in conns:
            conn.close()
        assert broker.alive()
    finally:
        broker.stop()
