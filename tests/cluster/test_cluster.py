"""Three brokers on one PostgreSQL, with real clients: spread, failover, fencing, restarts."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.consumer import OffsetCommitRequest, OffsetCommitResponse
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from tests.clients import present
from tests.cluster_helpers import Cluster, running_cluster
from tests.raw import RawConnection, record_batch

PARTITIONS = 6


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("cluster")) as started:
        yield started


def create(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(30)


def consume_all(bootstrap: str, topic: str, count: int, group: str | None = None,
                isolation: str = "read_uncommitted",
                timeout: float = 60.0) -> dict[int, list[tuple[int, bytes]]]:
    """partition -> [(offset, value)] of ``count`` records."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group or f"g-{topic}",
                         "auto.offset.reset": "earliest", "isolation.level": isolation,
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    got: dict[int, list[tuple[int, bytes]]] = {}
    deadline = time.monotonic() + timeout
    try:
        while sum(map(len, got.values())) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            got.setdefault(present(message.partition()), []).append(
                (present(message.offset()), present(message.value())))
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return got


def test_partitions_and_coordinators_spread_over_every_broker(cluster: Cluster,
                                                              topic_name: str) -> None:
    create(cluster.bootstrap, topic_name)
    leaders = cluster.leaders(topic_name)
    assert set(leaders.values()) == {0, 1, 2}, leaders
    for broker in cluster.brokers:  # every broker tells the same leaders
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        seen = admin.list_topics(topic_name, timeout=10).topics[topic_name].partitions
        assert {p: m.leader for p, m in seen.items()} == leaders
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True})
    for i in range(300):
        producer.produce(topic_name, value=f"v{i}".encode(), partition=i % PARTITIONS)
    assert producer.flush(30) == 0
    got = consume_all(cluster.bootstrap, topic_name, 300)
    assert sum(map(len, got.values())) == 300
    for records in got.values():
        offsets = [offset for offset, _ in records]
        assert offsets == list(range(len(offsets)))


