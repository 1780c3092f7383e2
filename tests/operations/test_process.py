"""The broker process: start-up errors name the bad key, the ready line names every listener,
and SIGTERM answers in-flight requests, seals ledgers and saves partition metadata."""

from __future__ import annotations

import contextlib
import fcntl
import json
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.producer import ProduceRequest

from tests.broker_process import REPO, BrokerProcess
from tests.clients import create_topic, make_records, produce_confluent
from tests.protocol.test_bad_input import create, produce
from tests.raw import RawConnection, record_batch


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edge.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize(("args", "named"), [
    (["--set", "kafkaListener=PLAINTEXT://127.0.0.1:0"], "kafkaListener"),
    (["--set", "brokerId=minus-one"], "brokerId"),
    (["--set", "allowAutoTopicCreation=maybe"], "allowAutoTopicCreation"),
    (["--set", "kafkaListeners=FOO://127.0.0.1:0"], "kafkaListeners"),
    (["--set", "kafkaListeners=A://127.0.0.1:0,A://127.0.0.1:1",
      "--set", "kafkaProtocolMap=A:PLAINTEXT"], "kafkaListeners"),
    (["--set", "kafkaAdvertisedListeners=OTHER://example.com:9092"],
     "kafkaAdvertisedListeners"),
    (["--set", "noequals"], "noequals"),
    (["--set", "kafkaNamespace=__kafka"], "'kafkaMetadataNamespace'"),
    (["--set", "kafkaMetadataNamespace=default"], "'kafkaNamespace'"),
])
def test_bad_config_stops_startup_naming_the_key(args: list[str], named: str) -> None:
    result = run_cli(*args)
    assert result.returncode == 2
    assert "configuration error" in result.stderr
    assert named in result.stderr


