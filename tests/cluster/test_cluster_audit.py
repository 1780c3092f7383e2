"""The audit topic of a cluster on PostgreSQL: a partition per live broker, numbered by the
brokers' slots (small numbers whatever their ids), and no event lost when several brokers
create or grow the topic at the same moment.

Each broker gets one audit event: a connection that sends Metadata before logging in on a
SASL listener is rejected and audited with the client's address, which tells the events
apart.
"""

from __future__ import annotations

import base64
import json
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import confluent_kafka

from tests.broker_process import BrokerProcess
from tests.clients import present
from tests.cluster_helpers import Cluster, running_cluster

AUDIT = "public/__kafka/__audit"
SETTINGS = {
    "kafkaListeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
    "tokenSecretKey": "data:;base64," + base64.b64encode(b"audit-cluster-secret-32-bytes!!!")
    .decode(),
}


def rejected_connection(broker: BrokerProcess, start: threading.Barrier | None = None) -> str:
    """Send Metadata before logging in (the broker audits and closes); the client address
    the event names."""
    with socket.create_connection(("127.0.0.1", broker.ports["SASL_PLAINTEXT"])) as sock:
        host, port = sock.getsockname()[:2]
        if start is not None:
            start.wait(10)
        sock.sendall(struct.pack(">ihhihi", 14, 3, 1, 7, -1, -1))
        sock.settimeout(10)
        assert sock.recv(10) == b""
    return f"{host}:{port}"


def audit_partitions(cluster: Cluster, clients: set[str],
                     timeout: float = 30.0) -> tuple[int, dict[str, int]]:
    """The audit topic's partition count and, for each of ``clients``, the partition its
    event is in (read until all are found or ``timeout``)."""
    bootstrap = ",".join(f"127.0.0.1:{b.ports['PLAINTEXT']}" for b in cluster.brokers)
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap,
                                         "group.id": "audit-reader",
                                         "enable.auto.commit": False})
    found: dict[str, int] = {}
    count = 0
    try:
        deadline = time.monotonic() + timeout
        while not clients <= set(found) and time.monotonic() < deadline:
            # a broker may list the topic a moment before it learns of another's growth
            listed = len(consumer.list_topics(AUDIT, timeout=10).topics[AUDIT].partitions)
            if listed != count:
                count = listed
                consumer.assign([confluent_kafka.TopicPartition(AUDIT, p, 0)
                                 for p in range(count)])
                found.clear()
            for message in consumer.consume(100, 0.5):
                if message.error() is None:
                    event = json.loads(present(message.value()))
                    found[str(event["client"])] = present(message.partition())
    finally:
        consumer.close()
    return count, {client: found[client] for client in clients if client in found}


def test_brokers_with_large_ids_write_to_a_small_audit_topic(tmp_path: Path) -> None:
    with running_cluster(tmp_path, 2, SETTINGS, ids=[5, 1001]) as cluster:
        clients = {rejected_connection(broker) for broker in cluster.brokers}
        count, found = audit_partitions(cluster, clients)
    assert count == 2
    assert set(found) == clients, "an audit event is missing"
    assert sorted(found.values()) == [0, 1]  # each broker writes its own partition


def test_brokers_creating_the_audit_topic_at_once_keep_every_event(tmp_path: Path) -> None:
    with running_cluster(tmp_path, 3, SETTINGS, ids=[7, 42, 1001]) as cluster:
        start = threading.Barrier(len(cluster.brokers))  # the three events at one moment
        with ThreadPoolExecutor(len(cluster.brokers)) as pool:
            clients = list(pool.map(lambda b: rejected_connection(b, start), cluster.brokers))
        count, found = audit_partitions(cluster, set(clients))
    assert set(found) == set(clients), "an audit event was lost"
    assert count == 3 and sorted(found.values()) == [0, 1, 2]


def wait_for_audit_leader(cluster: Cluster, partition: int, broker_id: int) -> None:
    """Until Metadata names ``broker_id`` leader of the audit partition (a partition moves to
    the broker that took its slot at that broker's next reconcile)."""
    deadline = time.monotonic() + 20
    while cluster.leaders(AUDIT).get(partition) != broker_id:
        assert time.monotonic() < deadline, f"broker {broker_id} never led {partition}"
        time.sleep(0.1)


def test_a_dead_brokers_slot_goes_to_the_next_broker_and_its_restart_takes_another(
        tmp_path: Path) -> None:
    with running_cluster(tmp_path, 2, SETTINGS, ids=[5, 1001]) as cluster:
        for broker in cluster.brokers:
            rejected_connection(broker)
        cluster.by_id(5).kill()
        cluster.wait_for_members(1)  # its lease ran out: its slot 0 is free
        newcomer = cluster.add(77)
        wait_for_audit_leader(cluster, 0, 77)
        late = rejected_connection(newcomer)
        restarted = cluster.restart(5)  # slot 0 is the newcomer's: it takes slot 2
        again = rejected_connection(restarted)  # grows the topic to its new partition
        count, found = audit_partitions(cluster, {late, again})
    assert count == 3
    assert found == {late: 0, again: 2}
