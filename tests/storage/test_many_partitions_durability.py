"""acks=all produce round-robin over many partitions (enough that the periodic flush syncs
their file system at once: ``flush_together``) is acknowledged, and every acknowledged
record is there with its offset after a ``kill -9`` of the broker, after a clean stop
(the partitions closed together: ``close_together``) and after a ``kill -9`` landing
inside that stop; a Metadata answer for all of those topics (written by hand) is read
back by librdkafka as it was created."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.broker_process import BrokerProcess

TOPICS = 24
PER_TOPIC = 5
ROUNDS = 3


def _names(prefix: str) -> list[str]:
    return [f"{prefix}-{i:02d}" for i in range(TOPICS)]


def _create(bootstrap: str, names: list[str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, PER_TOPIC, 1) for name in names],
                                  operation_timeout=60, request_timeout=60)
    for future in futures.values():
        future.result(60)


def _produce(bootstrap: str, names: list[str]) -> dict[tuple[str, int, int], bytes]:
    """Every record acknowledged, by (topic, partition, offset)."""
    acked: dict[tuple[str, int, int], bytes] = {}
    errors: list[object] = []

    def delivered(err: object, msg: confluent_kafka.Message) -> None:
        if err is not None:
            errors.append(err)
            return
        topic, partition, offset, value = msg.topic(), msg.partition(), msg.offset(), \
            msg.value()
        assert topic is not None and partition is not None and offset is not None
        assert isinstance(value, bytes)
        acked[(topic, partition, offset)] = value

    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                         "linger.ms": 5})
    for round_ in range(ROUNDS):
        for name in names:
            for partition in range(PER_TOPIC):
                producer.produce(name, f"{name}/{partition}/{round_}".encode(),
                                 partition=partition, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(120) == 0
    assert errors == []
    return acked


def _consume(bootstrap: str, names: list[str], count: int) -> dict[tuple[str, int, int], bytes]:
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": "unused-assign-only",
        "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.assign([confluent_kafka.TopicPartition(name, p, 0)
                     for name in names for p in range(PER_TOPIC)])
    got: dict[tuple[str, int, int], bytes] = {}
    deadline = time.monotonic() + 120
    try:
        while len(got) < count and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 1.0):
                assert msg.error() is None, msg.error()
                topic, partition, offset, value = msg.topic(), msg.partition(), \
                    msg.offset(), msg.value()
                assert topic is not None and partition is not None and offset is not None
                assert isinstance(value, bytes)
                got[(topic, partition, offset)] = value
    finally:
        consumer.close()
    return got


def test_acknowledged_records_over_many_partitions_survive_kill_9(tmp_path: Path) -> None:
    names = _names("spread")
    broker = BrokerProcess(tmp_path).start()
    try:
        _create(broker.bootstrap, names)
        metadata = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=60)
        for name in names:
            topic = metadata.topics[name]
            assert topic.error is None
            assert sorted(topic.partitions) == list(range(PER_TOPIC))
            assert {p.leader for p in topic.partitions.values()} == {0}
        acked = _produce(broker.bootstrap, names)
        assert len(acked) == TOPICS * PER_TOPIC * ROUNDS
        broker.kill()  # right after the last acknowledgement
        broker.start()
        got = _consume(broker.bootstrap, names, len(acked))
        assert got == acked
        for name in names:  # each partition's offsets from 0, none skipped
            for partition in range(PER_TOPIC):
                offsets = sorted(o for t, p, o in acked if (t, p) == (name, partition))
                assert offsets == list(range(ROUNDS))
    finally:
        broker.kill()


@pytest.mark.parametrize("stop", ["clean", "killed-while-stopping"])
def test_acknowledged_records_over_many_partitions_survive_a_stop(tmp_path: Path,
                                                                   stop: str) -> None:
    names = _names("stopped")
    broker = BrokerProcess(tmp_path).start()
    try:
        _create(broker.bootstrap, names)
        acked = _produce(broker.bootstrap, names)
        if stop == "clean":
            assert broker.stop(120) == 0
            assert not list(tmp_path.rglob("partition.json.tmp"))
        else:  # SIGTERM, then kill -9 once the stop began (wherever it got to)
            seen = len(broker.lines)
            assert broker.proc is not None
            broker.proc.send_signal(signal.SIGTERM)
            broker.wait_for_log("edge-broker stopping", timeout=60, after=seen)
            broker.kill()
        broker.start()
        assert _consume(broker.bootstrap, names, len(acked)) == acked
    finally:
        broker.kill()
