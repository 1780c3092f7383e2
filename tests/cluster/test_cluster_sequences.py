"""An idempotent producer's batches around a partition's move: a batch refused by the broker
the partition moves to, before the move, and the next batch judged there after it. The next
one skips the refused one's sequences; it must be refused as retriable
(NOT_LEADER_OR_FOLLOWER), not OUT_OF_ORDER_SEQUENCE_NUMBER, which makes librdkafka bump the
producer's epoch and send every message it has not seen acknowledged again as new: the
chaos soak found those stored twice (a pipelined request behind one refused while the
partition was being claimed)."""

from __future__ import annotations

import time
from pathlib import Path

from tests.cluster_helpers import leaders_at, running_cluster
from tests.txn_helpers import NONE, TxnConnection, batch

NOT_LEADER_OR_FOLLOWER = 6


def test_a_batch_after_one_refused_before_a_move_is_retried_not_out_of_order(
        tmp_path: Path, topic_name: str) -> None:
    with running_cluster(tmp_path, size=2) as cluster:
        first = TxnConnection(cluster.brokers[0].port)
        assert first.create_topic(topic_name) == NONE
        first.close()
        owner_id = leaders_at(cluster.brokers[0].port, topic_name)[0]
        other_id = 1 - owner_id
        owner, other = cluster.by_id(owner_id), cluster.by_id(other_id)
        at_owner, at_other = TxnConnection(owner.port), TxnConnection(other.port)
        pid, epoch = at_owner.init_ok(None)
        assert at_owner.produce(topic_name, batch(pid, epoch, 0, 5)) == (NONE, 0)
        assert at_other.produce(topic_name, batch(pid, epoch, 5, 5))[0] == \
            NOT_LEADER_OR_FOLLOWER  # not its partition yet
        at_owner.close()
        owner.stop()  # SIGTERM: it hands the partition over at once
        deadline = time.monotonic() + 20
        while leaders_at(other.port, topic_name)[0] != other_id:
            assert time.monotonic() < deadline, "the partition never moved"
            time.sleep(0.1)
        assert at_other.produce(topic_name, batch(pid, epoch, 10, 5))[0] == \
            NOT_LEADER_OR_FOLLOWER  # 5..9 are to come first
        assert at_other.produce(topic_name, batch(pid, epoch, 5, 5)) == (NONE, 5)
        assert at_other.produce(topic_name, batch(pid, epoch, 10, 5)) == (NONE, 10)
        at_other.close()
