"""The last stable offset never exceeds the high watermark, as Kafka keeps it. On the
PostgreSQL engine an append takes its offset and enters the producer state when it is
queued to the group commit, while the high watermark is the committed end: with the
partition's row locked by the test (so the commits wait), a plain batch queued at 1 and
a transactional batch at 2 open a transaction beyond what is committed (1). A read_committed
Fetch then answers a last stable offset at most its high watermark, ListOffsets
read_committed at most the read_uncommitted end; once the commits are done the stable
offset is the open transaction's first offset. The rule itself:
:meth:`PartitionProducers.last_stable_offset`, the one home both ask."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from kafka.protocol.producer import ProduceRequest

from broker_core.partition_producers import PartitionProducers
from tests.broker_process import BrokerProcess
from tests.postgres_server import shared_server
from tests.storage.test_postgres_speed import _lock_waits
from tests.txn_helpers import (
    NONE,
    READ_COMMITTED,
    TxnConnection,
    batch,
    start_broker,
    wait_until,
)


@pytest.fixture(scope="module")
def pg_url() -> str:
    return shared_server().new_database_url()


@pytest.fixture(scope="module")
def pg_broker(tmp_path_factory: pytest.TempPathFactory, pg_url: str) -> Iterator[BrokerProcess]:
    process = start_broker(Path(tmp_path_factory.mktemp("txn-lso")) / "data",
                           storageUrl=pg_url)
    yield process
    process.stop()


def _send_produce(conn: TxnConnection, topic: str, records: bytes,
                  transactional_id: str | None) -> None:
    """A Produce (v9, acks=all) whose answer is read later."""
    data = ProduceRequest.TopicProduceData(name=topic, partition_data=[
        ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=records)])
    conn.send_frame(conn.request_bytes(ProduceRequest[9](
        transactional_id=transactional_id, acks=-1, timeout_ms=30_000, topic_data=[data]), 9))


def test_stable_offset_stays_below_the_committed_end(pg_broker: BrokerProcess, pg_url: str,
                                                     topic_name: str) -> None:
    conn = TxnConnection(pg_broker.port, timeout=30)
    producer = TxnConnection(pg_broker.port, timeout=30)
    try:
        assert conn.create_topic(topic_name) == NONE
        tid = f"tid-{topic_name}"
        wait_until(lambda: conn.init_pid(tid).error_code == NONE, 30, "the coordinator")
        pid, epoch = conn.init_ok(tid)
        assert conn.add_partitions(tid, pid, epoch, {topic_name: [0]}) == \
            {(topic_name, 0): NONE}
        assert conn.produce(topic_name, batch(-1, -1, -1, 1)) == (NONE, 0)
        # the partition's producer state loaded (else a batch waits for the commits under
        # way before it is judged)
        assert conn.fetch(topic_name, isolation=READ_COMMITTED).last_stable_offset == 1
        with psycopg.connect(pg_url) as locker:
            locker.execute("SELECT 1 FROM edge_partitions WHERE topic LIKE %s FOR UPDATE",
                           (f"%/{topic_name}",))
            _send_produce(producer, topic_name, batch(-1, -1, -1, 1), None)
            _send_produce(producer, topic_name, batch(pid, epoch, 0, 2, True), tid)
            wait_until(lambda: bool(_lock_waits(pg_url)), 30, "a commit waiting for the lock")
            answer = conn.fetch(topic_name, isolation=READ_COMMITTED)
            assert answer.error_code == NONE
            assert answer.high_watermark == 1
            assert answer.last_stable_offset <= answer.high_watermark, answer
            assert conn.list_offset(topic_name, isolation=READ_COMMITTED) <= \
                conn.list_offset(topic_name) == 1
            locker.rollback()
        for _ in range(2):
            producer.read_frame()
        wait_until(lambda: conn.list_offset(topic_name) == 4, 30, "the batches committed")
        answer = conn.fetch(topic_name, isolation=READ_COMMITTED)
        assert (answer.high_watermark, answer.last_stable_offset) == (4, 2), answer
        assert conn.list_offset(topic_name, isolation=READ_COMMITTED) == 2
    finally:
        conn.close()
        producer.close()


def _state(*firsts: int) -> PartitionProducers:
    """A partition's producer state with an open transaction from each offset."""
    return PartitionProducers.from_json({
        "offset": max(firsts, default=0) + 1, "aborted": [],
        "producers": {str(pid): (0, [], first, -1, -1, False) for pid, first in enumerate(firsts)}})


def test_the_rule() -> None:
    """(high watermark, log start): the oldest open transaction's first offset, else the
    high watermark; raised to the log start; never above the high watermark."""
    assert _state(5, 8).last_stable_offset(10, 0) == 5
    assert _state().last_stable_offset(10, 0) == 10
    assert _state(12).last_stable_offset(10, 0) == 10  # opened past what is visible
    assert _state(2).last_stable_offset(10, 4) == 4  # records deleted past its first offset
    assert _state(2).last_stable_offset(3, 4) == 3  # even a log start past the watermark
    assert _state().last_stable_offset(3, 4) == 3
