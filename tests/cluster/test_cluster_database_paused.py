"""Two brokers on a PostgreSQL that stops answering (its processes SIGSTOPped, so its
connections hang instead of failing): the brokers keep answering what needs no database
(ApiVersions, Metadata of a known topic, from what they hold), because no statement of
the cluster machinery runs on their event loops; when the database answers again, the
cluster recovers and nothing acknowledged is lost. A stop longer than the brokers'
sessions is the database's absence, not the brokers': no broker is judged dead for it, and
the partitions stay where they were."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from confluent_kafka import KafkaError, Producer
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    MetadataRequest,
    MetadataResponse,
)

from tests.cluster.test_cluster import consume_all, create
from tests.cluster_helpers import Cluster, running_cluster
from tests.postgres_server import PostgresServer
from tests.raw import RawConnection

PAUSE_S = 15.0
"""How long the database stays stopped: well past the brokers' leases (2 s) and the answer
bound below."""
ANSWER_BOUND_S = 10.0
"""A generous bound for an answer that needs no database (a liveness check, not a latency
one)."""
PARTITIONS = 4


def server_pids(server: PostgresServer) -> list[int]:
    """The postmaster of ``server`` first, then its children (the backends)."""
    postmaster = int((server.data / "postmaster.pid").read_text().split()[0])
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
            children.append(int(entry.name))
    return [postmaster, *children]


@contextmanager
def database_stopped(server: PostgresServer) -> Iterator[None]:
    """Every process of the server SIGSTOPped (the postmaster first: no new backend; its
    children listed once it is stopped), and SIGCONTed at the end, also when stopping one
    failed: the server's sockets accept, nothing answers. A backend may end between its
    listing and its signal (a session that closed): it is skipped."""
    stopped: list[int] = []
    try:
        postmaster, *_ = server_pids(server)
        os.kill(postmaster, signal.SIGSTOP)
        stopped.append(postmaster)
        for pid in server_pids(server)[1:]:
            if _signal(pid, signal.SIGSTOP):
                stopped.append(pid)
        yield
    finally:
        for pid in reversed(stopped):
            _signal(pid, signal.SIGCONT)


def _signal(pid: int, signum: signal.Signals) -> bool:
    """Send ``signum`` to ``pid``; False if that process has ended."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return False
    return True


def answers_without_database(port: int, topic: str) -> None:
    """ApiVersions and Metadata of ``topic`` (no auto-creation) answered by the broker on
    ``port`` within the bound, each on a new connection."""
    conn = RawConnection(port, timeout=ANSWER_BOUND_S)
    try:
        versions = conn.call(ApiVersionsRequest[0](), 0, ApiVersionsResponse)
        assert versions.error_code == 0
        metadata = conn.call(MetadataRequest[12](
            topics=[MetadataRequest.MetadataRequestTopic(name=topic, topic_id=None)],
            allow_auto_topic_creation=False, include_topic_authorized_operations=False),
            12, MetadataResponse)
        (found,) = metadata.topics
        assert found.error_code == 0 and len(found.partitions) == PARTITIONS, found
    finally:
        conn.close()


def produce(cluster: Cluster, topic: str, values: list[bytes]) -> list[bytes]:
    """Produce ``values`` with acks=all and retries; return the acknowledged ones."""
    acked: list[bytes] = []
    failed: list[KafkaError] = []

    def delivered(err: KafkaError | None, message: object) -> None:
        if err is not None:
            failed.append(err)
        else:
            acked.append(message.value())  # type: ignore[attr-defined]

    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all",
                         "enable.idempotence": True, "delivery.timeout.ms": 90_000})
    for i, value in enumerate(values):
        producer.produce(topic, value=value, partition=i % PARTITIONS, on_delivery=delivered)
    assert producer.flush(120) == 0
    assert not failed, failed[:3]
    return acked


def test_brokers_answer_while_the_database_is_stopped_and_recover_after(
        own_server: PostgresServer, tmp_path: Path, topic_name: str) -> None:
    with running_cluster(tmp_path, size=2, url=own_server.new_database_url()) as cluster:
        create(cluster.bootstrap, topic_name, PARTITIONS)
        before = produce(cluster, topic_name, [f"before-{i}".encode() for i in range(200)])
        for broker in cluster.brokers:  # both know the topic
            answers_without_database(broker.port, topic_name)
        with database_stopped(own_server):
            until = time.monotonic() + PAUSE_S
            rounds = 0
            while time.monotonic() < until:
                for broker in cluster.brokers:
                    answers_without_database(broker.port, topic_name)
                rounds += 1
                time.sleep(0.5)
            assert all(broker.alive() for broker in cluster.brokers)
        after = produce(cluster, topic_name, [f"after-{i}".encode() for i in range(200)])
        got = consume_all(cluster.bootstrap, topic_name, len(before) + len(after))
        values = sorted(value for records in got.values() for _, value in records)
        assert values == sorted(before + after)
        assert rounds > 1


def owners(url: str) -> dict[tuple[str, int], int | None]:
    """Every partition's owning broker, as the registry says."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT topic, partition, owner_broker FROM edge_partitions"
                            ).fetchall()
    return {(str(topic), int(index)): None if owner is None else int(owner)
            for topic, index, owner in rows}


def test_a_database_stop_longer_than_a_session_judges_no_broker_dead(
        own_server: PostgresServer, tmp_path: Path, topic_name: str) -> None:
    url = own_server.new_database_url()
    with running_cluster(tmp_path, size=2, url=url) as cluster:
        create(cluster.bootstrap, topic_name, PARTITIONS)
        before = produce(cluster, topic_name, [f"before-{i}".encode() for i in range(50)])
        placed = owners(url)
        assert {owner for owner in placed.values()} == {0, 1}, placed
        with database_stopped(own_server):
            time.sleep(4.0)  # twice the brokers' sessions (2 s)
        after = produce(cluster, topic_name, [f"after-{i}".encode() for i in range(50)])
        assert owners(url) == placed  # no broker took the other's partitions
        logs = [broker.log_text() for broker in cluster.brokers]
        assert not any("lease ran out" in text for text in logs), logs
        assert any("renewed, not judged dead" in text for text in logs), logs
        assert cluster.live_ids() == {0, 1}
        got = consume_all(cluster.bootstrap, topic_name, len(before) + len(after))
        assert sorted(v for records in got.values() for _, v in records) == \
            sorted(before + after)
