"""Damaged ledger files under a real broker: a sealed ledger cut short, a byte flipped
inside a sealed ledger. The broker is stopped, the file damaged, the broker started
again; real clients then check that every intact record is served at its offset, that the
damaged ones are not (CORRUPT_MESSAGE), that no offset is reused, and that the damage is
in the log, the metrics and DescribeLogDirs until an operator deletes past it."""

from __future__ import annotations

import json
import os
import re
import urllib.request
from pathlib import Path

import confluent_kafka
import kafka.admin
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from tests.broker_process import BrokerProcess
from tests.clients import create_topic, present
from tests.ports import free_port
from tests.storage_helpers import flip_byte, partition_dir, read_partition, stored_entries

KAFKA_STORAGE_ERROR = 56
CORRUPT_MESSAGE = 2


def produce(bootstrap: str, topic: str, partition: int, values: list[bytes]) -> list[int]:
    """Produce one record per batch; return the offsets the broker assigned, in order."""
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 0,
                                         "batch.num.messages": 1, "acks": "all"})
    offsets: list[int] = []

    def report(err: object, msg: confluent_kafka.Message) -> None:
        assert err is None, err
        offsets.append(present(msg.offset()))

    for value in values:
        producer.produce(topic, value=value, partition=partition, on_delivery=report)
        producer.flush(30)
    assert producer.flush(30) == 0
    return offsets


def scrape_damage(port: int, topic: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    pattern = (r'kop_server_log_damaged_offsets\{partition="0",topic="public/default/'
               + re.escape(topic) + r'"\} (\S+)')
    found = re.search(pattern, text)
    assert found, text
    return float(found[1])


def log_dir_error(bootstrap: str) -> int:
    admin = kafka.admin.KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        [result] = admin.describe_log_dirs()
        [log_dir] = result["log_dirs"]
        return int(log_dir["error_code"])
    finally:
        admin.close()


def first_ledger(tmp_path: Path, topic: str) -> tuple[Path, int]:
    """The first ledger file of partition 0 and the offset after it, as recorded."""
    directory = partition_dir(tmp_path, topic)
    metadata = json.loads((directory / "partition.json").read_text())
    ledgers = metadata["ledgers"]
    assert len(ledgers) >= 3, ledgers
    files = sorted(directory.glob("*.ledger"))
    return files[0], int(ledgers[0]["nextOffset"])


def written(tmp_path: Path, topic: str, partitions: int, count: int,
            metrics_port: int) -> BrokerProcess:
    """A broker (stopped again) that wrote ``count`` records to each partition over at
    least three ledgers; returns the broker to start again."""
    broker = BrokerProcess(tmp_path, {"logSegmentBytes": "1024",
                                      "metricsPort": str(metrics_port)}).start()
    try:
        create_topic(broker.bootstrap, topic, partitions)
        for partition in range(partitions):
            values = [f"p{partition}-v{i}".encode() for i in range(count)]
            assert produce(broker.bootstrap, topic, partition, values) == list(range(count))
    finally:
        assert broker.stop() == 0
    return broker


def test_torn_sealed_ledger_keeps_later_ledgers_and_offsets(tmp_path: Path,
                                                           topic_name: str) -> None:
    count = 60
    metrics_port = free_port()
    broker = written(tmp_path, topic_name, 1, count, metrics_port)
    path, first_end = first_ledger(tmp_path, topic_name)
    os.truncate(path, path.stat().st_size - 10)  # the last batch of ledger 1 is cut short
    lost = first_end - 1  # one record a batch
    broker.start()
    try:
        line = broker.wait_for_log(r"ERROR .*are damaged")
        assert f"offsets [{lost}, {first_end}) in ledger file {path.name}" in line
        assert f"topics/public/default/{topic_name}/0" in line
        boot = broker.bootstrap
        # the intact prefix, then CORRUPT_MESSAGE at the damaged offset
        records, errors = read_partition(boot, topic_name, 0, 0, count)
        assert errors == {CORRUPT_MESSAGE}
        assert records == {i: f"p0-v{i}".encode() for i in range(lost)}
        # every intact ledger after it is still served at its original offsets
        records, errors = read_partition(boot, topic_name, 0, first_end, count)
        assert errors == set()
        assert records == {i: f"p0-v{i}".encode() for i in range(first_end, count)}
        consumer = confluent_kafka.Consumer({"bootstrap.servers": boot, "group.id": "wm"})
        assert consumer.get_watermark_offsets(TopicPartition(topic_name, 0), 10) == (0, count)
        consumer.close()
        assert produce(boot, topic_name, 0, [b"after"]) == [count]  # no offset reused
        assert scrape_damage(metrics_port, topic_name) == 1
        assert log_dir_error(boot) == KAFKA_STORAGE_ERROR
        # the operator gives the damaged record up: DeleteRecords past it
        admin = AdminClient({"bootstrap.servers": boot})
        [future] = admin.delete_records([TopicPartition(topic_name, 0, first_end)]).values()
        assert future.result(10).low_watermark == first_end
        assert scrape_damage(metrics_port, topic_name) == 0
        assert log_dir_error(boot) == 0
        records, errors = read_partition(boot, topic_name, 0, 0, count + 1)  # resets to the start
        assert errors == set()
        assert min(records) == first_end and records[count] == b"after"
    finally:
        broker.stop()


def test_flipped_byte_in_sealed_ledger_is_not_served(tmp_path: Path, topic_name: str) -> None:
    count = 60
    metrics_port = free_port()
    broker = written(tmp_path, topic_name, 2, count, metrics_port)
    path, _end = first_ledger(tmp_path, topic_name)
    entries = stored_entries(path)
    damaged = entries[2]
    flip_byte(path, damaged.position + damaged.size - 2)  # inside the record's value
    broker.start()
    try:
        boot = broker.bootstrap
        records, errors = read_partition(boot, topic_name, 0, 0, count)
        assert errors == {CORRUPT_MESSAGE}
        assert records == {i: f"p0-v{i}".encode() for i in range(damaged.index)}
        line = broker.wait_for_log(r"ERROR .*are damaged")
        assert (f"offsets [{damaged.index}, {damaged.index + 1}) in ledger file {path.name}"
                in line) and "CRC32C" in line
        # the damaged batch is never served, whatever offset of it is asked for
        records, errors = read_partition(boot, topic_name, 0, damaged.index, count)
        assert errors == {CORRUPT_MESSAGE} and records == {}
        # everything after it, and the other partition, are served as stored
        records, errors = read_partition(boot, topic_name, 0, damaged.index + 1, count)
        assert errors == set()
        assert records == {i: f"p0-v{i}".encode() for i in range(damaged.index + 1, count)}
        records, errors = read_partition(boot, topic_name, 1, 0, count)
        assert errors == set()
        assert records == {i: f"p1-v{i}".encode() for i in range(count)}
        assert scrape_damage(metrics_port, topic_name) == 1
        assert log_dir_error(boot) == KAFKA_STORAGE_ERROR
        assert produce(boot, topic_name, 0, [b"after"]) == [count]
    finally:
        broker.stop()
