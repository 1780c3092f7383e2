"""The chaos soak's transactional producer (``bench/chaos_load.py``) gets past a group
coordinator that died and came back: librdkafka 2.16 keeps the coordinator it cached
even once it dropped that broker (gone from Metadata), and ``send_offsets_to_transaction``
then waits for ever, whatever its timeout, until some other broker connection of the
client changes state (confluentinc/librdkafka#5511, #5456). In a soak whose faults had
stopped the transform hung so for more than five minutes, and its transaction timed out
on the coordinator. The producer closes idle connections, which is such a change."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from bench.chaos_load import TRANSACTIONAL_ID, transactional_producer
from tests.cluster.test_cluster import create
from tests.cluster.test_cluster_failover import txn_coordinator
from tests.cluster.test_cluster_txn_offsets import group_coordinator
from tests.cluster_helpers import Cluster, running_cluster
from tests.txn_helpers import FAST_TXN, wait_until

SOURCE, SINK = "xform-in", "xform-out"
HUNG_S = 60.0
"""A transaction not done after this long is stuck (its calls' timeouts are 10 and 30 s)."""
TIMEOUT_MS = 45_000
"""The producer's transaction timeout here: the soak's 10 s is less than the idle-close
rescue can take on a loaded machine (a connection idle 5 s, after the calls that kept it
busy), and a transaction the coordinator timed out is fenced, not the hang tested here."""


def _transaction(cluster: Cluster, producer: Producer, consumer: Consumer, avoid: int,
                 offset: int) -> None:
    """One consume-transform-produce transaction: a record to a partition that broker
    ``avoid`` does not lead, the input offset sent to the transaction, committed."""
    producer.begin_transaction()
    partition = next(p for p, leader in cluster.leaders(SINK).items() if leader != avoid)
    producer.produce(SINK, b"out", partition=partition)
    producer.send_offsets_to_transaction([TopicPartition(SOURCE, 0, offset)],
                                         consumer.consumer_group_metadata(), 10)
    producer.commit_transaction(30)


def test_offsets_reach_a_group_coordinator_that_died_and_came_back(tmp_path: Path) -> None:
    with running_cluster(tmp_path, 3, settings=FAST_TXN) as cluster:
        create(cluster.bootstrap, SINK, 3)
        create(cluster.bootstrap, SOURCE, 1)
        port = cluster.brokers[0].port
        txn_broker = txn_coordinator(cluster, TRANSACTIONAL_ID)
        group = next(f"xform-{i}" for i in itertools.count()
                     if group_coordinator(port, f"xform-{i}") != txn_broker)
        dead = group_coordinator(port, group)
        consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group})
        producer = transactional_producer(cluster.bootstrap, "xform", timeout_ms=TIMEOUT_MS)
        try:
            producer.init_transactions(30)
            _transaction(cluster, producer, consumer, dead, 1)  # caches the coordinator
            cluster.by_id(dead).kill()
            wait_until(lambda: dead not in producer.list_topics(timeout=10).brokers, 30,
                       "the producer to drop the dead broker")
            cluster.restart(dead)
            cluster.wait_for_members(3)
            wait_until(lambda: dead in producer.list_topics(timeout=10).brokers, 30,
                       "the producer to see the broker again")
            done: list[BaseException | None] = []

            def second() -> None:
                try:
                    _transaction(cluster, producer, consumer, dead, 2)
                    done.append(None)
                except BaseException as exc:  # reported below
                    done.append(exc)

            worker = threading.Thread(target=second, daemon=True)
            worker.start()
            worker.join(HUNG_S)
            # stuck, librdkafka's thread stays busy until the process ends (nothing ends it)
            assert done, f"the transaction is stuck after {HUNG_S:g} s"
            assert done == [None], done
        finally:
            consumer.close()
