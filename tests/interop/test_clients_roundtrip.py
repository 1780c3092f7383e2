"""Acceptance 1: every client produces 10,000 records in each compression and reads them back
byte-for-byte, with offsets 0..n-1 on every partition."""

from __future__ import annotations

import time

import pytest

from tests.broker_process import BrokerProcess
from tests.clients import CONSUMERS, PARTITIONS, PRODUCERS, Got, create_topic, make_records

pytestmark = pytest.mark.storage_engines  # each test on file://, memory:// and postgres://

COUNT = 10_000
COMPRESSIONS = ["none", "gzip", "snappy", "lz4", "zstd"]


def check_roundtrip(got: list[Got], sent_count: int, base_ts: int) -> None:
    expected = make_records(sent_count, base_ts)
    assert len(got) == sent_count
    by_partition: dict[int, list[Got]] = {}
    for item in got:
        by_partition.setdefault(item.partition, []).append(item)
    assert sorted(by_partition) == list(range(PARTITIONS))
    for partition, items in by_partition.items():
        assert [g.offset for g in items] == list(range(len(items)))
        sent = [r for r in expected if r.partition == partition]
        assert [g.rec for g in items] == sent


@pytest.mark.parametrize("client", sorted(PRODUCERS))
@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_produce_and_consume_byte_for_byte(broker: BrokerProcess, topic_name: str,
                                           client: str, compression: str) -> None:
    create_topic(broker.bootstrap, topic_name)
    base_ts = int(time.time() * 1000) - 1_000_000
    PRODUCERS[client](broker.bootstrap, topic_name, make_records(COUNT, base_ts), compression)
    got = CONSUMERS[client](broker.bootstrap, topic_name, COUNT)
    check_roundtrip(got, COUNT, base_ts)


@pytest.mark.parametrize("reader", sorted(CONSUMERS))
def test_every_client_reads_what_librdkafka_wrote(broker: BrokerProcess, topic_name: str,
                                                  reader: str) -> None:
    create_topic(broker.bootstrap, topic_name)
    base_ts = int(time.time() * 1000) - 2_000_000
    PRODUCERS["confluent"](broker.bootstrap, topic_name, make_records(3000, base_ts), "zstd")
    check_roundtrip(CONSUMERS[reader](broker.bootstrap, topic_name, 3000), 3000, base_ts)
