"""Transactions acceptance 3: fencing by a newer producer of the same transactional id,
fenced epochs and invalid timeouts with exact requests, the retry of an InitProducerId
whose answer was lost (KIP-360), and the coordinator aborting a transaction past its
timeout."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import pytest

from broker_core.engine import Engine
from broker_core.transactions.model import Txn, TxnDocument
from tests.broker_process import BrokerProcess
from tests.clients import create_topic
from tests.coordinator_failures import STATE_TOPIC, moved, run_engine, served
from tests.txn_helpers import (
    INVALID_PRODUCER_EPOCH,
    INVALID_TRANSACTION_TIMEOUT,
    NONE,
    PRODUCER_FENCED,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    TRANSACTIONAL_ID_NOT_FOUND,
    TxnConnection,
    batch,
    read_all,
    start_broker,
    wait_until,
)

MAX_TIMEOUT = 60_000


@pytest.fixture(scope="module")
def txn_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = start_broker(Path(tmp_path_factory.mktemp("txn-fencing")),
                           transactionMaxTimeoutMs=str(MAX_TIMEOUT))
    yield process
    process.stop()


@pytest.fixture
def conn(txn_broker: BrokerProcess) -> Iterator[TxnConnection]:
    c = TxnConnection(txn_broker.port)
    yield c
    c.close()


def _fatal_fenced(exc: confluent_kafka.KafkaException) -> bool:
    err = exc.args[0]
    return err.fatal() and err.code() in (confluent_kafka.KafkaError._FENCED,
                                          confluent_kafka.KafkaError.PRODUCER_FENCED,
                                          confluent_kafka.KafkaError.INVALID_PRODUCER_EPOCH)


def test_second_producer_fences_the_first(txn_broker: BrokerProcess, topic_name: str) -> None:
    create_topic(txn_broker.bootstrap, topic_name, 2)
    tid = f"tid-{topic_name}"
    conf = {"bootstrap.servers": txn_broker.bootstrap, "transactional.id": tid,
            "linger.ms": 5}
    first = confluent_kafka.Producer(conf)
    first.init_transactions(30)
    first.begin_transaction()
    for i in range(4):
        first.produce(topic_name, value=f"first-{i}".encode(), partition=i % 2)
    assert first.flush(30) == 0

    second = confluent_kafka.Producer(conf)
    second.init_transactions(30)  # aborts the first's open transaction
    second.begin_transaction()
    second.produce(topic_name, value=b"second-0", partition=0)
    second.commit_transaction(30)

    with pytest.raises(confluent_kafka.KafkaException) as caught:
        first.produce(topic_name, value=b"first-late", partition=0)
        first.flush(10)
        first.commit_transaction(30)
    assert _fatal_fenced(caught.value), caught.value.args[0]
    # a fatal error: nothing transactional works any more
    with pytest.raises(confluent_kafka.KafkaException):
        first.begin_transaction()

    got = read_all(txn_broker.bootstrap, topic_name, 2, "read_committed")
    assert [v for _, _, v in got] == [b"second-0"]
    everything = read_all(txn_broker.bootstrap, topic_name, 2, "read_uncommitted")
    assert b"first-late" not in {v for _, _, v in everything}
    assert len(everything) == 5


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_old_epoch_is_fenced(conn: TxnConnection, topic_name: str, version: int) -> None:
    assert conn.create_topic(topic_name) == NONE
    tid = f"tid-{topic_name}"
    pid, old = conn.init_ok(tid)
    assert conn.add_partitions(tid, pid, old, {topic_name: [0]}) == {(topic_name, 0): NONE}
    assert conn.produce(topic_name, batch(pid, old, 0, 3, transactional=True), 0, tid) == \
        (NONE, 0)
    same, new = conn.init_ok(tid)  # the new session aborts the open transaction
    assert same == pid and new > old
    fenced = PRODUCER_FENCED if version >= 2 else INVALID_PRODUCER_EPOCH
    assert conn.end_txn(tid, pid, old, True, version) == fenced
    assert conn.add_partitions(tid, pid, old, {topic_name: [0]}, version) == \
        {(topic_name, 0): fenced}
    assert conn.add_offsets(tid, pid, old, f"grp-{topic_name}", version) == fenced
    # InitProducerId naming the old epoch (KIP-360, v3+) is fenced as well
    if version >= 3:
        answer = conn.init_pid(tid, 60_000, version=4, producer_id=pid, epoch=old)
        assert answer.error_code == PRODUCER_FENCED, answer
        answer = conn.init_pid(tid, 60_000, version=3, producer_id=pid, epoch=old)
        assert answer.error_code == INVALID_PRODUCER_EPOCH, answer
    # the old epoch's data is never committed; more old-epoch data is refused
    assert conn.produce(topic_name, batch(pid, old, 3, 1, transactional=True), 0, tid)[0] in \
        (INVALID_PRODUCER_EPOCH, PRODUCER_FENCED)
    end = conn.list_offset(topic_name)
    assert end == 4  # 3 records and the abort marker
    assert conn.list_offset(topic_name, 0, READ_COMMITTED) == end
    assert conn.committed_values(topic_name) == []
    # the new epoch works
    assert conn.add_partitions(tid, pid, new, {topic_name: [0]}) == {(topic_name, 0): NONE}
    assert conn.produce(topic_name, batch(pid, new, 0, 1, transactional=True, prefix="n"), 0,
                        tid) == (NONE, 4)
    assert conn.end_txn(tid, pid, new, True) == NONE
    assert conn.committed_values(topic_name) == [b"n-0"]


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_an_epoch_newer_than_the_current_one_is_fenced(conn: TxnConnection, topic_name: str,
                                                        version: int) -> None:
    """As Kafka's coordinator before transaction version 2: AddPartitionsToTxn,
    AddOffsetsToTxn and EndTxn naming any epoch but the current one, newer as older, are
    PRODUCER_FENCED (INVALID_PRODUCER_EPOCH before v2); a TxnOffsetCommit of such an epoch
    is INVALID_PRODUCER_EPOCH (Kafka's answer to a transactional write whose verification
    failed so), whatever its version. The transaction is untouched and goes on."""
    assert conn.create_topic(topic_name, 2) == NONE
    tid, group = f"tid-{topic_name}", f"grp-{topic_name}"
    conn.init_ok(tid)
    pid, epoch = conn.init_ok(tid)  # a second session: an older epoch exists too
    assert conn.add_partitions(tid, pid, epoch, {topic_name: [0]}) == {(topic_name, 0): NONE}
    assert conn.add_offsets(tid, pid, epoch, group) == NONE
    fenced = PRODUCER_FENCED if version >= 2 else INVALID_PRODUCER_EPOCH
    for other in (epoch + 1, epoch + 7):  # newer (older ones: test_old_epoch_is_fenced)
        assert conn.add_partitions(tid, pid, other, {topic_name: [1]}, version) == \
            {(topic_name, 1): fenced}
        assert conn.add_offsets(tid, pid, other, f"{group}-2", version) == fenced
        assert conn.end_txn(tid, pid, other, True, version) == fenced
        assert conn.end_txn(tid, pid, other, False, version) == fenced
        assert conn.txn_offset_commit(tid, group, pid, other, topic_name, {0: 1}, version) == \
            {0: INVALID_PRODUCER_EPOCH}
    assert conn.txn_offset_commit(tid, group, pid, epoch - 1, topic_name, {0: 1},
                                  version) == {0: INVALID_PRODUCER_EPOCH}
    # the current epoch's transaction went on, with only what it added itself
    assert conn.txn_offset_commit(tid, group, pid, epoch, topic_name, {0: 2}) == {0: NONE}
    assert conn.produce(topic_name, batch(pid, epoch, 0, 1, transactional=True), 0, tid) == \
        (NONE, 0)
    assert conn.end_txn(tid, pid, epoch, True) == NONE
    assert conn.committed_values(topic_name) == [b"v-0"]
    assert conn.offset_fetch(group, topic_name, [0])[0] == 2


def _init(conn: TxnConnection, tid: str, pid: int, epoch: int) -> tuple[int, int, int]:
    answer = conn.init_pid(tid, 60_000, version=4, producer_id=pid, epoch=epoch)
    return int(answer.error_code), int(answer.producer_id), int(answer.producer_epoch)


def test_init_producer_id_retried_after_its_answer_was_lost(conn: TxnConnection,
                                                            topic_name: str) -> None:
    """InitProducerId(pid, epoch) bumps the epoch; the same request again (its answer was
    lost) gets the bumped epoch, as Kafka's (KIP-360), not PRODUCER_FENCED. Once the
    producer goes on with the new epoch, or a new session starts, that retry is fenced."""
    assert conn.create_topic(topic_name) == NONE
    tid = f"tid-{topic_name}"
    pid, epoch = conn.init_ok(tid)
    assert _init(conn, tid, pid, epoch) == (NONE, pid, epoch + 1)
    assert _init(conn, tid, pid, epoch) == (NONE, pid, epoch + 1)  # the retry
    assert _init(conn, tid, pid, epoch) == (NONE, pid, epoch + 1)
    assert conn.add_partitions(tid, pid, epoch + 1, {topic_name: [0]}) == \
        {(topic_name, 0): NONE}
    # a duplicate of the old request while the transaction is open is fenced, and the
    # transaction is left alone
    assert _init(conn, tid, pid, epoch)[0] == PRODUCER_FENCED
    assert conn.end_txn(tid, pid, epoch + 1, True) == NONE
    assert _init(conn, tid, pid, epoch + 1) == (NONE, pid, epoch + 2)
    assert conn.init_ok(tid) == (pid, epoch + 3)  # a new session: nothing to retry
    assert _init(conn, tid, pid, epoch + 1)[0] == PRODUCER_FENCED
    assert _init(conn, tid, pid, epoch + 2)[0] == PRODUCER_FENCED


def test_an_init_producer_id_retry_is_answered_after_a_move() -> None:
    """The epoch a retried InitProducerId gets back is stored with the transactional id:
    a coordinator that replays it after a move answers the retry the same way. A record
    written before it was kept reads as nothing to retry."""

    async def scenario(url: str, engine: Engine) -> None:
        txns = engine.transactions
        await served(txns, STATE_TOPIC, "tx")
        pid, epoch = await txns.init_producer_id(STATE_TOPIC, "tx", 60_000, -1, -1)
        assert await txns.init_producer_id(STATE_TOPIC, "tx", 60_000, pid, epoch) == \
            (pid, epoch + 1)
        await moved(txns, STATE_TOPIC, "tx")
        await served(txns, STATE_TOPIC, "tx")
        assert await txns.init_producer_id(STATE_TOPIC, "tx", 60_000, pid, epoch) == \
            (pid, epoch + 1)

    run_engine(scenario)
    older: TxnDocument = {"producerId": 5, "epoch": 2, "timeoutMs": 1000, "state": "Empty",
                          "partitions": [], "groups": [], "startMs": -1, "updateMs": 0}
    txn = Txn.from_record("old", STATE_TOPIC, 0, older)
    assert (txn.producer_id, txn.epoch, txn.last_producer_id, txn.last_epoch) == (5, 2, -1, -1)


def test_invalid_transaction_timeout(conn: TxnConnection, topic_name: str) -> None:
    tid = f"tid-{topic_name}"
    for version in range(0, 6):
        kwargs = {} if version < 3 else {"producer_id": -1, "epoch": -1}
        for timeout in (MAX_TIMEOUT + 1, 0, -5):
            answer = conn.init_pid(tid, timeout, version=version, **kwargs)
            assert answer.error_code == INVALID_TRANSACTION_TIMEOUT, (version, timeout, answer)
    # refused, so never created
    assert conn.describe_transactions([tid]).transaction_states[0].error_code == \
        TRANSACTIONAL_ID_NOT_FOUND
    assert conn.init_pid(tid, MAX_TIMEOUT).error_code == NONE
    # an idempotent producer has no transaction timeout
    assert conn.init_pid(None, MAX_TIMEOUT + 1).error_code == NONE


def test_confluent_timeout_above_the_maximum_is_refused(txn_broker: BrokerProcess,
                                                        topic_name: str) -> None:
    p = confluent_kafka.Producer({"bootstrap.servers": txn_broker.bootstrap,
                                  "transactional.id": f"tid-{topic_name}",
                                  "transaction.timeout.ms": MAX_TIMEOUT + 1000})
    with pytest.raises(confluent_kafka.KafkaException) as caught:
        p.init_transactions(15)
    assert caught.value.args[0].code() == confluent_kafka.KafkaError.INVALID_TRANSACTION_TIMEOUT


def test_timed_out_transaction_is_aborted(conn: TxnConnection, topic_name: str) -> None:
    assert conn.create_topic(topic_name, 2) == NONE
    tid = f"tid-{topic_name}"
    pid, epoch = conn.init_ok(tid, timeout_ms=1500)
    assert conn.add_partitions(tid, pid, epoch, {topic_name: [0, 1]}) == \
        {(topic_name, 0): NONE, (topic_name, 1): NONE}
    assert conn.produce(topic_name, batch(pid, epoch, 0, 5, transactional=True), 0, tid) == \
        (NONE, 0)
    assert conn.produce(topic_name, batch(pid, epoch, 0, 2, transactional=True), 1, tid) == \
        (NONE, 0)
    other, _ = conn.init_ok(None)
    assert conn.produce(topic_name, batch(other, 0, 0, 1, prefix="plain"), 0) == (NONE, 5)
    assert conn.list_offset(topic_name, 0, READ_COMMITTED) == 0
    assert conn.list_offset(topic_name, 1, READ_COMMITTED) == 0
    started = time.monotonic()
    wait_until(lambda: conn.list_offset(topic_name, 0, READ_COMMITTED) > 0, 10,
               "the timed-out transaction to be aborted")
    assert time.monotonic() - started > 0.5  # not before its timeout
    for part, count in ((0, 7), (1, 3)):
        assert conn.list_offset(topic_name, part) == count
        assert conn.list_offset(topic_name, part, READ_COMMITTED) == count
    assert conn.committed_values(topic_name, 0) == [b"plain-0"]
    assert conn.committed_values(topic_name, 1) == []
    state = conn.describe_transactions([tid]).transaction_states[0]
    assert state.transaction_state == "CompleteAbort", state
    assert state.producer_epoch > epoch
    # the producer learns it was fenced
    assert conn.end_txn(tid, pid, epoch, True) == PRODUCER_FENCED
    assert conn.add_partitions(tid, pid, epoch, {topic_name: [0]}) == \
        {(topic_name, 0): PRODUCER_FENCED}
    assert conn.list_offset(topic_name, 0) == 7


def test_confluent_transaction_past_its_timeout(txn_broker: BrokerProcess,
                                                topic_name: str) -> None:
    create_topic(txn_broker.bootstrap, topic_name, 2)
    p = confluent_kafka.Producer({"bootstrap.servers": txn_broker.bootstrap,
                                  "transactional.id": f"tid-{topic_name}",
                                  "transaction.timeout.ms": 2000, "linger.ms": 5})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(6):
        p.produce(topic_name, value=f"late-{i}".encode(), partition=i % 2)
    assert p.flush(30) == 0
    conn = TxnConnection(txn_broker.port)
    try:
        assert conn.list_offset(topic_name, 0, READ_COMMITTED) == 0
        wait_until(lambda: all(conn.list_offset(topic_name, q, READ_COMMITTED) ==
                               conn.list_offset(topic_name, q, READ_UNCOMMITTED) == 4
                               for q in range(2)), 10, "the abort after the timeout")
    finally:
        conn.close()
    with pytest.raises(confluent_kafka.KafkaException):
        p.commit_transaction(15)
    assert read_all(txn_broker.bootstrap, topic_name, 2, "read_committed") == []