def test_config_file_and_overrides(tmp_path: Path) -> None:
    conf = tmp_path / "broker.properties"
    conf.write_text(
        "# a comment\n"
        "kafkaListeners = PLAINTEXT://127.0.0.1:0\n"
        f"dataDir={tmp_path / 'data'}\n"
        "brokerId=3\n"
        "kafkaAdvertisedListeners=PLAINTEXT://broker.example:19092\n"
        "unknownKey=1\n"
    )
    bad = run_cli("--config", str(conf))
    assert bad.returncode == 2 and "unknownKey" in bad.stderr
    conf.write_text(conf.read_text().replace("unknownKey=1\n", ""))
    # run the CLI with --config plus an override that wins over the file
    proc = subprocess.Popen([sys.executable, "-m", "edge.cli", "--config", str(conf),
                             "--set", "brokerId=7"], cwd=REPO, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    while "edge-broker ready" not in line:
        line = proc.stderr.readline()
        assert line, "broker exited before it was ready"
    proc.terminate()
    proc.wait(20)
    assert "broker 7" in line
    assert "advertised broker.example:19092" in line


def test_sigterm_answers_in_flight_requests_and_seals(tmp_path: Path, topic_name: str) -> None:
    broker = BrokerProcess(tmp_path).start()
    try:
        create_topic(broker.bootstrap, topic_name, 1)
        produce_confluent(broker.bootstrap, topic_name,
                          [r for r in make_records(30, 1) if r.partition == 0], "none")
        conn = RawConnection(broker.port, timeout=20)
        part = FetchRequest.FetchTopic.FetchPartition(
            partition=0, current_leader_epoch=-1, fetch_offset=10, last_fetched_epoch=-1,
            log_start_offset=-1, partition_max_bytes=1 << 20)
        request = FetchRequest[11](replica_id=-1, max_wait_ms=8000, min_bytes=1 << 20,
                                   max_bytes=1 << 20, isolation_level=0, session_id=0,
                                   session_epoch=-1, topics=[FetchRequest.FetchTopic(
                                       topic=topic_name, partitions=[part])],
                                   forgotten_topics_data=[], rack_id="")
        answer: list[object] = []
        waiter = threading.Thread(target=lambda: answer.append(
            conn.call(request, 11, FetchResponse)))
        started = time.monotonic()
        waiter.start()
        time.sleep(0.5)  # the fetch is parked waiting for min_bytes
        assert broker.stop() == 0
        waiter.join(20)
        assert answer, "the in-flight fetch was not answered"
        partition = answer[0].responses[0].partitions[0]  # type: ignore[attr-defined]
        assert partition.error_code == 0
        assert partition.high_watermark == 10
        assert time.monotonic() - started < 8  # answered at shutdown, not at max_wait
        conn.close()
        meta = json.loads(next(tmp_path.rglob("partition.json")).read_text())
        assert meta["properties"]["index"] == 10
        assert all(ledger["sealed"] for ledger in meta["ledgers"])
        assert "edge-broker stopped" in broker.log_text()
    finally:
        broker.kill()


def test_pipelined_requests_answer_in_order_with_a_small_queue(tmp_path: Path,
                                                               topic_name: str) -> None:
    broker = BrokerProcess(tmp_path, {"maxQueuedRequests": "2"}).start()
    try:
        conn = RawConnection(broker.port)
        assert create(conn, topic_name) == 0
        frames = b""
        first = conn.correlation_id + 1
        for i in range(60):  # produce and metadata requests, all written at once
            if i % 2:
                payload = conn.request_bytes(MetadataRequest[1](topics=None), 1)
            else:
                data = ProduceRequest.TopicProduceData(name=topic_name, partition_data=[
                    ProduceRequest.TopicProduceData.PartitionProduceData(
                        index=0, records=record_batch(1))])
                payload = conn.request_bytes(ProduceRequest[9](
                    transactional_id=None, acks=-1, timeout_ms=5000, topic_data=[data]), 9)
            frames += len(payload).to_bytes(4, "big") + payload
        conn.sock.sendall(frames)
        correlations = [int.from_bytes(conn.read_frame()[:4], "big") for _ in range(60)]
        assert correlations == list(range(first, first + 60))
        assert produce(conn, topic_name, record_batch(1)).base_offset == 30  # all 30 went in
        conn.close()
    finally:
        broker.stop()


def test_sigterm_exits_while_a_client_leaves_its_answers_unread(tmp_path: Path) -> None:
    """A client that pipelines requests and reads none of the answers holds its
    connection's queue full; after the grace period the broker drops it and exits (it
    used to log "edge-broker stopped" and hang: the connection's end marker waited for
    room in the full queue, and its write loop swallowed the cancellation)."""
    broker = BrokerProcess(tmp_path).start()
    try:
        payload = RawConnection(broker.port).request_bytes(MetadataRequest[1](topics=None), 1)
        frames = (len(payload).to_bytes(4, "big") + payload) * 200_000
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before the handshake
        sock.connect(("127.0.0.1", broker.port))
        sending = threading.Thread(target=_send_until_closed, args=(sock, frames),
                                   daemon=True)  # blocks once the broker stops reading
        sending.start()
        _until_steady(lambda: _unsent(sock))  # the broker stopped reading: stuck
        assert broker.stop(timeout=30) == 0
        assert "edge-broker stopped" in broker.log_text()
        sending.join(10)
        assert not sending.is_alive(), "the broker did not drop the connection"
        sock.close()
    finally:
        broker.kill()


def _send_until_closed(sock: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):
        sock.sendall(data)


def _unsent(sock: socket.socket) -> int:
    """The bytes waiting in ``sock``'s send queue."""
    return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0])


def _until_steady(measure: Callable[[], int], seconds: float = 60.0) -> None:
    """Wait until ``measure()`` is above 0 and unchanged for a second."""
    last, since = -1, time.monotonic()
    deadline = since + seconds
    while time.monotonic() < deadline:
        now = measure()
        if now != last:
            last, since = now, time.monotonic()
        elif now > 0 and time.monotonic() - since >= 1.0:
            return
        time.sleep(0.1)
    raise AssertionError("the measure never settled")