def test_transactions_across_brokers_commit_and_abort(cluster: Cluster,
                                                      topic_name: str) -> None:
    create(cluster.bootstrap, topic_name)
    producer = Producer({"bootstrap.servers": cluster.bootstrap,
                         "transactional.id": f"tx-{topic_name}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(PARTITIONS):
        producer.produce(topic_name, value=b"aborted", partition=i)
    producer.abort_transaction(30)
    producer.begin_transaction()
    for i in range(PARTITIONS * 2):
        producer.produce(topic_name, value=b"committed", partition=i % PARTITIONS)
    producer.commit_transaction(30)
    got = consume_all(cluster.bootstrap, topic_name, PARTITIONS * 2,
                      isolation="read_committed")
    values = [value for records in got.values() for _, value in records]
    assert values == [b"committed"] * (PARTITIONS * 2)


def idempotent_load(bootstrap: str, topic: str, stop: threading.Event,
                    acked: list[tuple[int, int, bytes]], errors: list[str]) -> None:
    """Produce with acks=all and idempotence until ``stop``; note every acknowledged record."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "acks": "all", "linger.ms": 5, "message.timeout.ms": 60_000})

    def delivered(err: KafkaError | None, message: object) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            acked.append((message.partition(), message.offset(),  # type: ignore[attr-defined]
                          message.value()))  # type: ignore[attr-defined]

    i = 0
    while not stop.is_set():
        producer.produce(topic, value=f"r{i}".encode(), partition=i % PARTITIONS,
                         on_delivery=delivered)
        i += 1
        producer.poll(0)
        if i % 50 == 0:
            time.sleep(0.01)
    assert producer.flush(90) == 0


def check_exactly_once(got: dict[int, list[tuple[int, bytes]]],
                       acked: list[tuple[int, int, bytes]]) -> None:
    stored = {(p, off): value for p, records in got.items() for off, value in records}
    for partition, offset, value in acked:
        assert stored.get((partition, offset)) == value, (partition, offset)
    values = [value for records in got.values() for _, value in records]
    assert len(values) == len(set(values)), "a record is stored twice"
    for records in got.values():
        offsets = [offset for offset, _ in records]
        assert offsets == list(range(len(offsets))), "offsets are not continuous"


def test_kill_9_of_a_broker_under_idempotent_load_loses_and_duplicates_nothing(
        tmp_path: Path, topic_name: str) -> None:
    with running_cluster(tmp_path) as cluster:
        create(cluster.bootstrap, topic_name)
        victim = cluster.by_id(1)
        assert 1 in cluster.leaders(topic_name).values()
        stop, acked, errors = threading.Event(), [], []  # type: ignore[var-annotated]
        load = threading.Thread(target=idempotent_load,
                                args=(cluster.bootstrap, topic_name, stop, acked, errors))
        load.start()
        time.sleep(2)
        victim.kill()
        deadline = time.monotonic() + 30
        while 1 in cluster.leaders(topic_name).values():
            assert time.monotonic() < deadline, "the dead broker's partitions never moved"
            time.sleep(0.2)
        before = len(acked)
        time.sleep(2)
        stop.set()
        load.join(120)
        assert not load.is_alive(), "the load did not flush its records"
        assert not errors, errors[:3]
        assert len(acked) > before, "nothing was acknowledged after the failover"
        got = consume_all(cluster.bootstrap, topic_name, len(acked))
        check_exactly_once(got, acked)


def test_a_paused_owner_cannot_write_after_takeover(tmp_path: Path, topic_name: str) -> None:
    """SIGSTOP an owner, let another broker take its partitions, SIGCONT it: the produce it
    received while paused is refused (its epoch is fenced), nothing is duplicated or lost;
    an offset commit it received meanwhile is answered NOT_COORDINATOR, and is no storage
    fault in its log."""
    with running_cluster(tmp_path) as cluster:
        create(cluster.bootstrap, topic_name)
        leaders = cluster.leaders(topic_name)
        partition = next(p for p, leader in leaders.items() if leader == 2)
        paused = cluster.by_id(2)
        group = next(g for g in (f"g-{topic_name}-{i}" for i in range(200))
                     if coordinator_of(paused.port, g, 0) == 2)
        conn, committer = RawConnection(paused.port), RawConnection(paused.port)
        assert paused.proc is not None
        os.kill(paused.proc.pid, signal.SIGSTOP)
        try:
            data = ProduceRequest.TopicProduceData(name=topic_name, partition_data=[
                ProduceRequest.TopicProduceData.PartitionProduceData(
                    index=partition, records=record_batch(1, value=b"late"))])
            request = ProduceRequest[9](transactional_id=None, acks=-1, timeout_ms=10_000,
                                        topic_data=[data])
            conn.send_frame(conn.request_bytes(request, 9))  # waits in the socket buffer
            committer.send_frame(committer.request_bytes(_commit(group, topic_name), 8))
            deadline = time.monotonic() + 30
            others = [b for b in cluster.brokers if b is not paused]
            admin = AdminClient({"bootstrap.servers": others[0].bootstrap})
            while admin.list_topics(topic_name, timeout=10).topics[topic_name] \
                    .partitions[partition].leader == 2:
                assert time.monotonic() < deadline, "the paused broker kept its partitions"
                time.sleep(0.2)
            producer = Producer({"bootstrap.servers": others[0].bootstrap, "acks": "all"})
            producer.produce(topic_name, value=b"new owner", partition=partition)
            assert producer.flush(30) == 0
        finally:
            os.kill(paused.proc.pid, signal.SIGCONT)
        frame = conn.read_frame()
        response = ProduceResponse.decode(frame[5:], version=9)  # header v1
        code = response.responses[0].partition_responses[0].error_code
        assert code == 6, f"the paused owner's late write answered {code}"  # NOT_LEADER
        conn.close()
        try:
            frame = committer.read_frame()
        except ConnectionError:
            raise AssertionError("\n".join(paused.lines[-15:])) from None
        answer = OffsetCommitResponse[8].decode(frame[5:])  # header v1
        code = answer.topics[0].partitions[0].error_code
        assert code == 16, f"the paused coordinator's late commit answered {code}"
        committer.close()
        assert not [line for line in paused.lines if "storage: cannot write" in line]
        consumer = Consumer({"bootstrap.servers": others[0].bootstrap,
                             "group.id": f"check-{topic_name}", "auto.offset.reset": "earliest"})
        consumer.assign([TopicPartition(topic_name, partition, 0)])
        values: list[bytes | None] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(values) < 1:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                values.append(message.value())
        time.sleep(1)
        message = consumer.poll(1)
        consumer.close()
        assert values == [b"new owner"] and message is None


def _commit(group: str, topic: str) -> object:
    """An OffsetCommit v8 of offset 0 of the topic's partition 0, outside any generation."""
    part = OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition
    return OffsetCommitRequest[8](
        group_id=group, generation_id_or_member_epoch=-1, member_id="",
        group_instance_id=None, topics=[OffsetCommitRequest.OffsetCommitRequestTopic(
            name=topic, partitions=[part(partition_index=0, committed_offset=0,
                                         committed_leader_epoch=-1,
                                         committed_metadata="")])])


def coordinator_of(port: int, key: str, key_type: int) -> int:
    """The broker FindCoordinator names for a group (0) or transactional id (1)."""
    conn = RawConnection(port)
    try:
        answer = conn.call(FindCoordinatorRequest[1](key=key, key_type=key_type), 1,
                           FindCoordinatorResponse)
    finally:
        conn.close()
    assert answer.error_code == 0, answer
    return int(answer.node_id)


def test_offsets_sent_to_a_transaction_whose_group_is_on_another_broker(
        cluster: Cluster, topic_name: str) -> None:
    """Consume-transform-produce with the group coordinated by one broker and the
    transaction by another: the commit settles the group's offsets there."""
    create(cluster.bootstrap, topic_name)
    port = cluster.brokers[0].port
    txn_id = f"tx-{topic_name}"
    txn_node = coordinator_of(port, txn_id, 1)
    for _ in range(5):  # the group keeps its coordinator until a broker dies: fine to probe
        group = f"g-{topic_name}-{time.monotonic_ns()}"
        if coordinator_of(port, group, 0) != txn_node:
            break
    else:
        raise AssertionError("every group probed had the transaction's coordinator")
    source = Producer({"bootstrap.servers": cluster.bootstrap})
    for i in range(PARTITIONS):
        source.produce(topic_name, value=f"in{i}".encode(), partition=i)
    assert source.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic_name])
    seen = 0
    deadline = time.monotonic() + 60
    while seen < PARTITIONS and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and not message.error():
            seen += 1
    assert seen == PARTITIONS
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": txn_id})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic_name, value=b"out", partition=0)
    producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                         consumer.consumer_group_metadata(), 30)
    producer.commit_transaction(30)
    consumer.close()
    reader = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group})
    committed = reader.committed([TopicPartition(topic_name, p) for p in range(PARTITIONS)],
                                 timeout=30)
    reader.close()
    assert sorted((c.partition, c.offset) for c in committed) == \
        [(p, 1) for p in range(PARTITIONS)]
