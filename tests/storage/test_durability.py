"""Acceptance 3: acknowledged records survive SIGTERM and kill -9 with their offsets, new records
continue at the next offset, and a ledger whose last entry was cut in half is recovered (as
a crash's torn tail, or, once a clean stop recorded it, as damage whose offset is not reused)."""

from __future__ import annotations

import time
from pathlib import Path

import confluent_kafka
import pytest

from tests.broker_process import BrokerProcess
from tests.clients import consume_confluent, create_topic, make_records, present, produce_confluent
from tests.storage_helpers import partition_dir, read_partition

CORRUPT_MESSAGE = 2


def produce_more_and_check_offsets(broker: BrokerProcess, topic: str, first_new: int) -> None:
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    offsets: list[int] = []
    for i in range(5):
        producer.produce(topic, value=f"after-{i}".encode(), partition=0,
                         on_delivery=lambda err, msg: offsets.append(present(msg.offset())))
    assert producer.flush(30) == 0
    assert sorted(offsets) == list(range(first_new, first_new + 5))


@pytest.mark.parametrize("how", ["sigterm", "kill-9"])
def test_acknowledged_records_survive_restart(tmp_path: Path, topic_name: str, how: str) -> None:
    broker = BrokerProcess(tmp_path, {"logSegmentBytes": "65536"}).start()
    try:
        create_topic(broker.bootstrap, topic_name)
        recs = make_records(6000, int(time.time() * 1000))
        produce_confluent(broker.bootstrap, topic_name, recs, "lz4")
        if how == "sigterm":
            assert broker.stop() == 0
            broker.wait_for_log("edge-broker stopped")
        else:
            broker.kill()  # right after the acks=all flush returned
        broker.start()
        got = consume_confluent(broker.bootstrap, topic_name, len(recs))
        assert len(got) == len(recs)
        for partition in range(3):
            mine = [g for g in got if g.partition == partition]
            assert [g.offset for g in mine] == list(range(len(mine)))
            assert [g.rec for g in mine] == [r for r in recs if r.partition == partition]
        produce_more_and_check_offsets(broker, topic_name, len(recs) // 3)
    finally:
        broker.kill()


@pytest.mark.parametrize("how", ["sigterm", "kill-9"])
def test_torn_last_entry_is_dropped(tmp_path: Path, topic_name: str, how: str) -> None:
    broker = BrokerProcess(tmp_path, {"flushIntervalMs": "0"}).start()
    try:
        create_topic(broker.bootstrap, topic_name, 1)
        producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap,
                                             "acks": "all", "linger.ms": 0})
        for batch in range(10):  # ten entries of one record each, all of the same size
            producer.produce(topic_name, value=f"record-{batch}".encode() * 20, partition=0)
            assert producer.flush(10) == 0
        if how == "sigterm":
            assert broker.stop() == 0
        else:
            broker.kill()
        ledgers = sorted(partition_dir(tmp_path, topic_name, 0).glob("*.ledger"))
        last = ledgers[-1]
        size = last.stat().st_size
        entry = size // 10
        with open(last, "r+b") as handle:
            handle.truncate(size - entry // 2)  # cut the last entry in half
        broker.start()
        if how == "sigterm":  # the stop fsynced and recorded it: losing it is damage
            broker.wait_for_log(r"ERROR .*offsets \[9, 10\) in ledger file .* are damaged")
        else:  # the tail past the last recorded fsync, as a crash leaves it
            broker.wait_for_log(r"truncating \d+ bytes \(entries from offset 9 on\)")
        records, errors = read_partition(broker.bootstrap, topic_name, 0, 0, 10, timeout=5)
        assert sorted(records) == list(range(9))
        assert records[8] == b"record-8" * 20
        assert errors == ({CORRUPT_MESSAGE} if how == "sigterm" else set())
        # an offset recorded as written is never given to another record
        produce_more_and_check_offsets(broker, topic_name, 10 if how == "sigterm" else 9)
    finally:
        broker.kill()
