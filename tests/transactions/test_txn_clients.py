"""Transactions acceptance 5: kafka-python and aiokafka transactional producers commit and
abort correctly, and their idempotent producers write no duplicates."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import kafka
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition

from tests.broker_process import BrokerProcess
from tests.clients import create_topic
from tests.txn_helpers import (
    NONE,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    TxnConnection,
    read_all,
    start_broker,
)

PARTITIONS = 3


@pytest.fixture(scope="module")
def txn_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = start_broker(Path(tmp_path_factory.mktemp("txn-clients")))
    yield process
    process.stop()


def _check(broker: BrokerProcess, topic: str, committed: list[bytes],
           aborted: list[bytes]) -> None:
    rc = read_all(broker.bootstrap, topic, PARTITIONS, "read_committed")
    assert Counter(v for _, _, v in rc) == Counter(committed)
    ru = read_all(broker.bootstrap, topic, PARTITIONS, "read_uncommitted")
    assert Counter(v for _, _, v in ru) == Counter(committed + aborted)
    conn = TxnConnection(broker.port)
    try:
        for p in range(PARTITIONS):
            assert conn.list_offset(topic, p, READ_COMMITTED) == \
                conn.list_offset(topic, p, READ_UNCOMMITTED)
    finally:
        conn.close()


def _kafka_python_committed(broker: BrokerProcess, topic: str) -> list[bytes]:
    """What a kafka-python read_committed consumer reads."""
    consumer = kafka.KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None,
                                   enable_auto_commit=False, auto_offset_reset="earliest",
                                   isolation_level="read_committed")
    tps = [kafka.TopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    ends = consumer.end_offsets(tps)  # the last stable offsets for read_committed
    got: list[bytes] = []
    for _ in range(60):
        for msgs in consumer.poll(500).values():
            got += [m.value for m in msgs]
        if all(consumer.position(tp) >= ends[tp] for tp in tps):
            break
    consumer.close()
    return got


def test_kafka_python_transactions(txn_broker: BrokerProcess, topic_name: str) -> None:
    create_topic(txn_broker.bootstrap, topic_name, PARTITIONS)
    producer = kafka.KafkaProducer(bootstrap_servers=txn_broker.bootstrap,
                                   transactional_id=f"tid-{topic_name}")
    committed: list[bytes] = []
    aborted: list[bytes] = []
    try:
        producer.init_transactions()
        for n in range(6):
            producer.begin_transaction()
            values = [f"kp-{n}-{i}".encode() for i in range(20)]
            futures = [producer.send(topic_name, value=v, partition=i % PARTITIONS)
                       for i, v in enumerate(values)]
            if n % 2:
                producer.flush()
                for f in futures:
                    f.get(10)
                producer.abort_transaction()
                aborted += values
            else:
                producer.commit_transaction()
                committed += values
    finally:
        producer.close()
    _check(txn_broker, topic_name, committed, aborted)
    assert Counter(_kafka_python_committed(txn_broker, topic_name)) == Counter(committed)


def test_kafka_python_send_offsets_to_transaction(txn_broker: BrokerProcess,
                                                  topic_name: str) -> None:
    create_topic(txn_broker.bootstrap, topic_name, PARTITIONS)
    group = f"grp-{topic_name}"
    producer = kafka.KafkaProducer(bootstrap_servers=txn_broker.bootstrap,
                                   transactional_id=f"tid-{topic_name}")
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic_name, value=b"a", partition=0).get(10)
        producer.send_offsets_to_transaction(
            {kafka.TopicPartition(topic_name, 0): kafka.OffsetAndMetadata(11, "", -1)}, group)
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send(topic_name, value=b"b", partition=0)
        producer.send_offsets_to_transaction(
            {kafka.TopicPartition(topic_name, 1): kafka.OffsetAndMetadata(5, "", -1)}, group)
        producer.commit_transaction()
    finally:
        producer.close()
    conn = TxnConnection(txn_broker.port)
    try:
        assert conn.offset_fetch(group, topic_name, range(PARTITIONS)) == {0: -1, 1: 5, 2: -1}
    finally:
        conn.close()
    _check(txn_broker, topic_name, [b"b"], [b"a"])


def test_aiokafka_transactions(txn_broker: BrokerProcess, topic_name: str) -> None:
    create_topic(txn_broker.bootstrap, topic_name, PARTITIONS)
    committed: list[bytes] = []
    aborted: list[bytes] = []

    class Abort(Exception):
        pass

    async def run() -> list[bytes]:
        producer = AIOKafkaProducer(bootstrap_servers=txn_broker.bootstrap,
                                    transactional_id=f"tid-{topic_name}")
        await producer.start()
        try:
            for n in range(6):
                values = [f"aio-{n}-{i}".encode() for i in range(20)]
                try:
                    async with producer.transaction():
                        futures = [await producer.send(topic_name, value=v,
                                                       partition=i % PARTITIONS)
                                   for i, v in enumerate(values)]
                        if n % 2:
                            await asyncio.gather(*futures)
                            raise Abort()
                    committed.extend(values)
                except Abort:
                    aborted.extend(values)
            # explicit begin/abort as well
            await producer.begin_transaction()
            values = [b"aio-explicit-abort"]
            await (await producer.send(topic_name, value=values[0], partition=0))
            await producer.abort_transaction()
            aborted.extend(values)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=txn_broker.bootstrap, group_id=None,
                                    enable_auto_commit=False, auto_offset_reset="earliest",
                                    isolation_level="read_committed")
        await consumer.start()
        got: list[bytes] = []
        try:
            tps = [AioTopicPartition(topic_name, p) for p in range(PARTITIONS)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            for _ in range(60):
                batch = await consumer.getmany(timeout_ms=500)
                for msgs in batch.values():
                    got += [m.value for m in msgs]
                if all([await consumer.position(tp) >= ends[tp] for tp in tps]):
                    break
        finally:
            await consumer.stop()
        return got

    got = asyncio.run(run())
    assert Counter(got) == Counter(committed)
    _check(txn_broker, topic_name, committed, aborted)


def test_kafka_python_idempotent_producer(txn_broker: BrokerProcess, topic_name: str) -> None:
    create_topic(txn_broker.bootstrap, topic_name, PARTITIONS)
    producer = kafka.KafkaProducer(bootstrap_servers=txn_broker.bootstrap,
                                   enable_idempotence=True, acks="all", linger_ms=2,
                                   batch_size=2048)
    values = [f"kpi-{i}".encode() for i in range(3000)]
    try:
        futures = [producer.send(topic_name, value=v, partition=i % PARTITIONS)
                   for i, v in enumerate(values)]
        producer.flush(60)
        for f in futures:
            f.get(10)
    finally:
        producer.close()
    _check_no_duplicates(txn_broker, topic_name, values)


def test_kafka_python_default_is_idempotent(txn_broker: BrokerProcess,
                                            topic_name: str) -> None:
    create_topic(txn_broker.bootstrap, topic_name, PARTITIONS)
    producer = kafka.KafkaProducer(bootstrap_servers=txn_broker.bootstrap)
    values = [f"kpd-{i}".encode() for i in range(300)]
    try:
        for i, v in enumerate(values):
            producer.send(topic_name, value=v, partition=i % PARTITIONS)
        producer.flush(60)
    finally:
        producer.close()
    # one producer id on every partition: kafka-python's default producer is idempotent
    _check_no_duplicates(txn_broker, topic_name, values)


def test_aiokafka_idempotent_producer(txn_broker: BrokerProcess, topic_name: str) -> None:
    create_topic(txn_broker.bootstrap, topic_name, PARTITIONS)
    values = [f"aioi-{i}".encode() for i in range(3000)]

    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=txn_broker.bootstrap,
                                    enable_idempotence=True, acks="all", linger_ms=2,
                                    max_batch_size=2048)
        await producer.start()
        try:
            futures = [await producer.send(topic_name, value=v, partition=i % PARTITIONS)
                       for i, v in enumerate(values)]
            await asyncio.gather(*futures)
        finally:
            await producer.stop()

    asyncio.run(run())
    _check_no_duplicates(txn_broker, topic_name, values)


def _check_no_duplicates(broker: BrokerProcess, topic: str, values: list[bytes]) -> None:
    """Every value exactly once, offsets contiguous; DescribeProducers shows one idempotent
    producer, the same on every partition, its last sequence the partition's last record."""
    got = read_all(broker.bootstrap, topic, PARTITIONS, "read_uncommitted")
    assert Counter(v for _, _, v in got) == Counter(values)
    for p in range(PARTITIONS):
        offsets = sorted(o for pp, o, _ in got if pp == p)
        assert offsets == list(range(len(offsets)))
    conn = TxnConnection(broker.port)
    try:
        answer = conn.describe_producers(topic, list(range(PARTITIONS)))
        [described] = answer.topics
        assert sorted(part.partition_index for part in described.partitions) == list(
            range(PARTITIONS))
        ids: set[int] = set()
        for part in described.partitions:
            assert part.error_code == NONE
            [state] = part.active_producers  # exactly one producer wrote each partition
            ids.add(state.producer_id)
            assert state.current_txn_start_offset == -1
            assert state.last_sequence == len(
                [1 for pp, _, _ in got if pp == part.partition_index]) - 1
        assert len(ids) == 1
    finally:
        conn.close()
