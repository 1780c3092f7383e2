"""Transactions acceptance 1: a confluent-kafka transactional producer. Committed
transactions are visible to read_committed consumers, aborted ones are not, read_uncommitted
sees both; offsets stay contiguous with one offset per marker; an open transaction holds
back the last stable offset. Also the admin views DescribeTransactions, ListTransactions and
DescribeProducers."""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka import IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from tests.broker_process import BrokerProcess
from tests.clients import create_topic
from tests.conftest import check_engine_left, engine_settings
from tests.txn_helpers import (
    NONE,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    TRANSACTIONAL_ID_NOT_FOUND,
    TxnConnection,
    read_all,
    start_broker,
    visible_within,
)

pytestmark = pytest.mark.storage_engines  # each test on file://, memory:// and postgres://

PARTITIONS = 4


@pytest.fixture(scope="module")
def txn_broker(tmp_path_factory: pytest.TempPathFactory,
               storage_engine: str) -> Iterator[BrokerProcess]:
    data = Path(tmp_path_factory.mktemp("txn-confluent")) / "data"
    process = start_broker(data, **engine_settings(storage_engine))
    yield process
    process.stop()
    check_engine_left(data, storage_engine)


def producer(broker: BrokerProcess, tid: str, **extra: object) -> confluent_kafka.Producer:
    p = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap,
                                  "transactional.id": tid, "linger.ms": 5, **extra})
    p.init_transactions(30)
    return p


def test_commit_and_abort_visibility_and_contiguous_offsets(txn_broker: BrokerProcess,
                                                            topic_name: str) -> None:
    create_topic(txn_broker.bootstrap, topic_name, PARTITIONS)
    p = producer(txn_broker, f"tid-{topic_name}")
    committed: list[bytes] = []
    aborted: list[bytes] = []
    markers = Counter[int]()
    # five transactions, alternately committed and aborted, of different sizes and spreads
    plan = [("commit", 40, PARTITIONS), ("abort", 25, PARTITIONS), ("commit", 7, 2),
            ("abort", 3, 1), ("commit", 30, PARTITIONS)]
    for n, (kind, count, spread) in enumerate(plan):
        p.begin_transaction()
        values = [f"{kind}-{n}-{i}".encode() for i in range(count)]
        for i, value in enumerate(values):
            p.produce(topic_name, value=value, partition=i % spread)
        for part in range(min(spread, count)):
            markers[part] += 1
        if kind == "commit":
            p.commit_transaction(30)
            committed += values
        else:
            assert p.flush(30) == 0
            p.abort_transaction(30)
            aborted += values

    rc = read_all(txn_broker.bootstrap, topic_name, PARTITIONS, "read_committed")
    assert Counter(v for _, _, v in rc) == Counter(committed)
    ru = read_all(txn_broker.bootstrap, topic_name, PARTITIONS, "read_uncommitted")
    assert Counter(v for _, _, v in ru) == Counter(committed + aborted)

    # offsets: one gap per marker, and the high watermark counts the markers
    admin_consumer = confluent_kafka.Consumer({"bootstrap.servers": txn_broker.bootstrap,
                                               "group.id": "wm"})
    try:
        for part in range(PARTITIONS):
            offsets = sorted(o for pp, o, _ in ru if pp == part)
            gaps = sum(b - a - 1 for a, b in itertools.pairwise(offsets))
            # the last marker follows the last record: it is not a gap between records
            assert gaps == markers[part] - 1, (part, offsets)
            assert all(b - a in (1, 2) for a, b in itertools.pairwise(offsets))
            assert offsets[0] == 0
            low, high = admin_consumer.get_watermark_offsets(TopicPartition(topic_name, part),
                                                             10)
            assert (low, high) == (0, offsets[-1] + 2), (part, offsets, high)
            assert high == len(offsets) + markers[part]
            rc_offsets = sorted(o for pp, o, _ in rc if pp == part)
            assert set(rc_offsets) <= set(offsets)
    finally:
        admin_consumer.close()
    # nothing is open: the last stable offset is the high watermark everywhere
    conn = TxnConnection(txn_broker.port)
    try:
        for part in range(PARTITIONS):
            assert conn.list_offset(topic_name, part, READ_COMMITTED) == \
                conn.list_offset(topic_name, part, READ_UNCOMMITTED)
    finally:
        conn.close()


