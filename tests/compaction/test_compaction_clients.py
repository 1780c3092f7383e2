"""The log cleaner in a running broker, on every storage engine: a compacted topic that
took many versions of few keys from an idempotent producer is cleaned in the background;
confluent-kafka, kafka-python and aiokafka then read it from offset 0 and get each key's
latest value, every record at the offset it was written at, fewer records than were
written; the idempotent producer goes on writing without OUT_OF_ORDER_SEQUENCE_NUMBER.
On the file engine, a broker killed (``kill -9``) while the cleaner rewrites loses nothing
and duplicates nothing after its restart."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from broker_core.storage.ledger import LEDGER_SUFFIX
from tests.broker_process import BrokerProcess
from tests.clients import CONSUMERS, Got
from tests.conftest import check_engine_left, engine_settings
from tests.operations.test_metrics import sample, scrape
from tests.ports import free_port
from tests.txn_helpers import wait_until

pytestmark = [pytest.mark.storage_engines, pytest.mark.long_running(minutes=1)]

Consume = Callable[..., list[Got]]
Written = dict[int, tuple[bytes | None, bytes | None]]
"""What the producer wrote, by offset: (key, value)."""
CLEANER = {"logCleanerBackoffMs": "200", "logCleanerIoMaxBytesPerSecond": "0"}
COMPACTED = {"cleanup.policy": "compact", "segment.bytes": "4096",
             "min.cleanable.dirty.ratio": "0.01"}


@pytest.fixture(scope="module")
def metrics_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, storage_engine: str,
           metrics_port: int) -> Iterator[BrokerProcess]:
    data = tmp_path_factory.mktemp("broker-data") / "data"
    process = BrokerProcess(data, {**engine_settings(storage_engine), **CLEANER,
                                   "metricsPort": str(metrics_port)}).start()
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


def read_all(consume: Consume, broker: BrokerProcess, topic: str,
             written: Written) -> list[Got]:
    """What a reader from offset 0 gets up to the last record written (a cleaning keeps
    it: the latest of its key, in the active segment), or within 30 s."""
    last = max(written)
    return consume(broker.bootstrap, topic, 10**9, 1, 30,
                   until=lambda got: bool(got) and got[-1].offset >= last)


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
        check_read(read_all(consume, broker, topic_name, written), written)
    mark = len(broker.lines)
    produce(producer, topic_name, range(40, 60), 8, written)  # no OutOfOrderSequence
    producer.flush(30)
    wait_cleaned(broker, topic_name, mark)
    check_read(read_all(CONSUMERS["confluent"], broker, topic_name, written), written)


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd"])
def test_a_compressed_producer_batch_left_empty_is_read_by_every_client(
        broker: BrokerProcess, topic_name: str, codec: str) -> None:
    """An idempotent producer's last batch, all of whose records later ones replaced, stays
    (its sequence must) with no record: written as Kafka writes an empty batch, with no
    codec and no payload. librdkafka aborted the consumer's whole process on an empty
    compressed one."""
    create(broker.bootstrap, topic_name, COMPACTED)
    idempotent = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap,
                                           "enable.idempotence": True,
                                           "compression.type": codec, "linger.ms": 0})
    written: Written = {}
    produce(idempotent, topic_name, range(1), 1, written)
    plain = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    produce(plain, topic_name, range(1, 60), 1, written)  # the same key, and rolls segments
    wait_cleaned(broker, topic_name)
    for consume in CONSUMERS.values():
        check_read(read_all(consume, broker, topic_name, written), written)
    produce(idempotent, topic_name, range(60, 61), 1, written)  # its sequence was kept
    check_read(read_all(CONSUMERS["confluent"], broker, topic_name, written), written)


def test_the_cleaner_metrics_move(broker: BrokerProcess, metrics_port: int,
                                  topic_name: str) -> None:
    """Issue 18's metrics: cleanings, bytes reclaimed, each partition's dirty ratio, the
    largest compaction delay."""
    create(broker.bootstrap, topic_name, COMPACTED)
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap,
                                         "linger.ms": 5})
    produce(producer, topic_name, range(30), 8, {})
    wait_cleaned(broker, topic_name)
    ratio = rf'kop_log_cleaner_dirty_ratio\{{partition="0",topic="[^"]*{topic_name}"\}}'
    wait_until(lambda: any(re.fullmatch(ratio, name) for name in scrape(metrics_port)), 30,
               "the dirty ratio of the partition", 0.2)
    samples = scrape(metrics_port)
    assert sample(samples, "kop_log_cleaner_runs_total") >= 1
    assert sample(samples, "kop_log_cleaner_bytes_reclaimed_total") > 0
    assert 0 <= sample(samples, ratio) <= 1
    assert sample(samples, "kop_log_cleaner_max_compaction_delay_seconds") == 0  # no lag set


def test_a_segment_group_of_many_small_batches_is_cleaned(
        broker: BrokerProcess, topic_name: str) -> None:
    """One record per batch, as a changelog's producer often sends them, on the default
    ``segment.bytes``: the cleaned group keeps 650 batches, two buffers each in the chunk
    the file engine writes, more than one ``pwritev`` takes (IOV_MAX, 1024: EINVAL, and
    the partition was never cleaned)."""
    if broker.settings.get("storageUrl"):
        pytest.skip("the ledger's writes are the file engine's")
    create(broker.bootstrap, topic_name, {"cleanup.policy": "compact", "segment.ms": "2000",
                                          "min.cleanable.dirty.ratio": "0.01"})
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap,
                                         "linger.ms": 0, "batch.num.messages": 1})
    written: Written = {}
    produce(producer, topic_name, range(1), 650, written)
    produce(producer, topic_name, range(1, 2), 650, written)  # each key again
    time.sleep(2.5)  # past segment.ms: the next append rolls, the 1,300 batches are sealed
    mark = len(broker.lines)
    produce(producer, topic_name, range(2, 3), 1, written)
    line = broker.wait_for_log(rf"log cleaner: (cleaned \S*{re.escape(topic_name)}\S* below"
                               rf"|\S*{re.escape(topic_name)}\S* not cleaned)", 60, mark)
    assert "not cleaned" not in line, line
    for consume in CONSUMERS.values():
        check_read(read_all(consume, broker, topic_name, written), written)


def kill_while_cleaning(data: Path, topic: str, rounds: range, written: Written,
                        configs: dict[str, str] | None = None) -> None:
    """Start a broker whose cleaner is slow, produce ``rounds`` (creating ``topic`` with
    ``configs`` first, if given), and ``kill -9`` it once a cleaning of ``topic`` began."""
    slow = {"logCleanerBackoffMs": "200", "logCleanerIoMaxBytesPerSecond": "150000"}
    broker = BrokerProcess(data, slow).start()
    try:
        if configs is not None:
            create(broker.bootstrap, topic, configs)
        producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap,
                                             "enable.idempotence": True, "linger.ms": 5})
        produce(producer, topic, rounds, 50, written)
        broker.wait_for_log(rf"log cleaner: cleaning \S*{re.escape(topic)}", 60)
    finally:
        broker.kill()


def restart_and_check(data: Path, topic: str, written: Written) -> None:
    """Restart after a kill: what is read is what was written, each key's latest value
    at its offset, nothing twice; then a cleaning runs to its end."""
    broker = BrokerProcess(data, CLEANER).start()
    try:
        got = read_all(CONSUMERS["confluent"], broker, topic, written)
        offsets = [g.offset for g in got]
        assert offsets == sorted(set(offsets))
        for g in got:
            assert written[g.offset] == (g.rec.key, g.rec.value)
        assert {g.rec.key: g.rec.value for g in got} == latest(written)
        wait_cleaned(broker, topic)
        check_read(read_all(CONSUMERS["confluent"], broker, topic, written), written)
        assert "set aside" not in broker.log_text()
    finally:
        broker.stop()


def test_a_broker_killed_while_cleaning_loses_and_duplicates_nothing(
        tmp_path: Path, storage_engine: str, topic_name: str) -> None:
    """Killed during a first cleaning (full ledgers rewritten one by one), then during a
    second one, which merges the small ledgers the first left into one."""
    if storage_engine != "file":
        pytest.skip("the memory engine forgets at exit; postgres swaps in one transaction")
    data = tmp_path / "data"
    written: Written = {}
    compacted = {**COMPACTED, "segment.bytes": "65536"}
    kill_while_cleaning(data, topic_name, range(60), written, compacted)  # ~500 KB
    restart_and_check(data, topic_name, written)

    def ledgers() -> int:
        return sum(topic_name in str(path) for path in data.rglob(f"*{LEDGER_SUFFIX}"))

    before = ledgers()
    kill_while_cleaning(data, topic_name, range(60, 90), written)
    restart_and_check(data, topic_name, written)
    assert not list(data.rglob("*.dropped"))
    assert ledgers() < before  # the small ledgers the first cleaning left were merged
