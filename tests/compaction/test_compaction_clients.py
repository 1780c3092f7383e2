"""The log cleaner in a running broker, on every storage engine: a compacted topic that
took many versions of few keys from an idempotent producer is cleaned in the background;
confluent-kafka, kafka-python and aiokafka then read it from offset 0 and get each key's
latest value, every record at the offset it was written at, fewer records than were
written; the idempotent producer goes on writing without OUT_OF_ORDER_SEQUENCE_NUMBER.
On the file engine, a broker killed (``kill -9``) while the cleaner rewrites loses nothing
and duplicates nothing after its restart."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.broker_process import BrokerProcess
from tests.clients import CONSUMERS, Got
from tests.conftest import check_engine_left, engine_settings

pytestmark = pytest.mark.storage_engines

Consume = Callable[..., list[Got]]
Written = dict[int, tuple[bytes | None, bytes | None]]
"""What the producer wrote, by offset: (key, value)."""
CLEANER = {"logCleanerBackoffMs": "200", "logCleanerIoMaxBytesPerSecond": "0"}
COMPACTED = {"cleanup.policy": "compact", "segment.bytes": "4096",
             "min.cleanable.dirty.ratio": "0.01"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory,
           storage_engine: str) -> Iterator[BrokerProcess]:
    data = tmp_path_factory.mktemp("broker-data") / "data"
    process = BrokerProcess(data, {**engine_settings(storage_engine), **CLEANER}).start()
    yield process
    process.stop()
    check_engine_left(data, storage_engine)


def create(bootstrap: str, topic: str, configs: dict[str, str]) -> None:
    client = AdminClient({"bootstrap.servers": bootstrap})
    client.create_topics([NewTopic(topic, 1, 1, config=configs)])[topic].result(10)


def produce(producer: confluent_kafka.Producer, topic: str, rounds: range,
            keys: int, written: Written) -> None:
    """Every key once per round, one flush per round (so many small batches); the offsets
    the broker gave go to ``written``."""
    errors: list[object] = []

    def report(err: object, msg: confluent_kafka.Message) -> None:
        if err is not None:
            errors.append(err)
        else:
            offset = msg.offset()
            assert offset is not None
            written[offset] = (msg.key(), msg.value())

    for r in rounds:
        for k in range(keys):
            producer.produce(topic, key=f"key-{k}".encode(),
                             value=f"value-{r}-{k}".encode() + b"." * 100, on_delivery=report)
        assert producer.flush(30) == 0
    assert not errors, errors


def latest(written: Written) -> dict[bytes | None, bytes | None]:
    return {key: value for _, (key, value) in sorted(written.items())}


def check_read(got: list[Got], written: Written) -> None:
    offsets = [g.offset for g in got]
    assert offsets == sorted(set(offsets))  # in order, no duplicates
    for g in got:
        assert written[g.offset] == (g.rec.key, g.rec.value)  # at its original offset
    assert {g.rec.key: g.rec.value for g in got} == latest(written)
    assert len(got) < len(written)


def read_all(consume: Consume, broker: BrokerProcess, topic: str) -> list[Got]:
    """Everything a reader from offset 0 gets within 15 s (the topic is small)."""
    return consume(broker.bootstrap, topic, 10**9, 1, 15)


def wait_cleaned(broker: BrokerProcess, topic: str, after: int = 0) -> None:
    broker.wait_for_log(rf"log cleaner: cleaned \S*{re.escape(topic)}\S* below", 60, after)


def test_clients_read_a_cleaned_topic_and_the_idempotent_producer_goes_on(
        broker: BrokerProcess, topic_name: str) -> None:
    create(broker.bootstrap, topic_name, COMPACTED)
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap,
                                         "enable.idempotence": True, "linger.ms": 5})
    written: Written = {}
    produce(producer, topic_name, range(40), 8, written)
    wait_cleaned(broker, topic_name)
    for consume in CONSUMERS.values():
        check_read(read_all(consume, broker, topic_name), written)
    mark = len(broker.lines)
    produce(producer, topic_name, range(40, 60), 8, written)  # no OutOfOrderSequence
    producer.flush(30)
    wait_cleaned(broker, topic_name, mark)
    check_read(read_all(CONSUMERS["confluent"], broker, topic_name), written)


def test_a_broker_killed_while_cleaning_loses_and_duplicates_nothing(
        tmp_path: Path, storage_engine: str, topic_name: str) -> None:
    if storage_engine != "file":
        pytest.skip("the memory engine forgets at exit; postgres swaps in one transaction")
    data = tmp_path / "data"
    slow = {"logCleanerBackoffMs": "200", "logCleanerIoMaxBytesPerSecond": "150000"}
    broker = BrokerProcess(data, slow).start()
    written: Written = {}
    try:
        create(broker.bootstrap, topic_name, {**COMPACTED, "segment.bytes": "65536"})
        producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap,
                                             "enable.idempotence": True, "linger.ms": 5})
        produce(producer, topic_name, range(60), 50, written)  # ~500 KB: seconds to clean
        broker.wait_for_log(rf"log cleaner: cleaning \S*{re.escape(topic_name)}", 60)
    finally:
        broker.kill()
    broker = BrokerProcess(data, CLEANER).start()
    try:
        got = read_all(CONSUMERS["confluent"], broker, topic_name)
        offsets = [g.offset for g in got]
        assert offsets == sorted(set(offsets))
        for g in got:
            assert written[g.offset] == (g.rec.key, g.rec.value)
        assert {g.rec.key: g.rec.value for g in got} == latest(written)
        wait_cleaned(broker, topic_name)
        check_read(read_all(CONSUMERS["confluent"], broker, topic_name), written)
    finally:
        broker.stop()
