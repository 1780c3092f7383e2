"""Failover of three brokers on one PostgreSQL, with real clients: transactions whose
coordinator is killed (before the commit: aborted, by the producer's re-init or by the
timeout; right after the commit: completed by the next coordinator) or moves after one of
its state writes failed (the next coordinator knows what the client was told), and the database
restarted under idempotent load. (The whole cluster stopped and started again is in
test_cluster_security, with ACLs.) And, step by step, the storage fact these rest on: a
broker taking a partition over serves it from where its last owner left it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Producer
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

from broker_core.storage import LogConfig, open_storage
from broker_core.storage.postgres import PgStorage
from tests.cluster.test_cluster import (
    PARTITIONS,
    check_exactly_once,
    consume_all,
    create,
    idempotent_load,
)
from tests.cluster.test_cluster_registry import SHORT_LEASE_MS, TOPIC, append, record
from tests.cluster_helpers import Cluster, running_cluster
from tests.group_helpers import wait_until
from tests.postgres_server import PostgresServer, shared_server
from tests.raw import RawConnection
from tests.storage.test_postgres_engine import (
    KAFKA_STORAGE_ERROR,
    NOT_LEADER_OR_FOLLOWER,
    fetch_error,
)
from tests.storage.test_postgres_speed import _lock_waits
from tests.txn_helpers import FAST_TXN

TXN_COORDINATOR = 1  # FindCoordinator key_type


def test_a_broker_taking_a_partition_over_serves_it_from_where_its_owner_left_it() -> None:
    url = shared_server().new_database_url()
    first = open_storage(url, LogConfig())
    second = open_storage(url, LogConfig())
    assert isinstance(first, PgStorage) and isinstance(second, PgStorage)
    try:
        first.create_topic(TOPIC, 1, {})
        first.cluster.register(record(0), SHORT_LEASE_MS)
        second.cluster.register(record(1), 60_000)
        assert first.cluster.claim([(TOPIC, 0)]) == {(TOPIC, 0): 1}
        cached = second.partition(TOPIC, 0)  # the second broker looked at it, empty
        assert cached is not None and cached.next_offset == 0
        assert [append(first) for _ in range(3)] == [0, 1, 2]
        time.sleep(SHORT_LEASE_MS / 1000 + 0.3)  # the first broker's lease runs out
        assert second.cluster.claim([(TOPIC, 0)]) == {(TOPIC, 0): 2}
        taken = second.partition(TOPIC, 0)
        assert taken is cached
        assert taken.next_offset == 3  # before any write: a fetch or a replay sees it all
        assert len(list(taken.batches_from(0))) == 3
    finally:
        first.close()
        second.close()


# -- transactions whose coordinator dies ------------------------------------------------------

def txn_coordinator(cluster: Cluster, transactional_id: str) -> int:
    """The id of the broker coordinating ``transactional_id`` (FindCoordinator)."""
    broker = next(b for b in cluster.brokers if b.alive())
    conn = RawConnection(broker.port)
    try:
        answer = conn.call(FindCoordinatorRequest[4](
            key_type=TXN_COORDINATOR, coordinator_keys=[transactional_id]), 4,
            FindCoordinatorResponse)
    finally:
        conn.close()
    (found,) = answer.coordinators
    assert found.error_code == 0, found
    return int(found.node_id)


def values_read(cluster: Cluster, topic: str, count: int, group: str) -> list[bytes]:
    """The values of ``count`` records a read_committed consumer reads, in partition order."""
    got = consume_all(cluster.bootstrap, topic, count, group, isolation="read_committed")
    return [value for p in sorted(got) for _, value in got[p]]


@pytest.mark.parametrize("ending", ["re-init", "timeout"])
def test_a_transaction_whose_coordinator_is_killed_before_the_commit_is_aborted(
        tmp_path: Path, topic_name: str, ending: str) -> None:
    """Records produced in a transaction, then kill -9 of its coordinator: the next
    coordinator aborts it when the producer initialises again (or when it times out), and
    read_committed readers never see its records, only the ones written after."""
    with running_cluster(tmp_path, settings=FAST_TXN) as cluster:
        create(cluster.bootstrap, topic_name)
        txid = f"tx-{topic_name}"
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": txid,
                             "transaction.timeout.ms": 4000})
        producer.init_transactions(30)
        producer.begin_transaction()
        for i in range(PARTITIONS * 5):
            producer.produce(topic_name, value=b"doomed", partition=i % PARTITIONS)
        assert producer.flush(30) == 0  # in the log, the transaction still open
        cluster.by_id(txn_coordinator(cluster, txid)).kill()
        after = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"} if
                         ending == "timeout" else {"bootstrap.servers": cluster.bootstrap,
                                                   "transactional.id": txid})
        if ending == "re-init":
            after.init_transactions(60)  # fences the first producer, aborts its transaction
            after.begin_transaction()
        for i in range(PARTITIONS * 2):
            after.produce(topic_name, value=b"after", partition=i % PARTITIONS)
        if ending == "re-init":
            after.commit_transaction(60)
        assert after.flush(60) == 0
        # read_committed: the last stable offset passes the open transaction only once it
        # is aborted (its markers written); then only the records after it are visible
        assert values_read(cluster, topic_name, PARTITIONS * 2, f"r-{topic_name}") == \
            [b"after"] * (PARTITIONS * 2)
        uncommitted = consume_all(cluster.bootstrap, topic_name, PARTITIONS * 7,
                                  f"u-{topic_name}")
        assert sorted(v for records in uncommitted.values() for _, v in records) == \
            [b"after"] * (PARTITIONS * 2) + [b"doomed"] * (PARTITIONS * 5)


def test_a_transaction_whose_coordinator_is_killed_right_after_the_commit_is_completed(
        tmp_path: Path, topic_name: str) -> None:
    """kill -9 of the coordinator as soon as commit_transaction returned (the markers may
    not all be written yet): the next coordinator completes the commit and read_committed
    readers see every record."""
    with running_cluster(tmp_path, settings=FAST_TXN) as cluster:
        create(cluster.bootstrap, topic_name)
        txid = f"tx-{topic_name}"
        coordinator = cluster.by_id(txn_coordinator(cluster, txid))
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": txid})
        producer.init_transactions(30)
        producer.begin_transaction()
        count = PARTITIONS * 50
        for i in range(count):
            producer.produce(topic_name, value=f"c{i}".encode(), partition=i % PARTITIONS)
        producer.commit_transaction(30)
        coordinator.kill()
        assert sorted(values_read(cluster, topic_name, count, f"r-{topic_name}")) == \
            sorted(f"c{i}".encode() for i in range(count))


def test_a_partition_added_after_a_failed_state_write_is_committed_after_a_move(
        tmp_path: Path, topic_name: str) -> None:
    """AddPartitionsToTxn whose ``__transaction_state`` commit fails (its backend ended
    while it waits for a row lock): the client's retry is written, not answered from the
    coordinator's memory, so after the coordinator moves (SIGTERM) the next one knows the
    partition, EndTxn writes its marker there, and read_committed readers see the whole
    transaction."""
    with running_cluster(tmp_path, 2, settings=FAST_TXN) as cluster:
        create(cluster.bootstrap, topic_name)
        txid = f"tx-{topic_name}"
        coordinator = cluster.by_id(txn_coordinator(cluster, txid))
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": txid})
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(topic_name, value=b"a0", partition=0)
        assert producer.flush(30) == 0  # partition 0 added and stored
        commits = "%SET next_offset = w.next%"
        with psycopg.connect(cluster.url) as locker:
            locker.execute("SELECT 1 FROM edge_partitions WHERE topic LIKE %s FOR UPDATE",
                           ("%/__transaction_state",))
            producer.produce(topic_name, value=b"a1", partition=1)
            producer.poll(0)
            wait_until(lambda: bool(_lock_waits(cluster.url, commits)), 30,
                       "the commit adding partition 1 to wait for the row lock")
            with psycopg.connect(cluster.url, autocommit=True) as killer:
                for pid, _ in _lock_waits(cluster.url, commits):
                    killer.execute("SELECT pg_terminate_backend(%s)", (pid,))
            locker.rollback()
        assert producer.flush(60) == 0
        assert coordinator.stop() == 0
        producer.commit_transaction(60)
        assert sorted(values_read(cluster, topic_name, 2, f"r-{topic_name}")) == \
            [b"a0", b"a1"]


# -- the database restarted under load --------------------------------------------------------

def test_a_database_restart_under_idempotent_load_loses_and_duplicates_nothing(
        own_server: PostgresServer, tmp_path: Path, topic_name: str) -> None:
    with running_cluster(tmp_path, url=own_server.new_database_url()) as cluster:
        create(cluster.bootstrap, topic_name)
        leader = cluster.by_id(cluster.leaders(topic_name)[0])
        stop, acked, errors = threading.Event(), [], []  # type: ignore[var-annotated]
        load = threading.Thread(target=idempotent_load,
                                args=(cluster.bootstrap, topic_name, stop, acked, errors))
        load.start()
        try:
            wait_until(lambda: len(acked) > 200, 30, "records acknowledged before")
            own_server.stop()
            conn = RawConnection(leader.port)
            try:  # a client at the partition's broker is told to retry
                assert fetch_error(conn, topic_name) in {KAFKA_STORAGE_ERROR,
                                                        NOT_LEADER_OR_FOLLOWER}
            finally:
                conn.close()
            time.sleep(3)  # past the brokers' leases: every broker gives its partitions up
            own_server.start()
            restarted = len(acked)
            wait_until(lambda: len(acked) > restarted + 200, 60,
                       "records acknowledged after the database came back")
        finally:
            stop.set()
            load.join(120)
        assert not load.is_alive(), "the load did not flush its records"
        assert not errors, errors[:3]
        got = consume_all(cluster.bootstrap, topic_name, len(acked))
        check_exactly_once(got, acked)
