"""WriteTxnMarkers: an administrator aborts a hanging transaction (KIP-664's
``abortTransaction``, here through kafka-python's ``KafkaAdminClient.abort_transaction`` and
a raw request); the last stable offset moves on and read_committed readers skip the aborted
records. Refusals (unknown topic or partition, a stale producer epoch or coordinator
epoch, no producer id, a system topic) answer Kafka's codes and write nothing. Authorization is in
``tests/security/test_security_cluster_rights.py``, the partition another broker leads in
``tests/cluster/test_cluster_txn_markers.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, TopicPartition
from kafka.admin import AbortTransactionSpec

from tests.broker_process import BrokerProcess
from tests.txn_helpers import (
    INVALID_PRODUCER_EPOCH,
    NONE,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    UNKNOWN_TOPIC_OR_PARTITION,
    TxnConnection,
    batch,
    produce_plain,
    read_all,
    start_broker,
)

INVALID_TOPIC_EXCEPTION = 17
INVALID_REQUEST = 42
TRANSACTION_COORDINATOR_FENCED = 52
LONG_TXN_MS = 600_000
"""A transaction timeout no test outlives: the coordinator never aborts it on its own."""


@pytest.fixture(scope="module")
def txn_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = start_broker(Path(tmp_path_factory.mktemp("txn-markers")))
    yield process
    process.stop()


@pytest.fixture
def conn(txn_broker: BrokerProcess) -> Iterator[TxnConnection]:
    c = TxnConnection(txn_broker.port, timeout=60)
    yield c
    c.close()


def open_transaction(conn: TxnConnection, tid: str, topic: str,
                     partitions: list[int]) -> tuple[int, int]:
    """A transaction with three records in each partition, left open; its (pid, epoch)."""
    pid, epoch = conn.init_ok(tid, LONG_TXN_MS)
    assert conn.add_partitions(tid, pid, epoch, {topic: partitions}) == {
        (topic, p): NONE for p in partitions}
    for p in partitions:
        code, _ = conn.produce(topic, batch(pid, epoch, 0, 3, transactional=True,
                                            prefix="hanging"), p, tid)
        assert code == NONE
    return pid, epoch


def test_abort_of_a_hanging_transaction_moves_the_lso(txn_broker: BrokerProcess,
                                                       conn: TxnConnection,
                                                       topic_name: str) -> None:
    assert conn.create_topic(topic_name, 2) == NONE
    pid, epoch = open_transaction(conn, "hanging", topic_name, [0, 1])
    produce_plain(txn_broker.bootstrap, topic_name,
                  [(p, f"after-{p}".encode()) for p in (0, 1)])
    for p in (0, 1):  # the open transaction holds read_committed readers at its start
        assert conn.list_offset(topic_name, p, READ_UNCOMMITTED) == 4
        assert conn.list_offset(topic_name, p, READ_COMMITTED) == 0
    producers = conn.describe_producers(topic_name, [0]).topics[0].partitions[0]
    [state] = [s for s in producers.active_producers if s.producer_id == pid]
    assert (state.producer_epoch, state.current_txn_start_offset) == (epoch, 0)

    # partition 0 by kafka-python's admin client (KIP-664), partition 1 by a raw request
    admin = KafkaAdminClient(bootstrap_servers=txn_broker.bootstrap, request_timeout_ms=30_000)
    try:
        admin.abort_transaction(AbortTransactionSpec(
            topic_partition=TopicPartition(topic_name, 0), producer_id=pid,
            producer_epoch=epoch, coordinator_epoch=state.coordinator_epoch))
    finally:
        admin.close()
    assert conn.write_markers(pid, epoch, False, {topic_name: [1]}) == {(topic_name, 1): NONE}

    for p in (0, 1):  # the marker took an offset; nothing is held back any more
        assert conn.list_offset(topic_name, p, READ_UNCOMMITTED) == 5
        assert conn.list_offset(topic_name, p, READ_COMMITTED) == 5
        assert conn.committed_values(topic_name, p) == [f"after-{p}".encode()]
    producers = conn.describe_producers(topic_name, [0, 1]).topics[0].partitions
    assert all(s.current_txn_start_offset == -1 for part in producers
               for s in part.active_producers), producers
    got = read_all(txn_broker.bootstrap, topic_name, 2, "read_committed")
    assert sorted((p, value) for p, _, value in got) == [(0, b"after-0"), (1, b"after-1")]
    assert len(read_all(txn_broker.bootstrap, topic_name, 2, "read_uncommitted")) == 8


def test_commit_marker_makes_the_records_visible(conn: TxnConnection,
                                                 topic_name: str) -> None:
    assert conn.create_topic(topic_name, 1) == NONE
    pid, epoch = open_transaction(conn, "to-commit", topic_name, [0])
    assert conn.write_markers(pid, epoch, True, {topic_name: [0]}) == {(topic_name, 0): NONE}
    assert conn.list_offset(topic_name, 0, READ_COMMITTED) == 4
    assert conn.committed_values(topic_name, 0) == [b"hanging-0", b"hanging-1", b"hanging-2"]


def test_refusals_write_nothing(conn: TxnConnection, topic_name: str) -> None:
    assert conn.create_topic(topic_name, 1) == NONE
    pid, epoch = open_transaction(conn, "refused", topic_name, [0])
    # the partition knows the producer at a newer epoch: an idempotent batch at epoch 5
    other, _ = conn.init_ok(None)
    assert conn.produce(topic_name, batch(other, 5, 0), 0)[0] == NONE
    got = conn.write_markers(other, 4, False, {topic_name: [0, 7],
                                               f"{topic_name}-missing": [0]})
    assert got == {(topic_name, 0): INVALID_PRODUCER_EPOCH, (topic_name, 7):
                   UNKNOWN_TOPIC_OR_PARTITION,
                   (f"{topic_name}-missing", 0): UNKNOWN_TOPIC_OR_PARTITION}, got
    assert conn.write_markers(pid, epoch - 1, False, {topic_name: [0]}) == {
        (topic_name, 0): INVALID_PRODUCER_EPOCH}
    # no producer id
    assert conn.write_markers(-1, 0, False, {topic_name: [0]}) == {
        (topic_name, 0): INVALID_REQUEST}
    # a system topic of the broker
    system = "public/__kafka/__transaction_state"
    assert conn.write_markers(pid, epoch, False, {system: [0]}) == {
        (system, 0): INVALID_TOPIC_EXCEPTION}
    # nothing was written: the transaction still holds back read_committed readers
    assert conn.list_offset(topic_name, 0, READ_UNCOMMITTED) == 4
    assert conn.list_offset(topic_name, 0, READ_COMMITTED) == 0
    # the newer epoch is accepted (a marker for a producer with nothing open: written)
    assert conn.write_markers(other, 5, False, {topic_name: [0]}) == {(topic_name, 0): NONE}
    assert conn.list_offset(topic_name, 0, READ_COMMITTED) == 0  # pid's is still open
    assert conn.write_markers(pid, epoch, False, {topic_name: [0]}) == {(topic_name, 0): NONE}
    assert conn.list_offset(topic_name, 0, READ_COMMITTED) == 6


def test_a_marker_of_an_older_coordinator_epoch_is_refused(conn: TxnConnection,
                                                           topic_name: str) -> None:
    """The partition keeps the coordinator epoch of the producer's last marker (which
    DescribeProducers tells): a marker of a lower one (a coordinator that lost the
    transactional id) is refused and ends nothing; an equal or higher one is written."""
    assert conn.create_topic(topic_name, 1) == NONE
    tid = f"{topic_name}-tx"
    pid, epoch = open_transaction(conn, tid, topic_name, [0])
    assert conn.write_markers(pid, epoch, True, {topic_name: [0]}, coordinator_epoch=5) == {
        (topic_name, 0): NONE}
    [state] = [s for s in conn.describe_producers(topic_name, [0]).topics[0].partitions[0]
               .active_producers if s.producer_id == pid]
    assert state.coordinator_epoch == 5
    # the producer's next transaction, open
    assert conn.produce(topic_name, batch(pid, epoch, 3, 1, transactional=True,
                                          prefix="next"), 0, tid)[0] == NONE
    assert conn.list_offset(topic_name, 0, READ_COMMITTED) == 4
    for fenced in (4, 0):
        assert conn.write_markers(pid, epoch, True, {topic_name: [0]},
                                  coordinator_epoch=fenced) == {
            (topic_name, 0): TRANSACTION_COORDINATOR_FENCED}
    assert conn.list_offset(topic_name, 0, READ_UNCOMMITTED) == 5  # nothing written
    assert conn.list_offset(topic_name, 0, READ_COMMITTED) == 4
    assert conn.write_markers(pid, epoch, False, {topic_name: [0]}, coordinator_epoch=5) == {
        (topic_name, 0): NONE}
    assert conn.list_offset(topic_name, 0, READ_COMMITTED) == 6
    assert conn.committed_values(topic_name, 0) == [b"hanging-0", b"hanging-1", b"hanging-2"]
