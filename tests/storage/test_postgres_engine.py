"""What only the ``postgres://`` engine has: everything survives a reopen, schema versions
are checked at start, and a database that goes away and comes back loses nothing
acknowledged. On a real PostgreSQL server (``tests/postgres_server.py``)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import confluent_kafka
import psycopg
import psycopg_pool
import pytest
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
)

from broker_core.storage import LogConfig, SchemaTooNew, open_storage
from broker_core.storage.cluster import MarkerRequest
from broker_core.storage.pg_database import unavailable
from broker_core.storage.pg_schema import SCHEMA_VERSION
from tests.broker_process import REPO, BrokerProcess
from tests.clients import PARTITIONS, Rec, create_topic, make_records
from tests.ports import free_port
from tests.postgres_server import PostgresServer, shared_server
from tests.raw import RawConnection
from tests.storage.test_storage_engines import TOPIC, append, partition
from tests.storage_helpers import batch_bytes, check_log, delivered_at


@pytest.fixture
def url() -> str:
    return shared_server().new_database_url()


def test_a_reopened_database_holds_everything(url: str) -> None:
    storage = open_storage(url, LogConfig(segment_bytes=300))
    info = storage.create_topic(TOPIC, 2, {"retention.ms": "-1"})
    log = partition(storage)
    bases = [append(log, n) for n in (3, 2, 4, 1)]
    assert log.delete_records_before(4) == 4
    storage.kv.put("meta.properties", b"cluster")
    log.state.put("producer-state.json", b"{}")
    assert storage.close() == []

    again = open_storage(url, LogConfig(segment_bytes=300))
    try:
        assert again.topics() == [info]
        log = partition(again)
        assert (log.log_start_offset, log.next_offset) == (4, 10)
        assert log.opened_next_offset == 10
        assert [int.from_bytes(batch_bytes(c)[:8], "big") for c in log.read(4, 1 << 20)] \
            == bases[1:]
        assert again.kv.get("meta.properties") == b"cluster"
        assert log.state.get("producer-state.json") == b"{}"
        assert append(log, 2) == 10  # offsets go on where they were
        assert partition(again, index=1).next_offset == 0
    finally:
        again.close()


def test_a_queued_transaction_end_keeps_its_coordinator_epoch(url: str) -> None:
    """A marker request carries its coordinator epoch through the queue; one an older
    broker queued (schema 4: no such column) reads back as -1, unknown."""
    storage = open_storage(url, LogConfig())
    try:
        cluster = storage.cluster
        (first,) = cluster.request_markers([MarkerRequest(TOPIC, 1, 7, 2, True, None, 5)])
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("INSERT INTO edge_marker_requests (topic, partition, producer_id,"
                         " producer_epoch, commit) VALUES (%s, 0, 7, 2, false)", (TOPIC,))
        assert [m for _, m in cluster.pending_markers()] == [
            MarkerRequest(TOPIC, 1, 7, 2, True, None, 5),
            MarkerRequest(TOPIC, 0, 7, 2, False, None, -1)]
        assert first == cluster.pending_markers()[0][0]
    finally:
        storage.close()


def test_the_location_never_shows_the_password() -> None:
    server = shared_server()
    url = server.new_database_url()
    with_password = url.replace("edge@", "edge:secret@")  # trust auth: any password does
    storage = open_storage(with_password)
    try:
        assert "secret" not in storage.location
        assert storage.location == url and storage.names_location(url)
    finally:
        storage.close()


def test_a_multi_host_url_reaches_the_host_that_answers(url: str) -> None:
    """libpq's failover form: hosts tried in order, the first read-write one used."""
    down = f"127.0.0.1:{free_port()}"
    port = shared_server().port
    multi = url.replace(f"edge@127.0.0.1:{port}", f"edge:secret@{down},127.0.0.1:{port}")
    storage = open_storage(multi + "?target_session_attrs=read-write")
    try:
        storage.create_topic(TOPIC, 1, {})
        assert storage.location == url.replace(f"127.0.0.1:{port}", f"{down},127.0.0.1:{port}")
    finally:
        storage.close()
    reopened = open_storage(url)
    try:
        assert reopened.topic(TOPIC) is not None
    finally:
        reopened.close()


def test_a_newer_schema_stops_start_up_with_one_line(url: str, tmp_path: Path) -> None:
    open_storage(url).close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE edge_schema_version SET version = %s", (SCHEMA_VERSION + 1,))
    with pytest.raises(SchemaTooNew, match=f"version {SCHEMA_VERSION + 1}"):
        open_storage(url)
    result = subprocess.run(
        [sys.executable, "-m", "edge.cli", "--set", f"storageUrl={url}",
         "--set", "kafkaListeners=PLAINTEXT://127.0.0.1:0", "--set", f"dataDir={tmp_path}/d"],
        cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "schema version" in lines[0], result.stderr
    with psycopg.connect(url) as conn:  # nothing was changed
        assert conn.execute("SELECT version FROM edge_schema_version").fetchall() == [
            (SCHEMA_VERSION + 1,)]


KAFKA_STORAGE_ERROR = 56
NOT_LEADER_OR_FOLLOWER = 6


def fetch_error(conn: RawConnection, topic: str) -> int:
    """The error code of a fetch at offset 0 of partition 0."""
    part = FetchRequest.FetchTopic.FetchPartition(
        partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
        log_start_offset=-1, partition_max_bytes=1 << 20)
    request = FetchRequest[11](replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                               isolation_level=0, session_id=0, session_epoch=-1,
                               topics=[FetchRequest.FetchTopic(topic=topic, partitions=[part])],
                               forgotten_topics_data=[], rack_id="")
    return int(conn.call(request, 11, FetchResponse).responses[0].partitions[0].error_code)


def offset_for_time_error(conn: RawConnection, topic: str) -> int:
    """The error code of a ListOffsets by time on partition 0."""
    part = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
        partition_index=0, current_leader_epoch=-1, timestamp=1_700_000_000_000)
    answer = conn.call(ListOffsetsRequest[7](replica_id=-1, isolation_level=0, topics=[
        ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[part])]), 7,
        ListOffsetsResponse)
    return int(answer.topics[0].partitions[0].error_code)


