"""WriteTxnMarkers on a cluster: a broker writes markers only into partitions it leads
(NOT_LEADER_OR_FOLLOWER elsewhere, nothing written), as Kafka; the leader's abort of a
real client's hanging transaction moves the last stable offset on."""

from __future__ import annotations

from pathlib import Path

import confluent_kafka

from tests.cluster.test_cluster import create
from tests.cluster_helpers import running_cluster
from tests.txn_helpers import (
    NONE,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    TxnConnection,
    wait_until,
)

NOT_LEADER_OR_FOLLOWER = 6


def test_markers_only_where_this_broker_leads(tmp_path: Path, topic_name: str) -> None:
    with running_cluster(tmp_path, size=2) as cluster:
        create(cluster.bootstrap, topic_name, 1)
        leaders: dict[int, int] = {}

        def agreed() -> bool:
            leaders.update(cluster.agreed_leaders(topic_name) or {})
            return bool(leaders)

        wait_until(agreed, 60, "the brokers to agree on the leader")
        leader = cluster.by_id(leaders[0])
        other = next(b for b in cluster.brokers if b is not leader)
        producer = confluent_kafka.Producer({
            "bootstrap.servers": cluster.bootstrap, "transactional.id": f"{topic_name}-tx",
            "transaction.timeout.ms": 600_000})
        producer.init_transactions(60)
        producer.begin_transaction()
        for i in range(3):
            producer.produce(topic_name, f"hanging-{i}".encode(), partition=0)
        assert producer.flush(60) == 0
        at_leader = TxnConnection(leader.port, timeout=60)
        elsewhere = TxnConnection(other.port, timeout=60)
        try:
            described = at_leader.describe_producers(topic_name, [0]).topics[0].partitions[0]
            assert described.error_code == NONE, described
            [state] = described.active_producers
            assert state.current_txn_start_offset == 0, state
            pid, epoch = state.producer_id, state.producer_epoch
            assert at_leader.list_offset(topic_name, 0, READ_COMMITTED) == 0

            assert elsewhere.write_markers(pid, epoch, False, {topic_name: [0]}) == {
                (topic_name, 0): NOT_LEADER_OR_FOLLOWER}
            assert at_leader.list_offset(topic_name, 0, READ_UNCOMMITTED) == 3
            assert at_leader.list_offset(topic_name, 0, READ_COMMITTED) == 0

            assert at_leader.write_markers(pid, epoch, False, {topic_name: [0]}) == {
                (topic_name, 0): NONE}
            assert at_leader.list_offset(topic_name, 0, READ_COMMITTED) == 4
            assert at_leader.committed_values(topic_name, 0) == []
        finally:
            at_leader.close()
            elsewhere.close()
            producer.abort_transaction(60)
