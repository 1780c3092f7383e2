"""A transactional offset commit that reaches a group's coordinator after the transaction's
coordinator (another broker) aborted the transaction on its timeout is refused, as Kafka's
offsets partition refuses a transactional write below the epoch of the producer's last
marker: accepted, its offsets stayed pending for ever, and every read_committed consumer
of the group was answered UNSTABLE_OFFSET_COMMIT for ever (the chaos soak,
``bench/chaos.py``, found a consume-transform-produce stuck so for good after a commit
retried past a coordinator move)."""

from __future__ import annotations

import itertools
from pathlib import Path

import confluent_kafka

from tests.cluster.test_cluster import create
from tests.cluster.test_cluster_failover import txn_coordinator
from tests.cluster_helpers import running_cluster
from tests.group_helpers import GroupConnection
from tests.txn_helpers import FAST_TXN, NONE, TxnConnection, wait_until

INVALID_PRODUCER_EPOCH = 47


def group_coordinator(port: int, group: str) -> int:
    """The broker the broker on ``port`` names as ``group``'s coordinator."""
    conn = GroupConnection(port)
    try:
        (found,) = conn.find_coordinator([group], 4).coordinators
    finally:
        conn.close()
    assert found.error_code == NONE, found
    return int(found.node_id)


def test_an_offset_commit_after_its_transaction_timed_out_is_refused(
        tmp_path: Path, topic_name: str) -> None:
    with running_cluster(tmp_path, 2, settings=FAST_TXN) as cluster:
        create(cluster.bootstrap, topic_name, 1)
        port = cluster.brokers[0].port
        group, tid = next(
            (f"late-{i}", f"late-txn-{i}") for i in itertools.count()
            if group_coordinator(port, f"late-{i}") != txn_coordinator(cluster, f"late-txn-{i}"))
        txn_conn = TxnConnection(cluster.by_id(txn_coordinator(cluster, tid)).port)
        group_conn = TxnConnection(cluster.by_id(group_coordinator(port, group)).port)
        try:
            pid, epoch = txn_conn.init_ok(tid, timeout_ms=1000)
            assert txn_conn.add_offsets(tid, pid, epoch, group) == NONE
            wait_until(lambda: txn_conn.describe_transactions([tid]).transaction_states[0]
                       .transaction_state == "CompleteAbort", 30,
                       "the coordinator to abort the transaction on its timeout")
            # the producer's TxnOffsetCommit, retried past a coordinator move, arrives now
            assert group_conn.txn_offset_commit(tid, group, pid, epoch, topic_name,
                                                {0: 1}) == {0: INVALID_PRODUCER_EPOCH}
        finally:
            txn_conn.close()
            group_conn.close()
        consumer = confluent_kafka.Consumer({  # read_committed: OffsetFetch requires stable
            "bootstrap.servers": cluster.bootstrap, "group.id": group,
            "isolation.level": "read_committed"})
        try:
            (committed,) = consumer.committed([confluent_kafka.TopicPartition(topic_name, 0)],
                                              20)
        finally:
            consumer.close()
        assert committed.error is None and committed.offset == confluent_kafka.OFFSET_INVALID