def test_a_database_restart_loses_nothing_acknowledged(own_server: PostgresServer,
                                                       tmp_path: Path,
                                                       topic_name: str) -> None:
    broker = BrokerProcess(tmp_path / "data",
                           {"storageUrl": own_server.new_database_url()}).start()
    try:
        create_topic(broker.bootstrap, topic_name)
        records = make_records(200, 1_700_000_000_000)
        delivered: dict[bytes, tuple[int, int]] = {}  # value -> (partition, offset)
        errors: list[object] = []
        producer = confluent_kafka.Producer({
            "bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 5,
            "enable.idempotence": True, "message.timeout.ms": 120_000})

        def report(err: object, msg: confluent_kafka.Message) -> None:
            if err is not None:
                errors.append(err)
            else:
                delivered[msg.value() or b""] = delivered_at(msg)

        def produce(recs: list[Rec]) -> None:
            for rec in recs:
                producer.produce(topic_name, key=rec.key, value=rec.value,
                                 partition=rec.partition, on_delivery=report)
                producer.poll(0)

        produce(records[:100])
        assert producer.flush(60) == 0 and errors == [] and len(delivered) == 100
        own_server.stop()
        mark = len(broker.lines)
        conn = RawConnection(broker.port)  # reads meet the stopped database too
        try:
            # retriable either way: once the lease must have run out, the broker stops
            # claiming the partition (another broker may have taken it)
            retriable = {KAFKA_STORAGE_ERROR, NOT_LEADER_OR_FOLLOWER}
            assert fetch_error(conn, topic_name) in retriable
            assert offset_for_time_error(conn, topic_name) in retriable
            assert fetch_error(conn, topic_name) in retriable  # still connected
        finally:
            conn.close()
        produce(records[100:])  # these meet the stopped database: retried by the client
        flushing = threading.Thread(target=producer.flush, args=(150,))
        flushing.start()
        # a write meets the stopped database, or (once the lease ran out) the broker gives
        # up its partitions until it can claim them again: either is said once
        broker.wait_for_log(r"storage: cannot write .*PostgreSQL unreachable|registry "
                            r"unreachable", 60, mark)
        own_server.start()
        flushing.join()
        assert producer.flush(60) == 0
        assert errors == [], errors
        assert len(delivered) == 200
        log = "\n".join(broker.lines[mark:])
        assert log.count("storage: cannot write") <= 1, log  # once per cause
        assert log.count("cannot claim partitions") <= 1, log
        if "storage: cannot write" in log:
            broker.wait_for_log(r"succeed again", 30, mark)
        # each acknowledged record where its delivery report said, none twice, no gap
        got = check_log(broker.bootstrap, topic_name, delivered, 200, PARTITIONS)
        assert sorted((g.partition, g.rec.key or b"", g.rec.value or b"") for g in got) == sorted(
            (r.partition, r.key, r.value) for r in records)  # every record, in its partition
        assert broker.stop() == 0
    finally:
        if broker.alive():
            broker.kill()


def test_a_transaction_left_idle_gives_its_locks_up(url: str) -> None:
    """A broker stopped between two statements of a transaction (SIGSTOP, a paused VM)
    keeps its connection, and would keep its row locks for as long as it is stopped: the
    server ends such a session after the statement timeout, so another broker's write of
    the same row goes through instead of timing out again and again."""
    from broker_core.storage.errors import DatabaseUnavailable
    from broker_core.storage.pg_database import Database

    stopped = Database(url, "a stopped broker")
    other = Database(url, "another broker")
    try:
        with pytest.raises(DatabaseUnavailable), stopped.tx() as conn:
            conn.execute("UPDATE edge_registry_clock SET heard = now()")
            # the other broker's write of the locked row, from a thread: it waits
            done = threading.Event()

            def write() -> None:
                other.statement("UPDATE edge_registry_clock SET heard = now()", {})
                done.set()

            writer = threading.Thread(target=write)
            writer.start()
            writer.join(12)  # "stopped" meanwhile: idle in its transaction
            assert done.is_set()  # the server ended the idle session: the lock went
        writer.join()
    finally:
        stopped.close()
        other.close()


@pytest.mark.parametrize(("error", "said"), [
    (psycopg.OperationalError("connection refused"), "unreachable"),
    (psycopg.errors.AdminShutdown("terminating connection"), "unreachable"),
    (psycopg_pool.PoolTimeout("no connection in 5 s"), "unreachable"),
    (psycopg.errors.DeadlockDetected("deadlock detected"), "error"),
    (psycopg.errors.QueryCanceled("canceling statement due to statement timeout"), "error"),
])
def test_a_failed_statement_is_not_called_an_unreachable_database(
        error: Exception, said: str) -> None:
    """The cause logged (once per cause) says which: the database out of reach, or one
    statement it ended (a deadlock, a timeout) while it is there."""
    assert unavailable(error).strerror == f"PostgreSQL {said}: {error}"
