"""Producer ids expire: a partition forgets a producer idle for ``producerIdExpirationMs``
unless it has a transaction open there, and a producer it does not know is accepted at
any sequence (KIP-360), so the producer whose id expired carries on without an error."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import confluent_kafka
import pytest

from broker_core.codec.batch_header import read_header
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.partition_producers import RESUME_GRACE_S, PartitionProducers
from broker_core.producer_states import SNAPSHOT_FILE, ProducerStates
from broker_core.storage import LogConfig, PartitionLog
from tests.clients import create_topic
from tests.operations.test_metrics import sample, scrape
from tests.ports import free_port
from tests.txn_helpers import (
    NONE,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
    TxnConnection,
    batch,
    start_broker,
    wait_until,
)

# -- the partition's bookkeeping -----------------------------------------------------------


def _record(state: PartitionProducers, pid: int, seq: int, offset: int, stamp: int,
            transactional: bool = False) -> None:
    header = read_header(batch(pid, 0, seq, 1, transactional=transactional))
    assert state.check(header) is None
    state.record(header, offset, stamp)


def test_idle_producers_are_forgotten_and_open_transactions_kept() -> None:
    state = PartitionProducers()
    _record(state, 1, 0, 0, stamp=1_000)
    _record(state, 2, 0, 1, stamp=5_000)
    _record(state, 3, 0, 2, stamp=1_000, transactional=True)
    # cut-off 4,000: producer 1 is idle; 3 is as old but its transaction is open
    assert state.expire(now_ms=7_000, expiration_ms=3_000) == 1
    assert sorted(state.producers) == [2, 3]
    # the commit marker is a write: it restarts producer 3's clock
    state.end_transaction(3, 0, commit=True, marker_offset=3, timestamp=6_000)
    assert state.expire(now_ms=8_500, expiration_ms=3_000) == 1  # cut-off 5,500: producer 2
    assert sorted(state.producers) == [3]
    assert state.expire(now_ms=9_000, expiration_ms=3_000) == 1  # exactly the expiration
    assert state.producers == {}


def test_an_unknown_producer_starts_at_any_sequence_and_is_held_to_it() -> None:
    state = PartitionProducers()
    _record(state, 9, 41, 0, stamp=1_000)
    assert state.check(read_header(batch(9, 0, 41, 1))) == 0  # a retry: its first offset
    with pytest.raises(KafkaApiError) as gap:
        state.check(read_header(batch(9, 0, 43, 1)))
    assert gap.value.code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert state.check(read_header(batch(9, 0, 42, 1))) is None


def test_a_partition_loaded_after_the_expiration_forgets_and_snapshots(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "t-0", LogConfig())
    try:
        states = ProducerStates()
        state = states.get("t", 0, log)
        data = bytearray(batch(5, 0, 0, 2))
        header = read_header(data)
        base = log.append(data, header)
        state.record(header, base, header.max_timestamp)
        states.save()
        assert json.loads((log.directory / SNAPSHOT_FILE).read_text())["producers"]
        time.sleep(0.01)
        # a broker restarted with a 1 ms expiration: the producer is gone on load, and the
        # next checkpoint rewrites the snapshot although the partition did not move
        later = ProducerStates(expiration_ms=1)
        assert later.get("t", 0, log).producers == {}

        async def flush(partition: PartitionLog) -> None:
            partition.flush()

        assert asyncio.run(later.checkpoint(flush)) == 1
        assert json.loads((log.directory / SNAPSHOT_FILE).read_text())["producers"] == {}
        assert asyncio.run(later.checkpoint(flush)) == 0
    finally:
        log.close()


# -- a real broker ---------------------------------------------------------------------------

EXPIRY = {"producerIdExpirationMs": "4000", "producerIdExpirationCheckIntervalMs": "200"}


def _active(conn: TxnConnection, topic: str) -> dict[int, int]:
    """Producer id -> start offset of its open transaction (-1: none), by DescribeProducers."""
    part = conn.describe_producers(topic, [0]).topics[0].partitions[0]
    assert part.error_code == NONE, part
    return {p.producer_id: p.current_txn_start_offset for p in part.active_producers}


def test_an_idle_producer_expires_and_carries_on(tmp_path: Path, topic_name: str) -> None:
    metrics_port = free_port()
    broker = start_broker(tmp_path, metricsPort=str(metrics_port), **EXPIRY)
    conn = TxnConnection(broker.port)
    try:
        create_topic(broker.bootstrap, topic_name, 1)
        producer = confluent_kafka.Producer({
            "bootstrap.servers": broker.bootstrap, "enable.idempotence": True,
            "linger.ms": 0})
        errors: list[str] = []

        def report(err: confluent_kafka.KafkaError | None, _msg: object) -> None:
            if err is not None:
                errors.append(str(err))

        def send(first: int, count: int) -> None:
            for i in range(first, first + count):
                producer.produce(topic_name, value=f"r-{i}".encode(), on_delivery=report)
                producer.poll(0)
            assert producer.flush(20) == 0

        send(0, 10)
        [pid] = _active(conn, topic_name)
        # a transactional producer with a transaction open on the same partition
        tid = f"tid-{topic_name}"
        txn_pid, epoch = conn.init_ok(tid)
        assert conn.add_partitions(tid, txn_pid, epoch, {topic_name: [0]}) == \
            {(topic_name, 0): NONE}
        assert conn.produce(topic_name, batch(txn_pid, epoch, 0, 1, transactional=True,
                                              prefix="txn"), 0, tid)[0] == NONE
        assert sample(scrape(metrics_port), "kop_server_producer_ids") == 2

        wait_until(lambda: pid not in _active(conn, topic_name), 20,
                   "the idle producer to expire")
        assert _active(conn, topic_name) == {txn_pid: 10}  # kept: its transaction is open
        broker.wait_for_log(r"forgot 1 producer id\(s\) idle for 4000 ms or more")
        assert sample(scrape(metrics_port), "kop_server_producer_ids") == 1

        # the idempotent producer goes on at sequence 10, and is accepted
        send(10, 10)
        assert errors == []
        assert pid in _active(conn, topic_name)

        # once its transaction ends, the transactional producer expires too
        assert conn.end_txn(tid, txn_pid, epoch, commit=True) == NONE
        wait_until(lambda: txn_pid not in _active(conn, topic_name), 20,
                   "the committed producer to expire")
        values = [v for v in conn.committed_values(topic_name) if v is not None]
        assert values == [f"r-{i}".encode() for i in range(10)] + [b"txn-0"] + \
            [f"r-{i}".encode() for i in range(10, 20)]
        producer.flush(5)
    finally:
        conn.close()
        broker.stop()


def test_a_gap_from_a_known_producer_is_still_refused(tmp_path: Path, topic_name: str) -> None:
    broker = start_broker(tmp_path)
    conn = TxnConnection(broker.port)
    try:
        assert conn.create_topic(topic_name) == NONE
        pid, epoch = conn.init_ok(None)
        assert conn.produce(topic_name, batch(pid, epoch, 7, 2)) == (NONE, 0)
        assert conn.produce(topic_name, batch(pid, epoch, 10, 1))[0] == \
            OUT_OF_ORDER_SEQUENCE_NUMBER
        assert conn.produce(topic_name, batch(pid, epoch, 7, 2)) == (NONE, 0)  # a retry
        assert conn.produce(topic_name, batch(pid, epoch, 9, 1)) == (NONE, 2)
        assert conn.list_offset(topic_name) == 3
    finally:
        conn.close()
        broker.stop()


# -- a batch that skips ahead just after the partition refused or failed one -------------


def test_a_gap_just_after_a_refusal_is_answered_retriable_then_out_of_order() -> None:
    """A batch that skips sequences within ``RESUME_GRACE_S`` of the partition refusing a
    produce as not its leader (or failing an append) is refused NOT_LEADER_OR_FOLLOWER:
    its predecessor is to come again first, and OUT_OF_ORDER_SEQUENCE_NUMBER would make
    librdkafka bump its epoch and send unacknowledged messages again as new. A rewound
    sequence, and any gap past the grace or with no refusal, is OUT_OF_ORDER as ever."""
    state = PartitionProducers()
    _record(state, 9, 0, 0, stamp=1_000)

    def answer(seq: int) -> int:
        with pytest.raises(KafkaApiError) as refused:
            state.check(read_header(batch(9, 0, seq, 1)))
        return int(refused.value.code)

    assert answer(5) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER  # no refusal: a real gap
    state.resumed_at = time.monotonic()
    assert answer(5) == ErrorCode.NOT_LEADER_OR_FOLLOWER
    _record(state, 9, 1, 1, stamp=2_000)
    _record(state, 9, 2, 2, stamp=2_000)
    assert answer((1 << 31) - 5) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER  # behind: rewound
    state.resumed_at = time.monotonic() - RESUME_GRACE_S - 1
    assert answer(5) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_a_refusal_reaches_the_state_loaded_after_it(tmp_path: Path) -> None:
    logs = [PartitionLog(tmp_path / f"t-{index}", LogConfig()) for index in (0, 1)]
    try:
        states = ProducerStates()
        states.resume("t", 0)  # refused while another broker had it: not loaded here
        loaded = states.get("t", 0, logs[0])
        assert loaded.resumed_at is not None
        assert time.monotonic() - loaded.resumed_at < RESUME_GRACE_S
        other = states.get("t", 1, logs[1])
        assert other.resumed_at is None
        states.resume("t", 1)  # a loaded state hears of it at once
        assert other.resumed_at is not None
    finally:
        for log in logs:
            log.close()