def test_open_transaction_invisible_until_commit_and_lso(txn_broker: BrokerProcess,
                                                         topic_name: str) -> None:
    create_topic(txn_broker.bootstrap, topic_name, 2)
    plain = confluent_kafka.Producer({"bootstrap.servers": txn_broker.bootstrap})
    for i in range(3):
        plain.produce(topic_name, value=f"before-{i}".encode(), partition=0)
    assert plain.flush(10) == 0
    p = producer(txn_broker, f"tid-{topic_name}")
    p.begin_transaction()
    for i in range(5):
        p.produce(topic_name, value=f"open-{i}".encode(), partition=i % 2)
    assert p.flush(30) == 0
    # records of other producers after the open transaction's first record stay hidden too
    for i in range(2):
        plain.produce(topic_name, value=f"after-{i}".encode(), partition=0)
    assert plain.flush(10) == 0

    seen = visible_within(txn_broker.bootstrap, topic_name, 2, "read_committed", 2.0)
    assert sorted(v for _, _, v in seen) == [b"before-0", b"before-1", b"before-2"]
    seen_all = visible_within(txn_broker.bootstrap, topic_name, 2, "read_uncommitted", 1.5)
    assert len(seen_all) == 10

    admin = AdminClient({"bootstrap.servers": txn_broker.bootstrap})

    def latest(isolation: IsolationLevel) -> dict[int, int]:
        futures = admin.list_offsets({TopicPartition(topic_name, p): OffsetSpec.latest()
                                      for p in range(2)}, isolation_level=isolation,
                                     request_timeout=10)
        return {tp.partition: f.result(10).offset for tp, f in futures.items()}

    assert latest(IsolationLevel.READ_COMMITTED) == {0: 3, 1: 0}
    assert latest(IsolationLevel.READ_UNCOMMITTED) == {0: 8, 1: 2}

    # the admin views while it is open
    conn = TxnConnection(txn_broker.port)
    try:
        tid = f"tid-{topic_name}"
        state = conn.describe_transactions([tid, f"unknown-{tid}"]).transaction_states
        assert state[0].error_code == NONE, state
        assert state[0].transaction_state == "Ongoing"
        assert state[0].producer_id >= 0 and state[0].transaction_start_time_ms > 0
        # (the topic's name is checked in test_describe_transactions_topic_names)
        assert [sorted(t.partitions) for t in state[0].topics] == [[0, 1]], state[0].topics
        assert state[1].error_code == TRANSACTIONAL_ID_NOT_FOUND, state[1]
        listed = conn.list_transactions(["Ongoing"]).transaction_states
        assert tid in [t.transactional_id for t in listed]
        listed = conn.list_transactions([], [state[0].producer_id]).transaction_states
        assert [(t.transactional_id, t.transaction_state) for t in listed] == \
            [(tid, "Ongoing")]
        listed = conn.list_transactions(version=2, pattern=re.escape(tid[:20]) + ".*").\
            transaction_states
        assert [t.transactional_id for t in listed] == [tid]
        unknown = conn.list_transactions(["NoSuchState"])
        assert list(unknown.unknown_state_filters) == ["NoSuchState"]
        producers = conn.describe_producers(topic_name, [0, 1]).topics[0].partitions
        for part in producers:
            assert part.error_code == NONE
            ours = [a for a in part.active_producers if a.producer_id == state[0].producer_id]
            assert len(ours) == 1, part
            assert ours[0].current_txn_start_offset == (3 if part.partition_index == 0 else 0)
            assert ours[0].producer_epoch == state[0].producer_epoch
            assert ours[0].last_sequence >= 1
    finally:
        conn.close()

    p.commit_transaction(30)
    after = read_all(txn_broker.bootstrap, topic_name, 2, "read_committed")
    assert sorted(v for _, _, v in after) == sorted(
        [f"before-{i}".encode() for i in range(3)] + [f"open-{i}".encode() for i in range(5)]
        + [b"after-0", b"after-1"])
    assert latest(IsolationLevel.READ_COMMITTED) == {0: 9, 1: 3}
    assert latest(IsolationLevel.READ_UNCOMMITTED) == {0: 9, 1: 3}
    conn = TxnConnection(txn_broker.port)
    try:
        tid = f"tid-{topic_name}"
        state = conn.describe_transactions([tid]).transaction_states[0]
        assert state.transaction_state == "CompleteCommit" and list(state.topics) == []
        for part in conn.describe_producers(topic_name, [0, 1]).topics[0].partitions:
            ours = [a for a in part.active_producers if a.producer_id == state.producer_id]
            assert ours and ours[0].current_txn_start_offset == -1, part
        assert tid in [t.transactional_id for t in
                       conn.list_transactions(["CompleteCommit"]).transaction_states]
        assert tid not in [t.transactional_id for t in
                           conn.list_transactions(["Ongoing"]).transaction_states]
    finally:
        conn.close()


def test_many_small_transactions_with_interleaved_readers(txn_broker: BrokerProcess,
                                                          topic_name: str) -> None:
    """A read_committed consumer running alongside sees exactly the committed records."""
    create_topic(txn_broker.bootstrap, topic_name, PARTITIONS)
    p = producer(txn_broker, f"tid-{topic_name}")
    expected: list[bytes] = []
    for n in range(30):
        p.begin_transaction()
        values = [f"t{n}-{i}".encode() for i in range(10)]
        for i, value in enumerate(values):
            p.produce(topic_name, value=value, partition=(n + i) % PARTITIONS)
        if n % 3 == 2:
            assert p.flush(30) == 0
            p.abort_transaction(30)
        else:
            p.commit_transaction(30)
            expected += values
    got = read_all(txn_broker.bootstrap, topic_name, PARTITIONS, "read_committed")
    assert Counter(v for _, _, v in got) == Counter(expected)


def test_describe_transactions_topic_names(txn_broker: BrokerProcess, topic_name: str) -> None:
    """DescribeTransactions names a transaction's topics as the client named them (as
    Metadata, OffsetFetch and CreateTopics do), not by the broker's internal name."""
    create_topic(txn_broker.bootstrap, topic_name, 2)
    tid = f"tid-{topic_name}"
    p = producer(txn_broker, tid)
    p.begin_transaction()
    p.produce(topic_name, value=b"x", partition=1)
    assert p.flush(30) == 0
    conn = TxnConnection(txn_broker.port)
    try:
        state = conn.describe_transactions([tid]).transaction_states[0]
        assert state.transaction_state == "Ongoing"
        assert [(t.topic, list(t.partitions)) for t in state.topics] == [(topic_name, [1])], \
            state.topics
    finally:
        conn.close()
        p.abort_transaction(30)
