"""Transactions acceptance 6: bad transaction and idempotence requests get Kafka's error
codes and write nothing; tenants cannot reach each other's groups or topics through a
transaction."""

from __future__ import annotations

import base64
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from tests.batches import build_batch
from tests.broker_process import BrokerProcess
from tests.security_helpers import plain_message
from tests.txn_helpers import (
    FAST_TXN,
    INVALID_PRODUCER_EPOCH,
    INVALID_PRODUCER_ID_MAPPING,
    INVALID_REGULAR_EXPRESSION,
    INVALID_TXN_STATE,
    NONE,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
    PRODUCER_FENCED,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    TOPIC_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    UNKNOWN_TOPIC_OR_PARTITION,
    TxnConnection,
    batch,
    start_broker,
    wait_until,
)


@pytest.fixture(scope="module")
def txn_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = start_broker(Path(tmp_path_factory.mktemp("txn-bad")))
    yield process
    process.stop()


@pytest.fixture
def conn(txn_broker: BrokerProcess) -> Iterator[TxnConnection]:
    c = TxnConnection(txn_broker.port)
    yield c
    c.close()


def test_end_txn_without_a_transaction(conn: TxnConnection, topic_name: str) -> None:
    assert conn.create_topic(topic_name) == NONE
    tid = f"tid-{topic_name}"
    pid, epoch = conn.init_ok(tid)
    for version in (0, 1, 2, 3):
        assert conn.end_txn(tid, pid, epoch, True, version) == INVALID_TXN_STATE
        assert conn.end_txn(tid, pid, epoch, False, version) == INVALID_TXN_STATE
    assert conn.list_offset(topic_name) == 0


def test_add_partitions_with_a_stale_epoch(conn: TxnConnection, topic_name: str) -> None:
    assert conn.create_topic(topic_name) == NONE
    tid = f"tid-{topic_name}"
    pid, old = conn.init_ok(tid)
    pid2, new = conn.init_ok(tid)
    assert (pid2, new) == (pid, old + 1)
    for version, code in ((0, INVALID_PRODUCER_EPOCH), (1, INVALID_PRODUCER_EPOCH),
                          (2, PRODUCER_FENCED), (3, PRODUCER_FENCED), (4, PRODUCER_FENCED),
                          (5, PRODUCER_FENCED)):
        got = conn.add_partitions(tid, pid, old, {topic_name: [0]}, version)
        assert got == {(topic_name, 0): code}, (version, got)
    # the stale epoch's transactional batch is refused too, and nothing is written
    assert conn.produce(topic_name, batch(pid, old, 0, 2, transactional=True),
                        transactional_id=tid)[0] in (INVALID_PRODUCER_EPOCH, PRODUCER_FENCED)
    assert conn.list_offset(topic_name) == 0
    answer = conn.describe_transactions([tid]).transaction_states[0]
    assert answer.transaction_state == "Empty", answer


def test_sequence_gap_and_duplicate_batch(conn: TxnConnection, topic_name: str) -> None:
    assert conn.create_topic(topic_name) == NONE
    pid, epoch = conn.init_ok(None)
    assert epoch == 0
    assert conn.produce(topic_name, batch(pid, epoch, 0, 3)) == (NONE, 0)
    assert conn.produce(topic_name, batch(pid, epoch, 3, 2)) == (NONE, 3)
    # a gap: sequence 7 when 5 is next
    assert conn.produce(topic_name, batch(pid, epoch, 7, 1))[0] == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert conn.list_offset(topic_name) == 5
    # duplicates: the last batch and an earlier one answer their original offsets
    assert conn.produce(topic_name, batch(pid, epoch, 3, 2)) == (NONE, 3)
    assert conn.produce(topic_name, batch(pid, epoch, 0, 3)) == (NONE, 0)
    assert conn.list_offset(topic_name) == 5
    values = [r.value for r in _records(conn, topic_name)]
    assert values == [f"v-{i}".encode() for i in range(5)]
    # the sequence continues where it was
    assert conn.produce(topic_name, batch(pid, epoch, 5, 1)) == (NONE, 5)
    assert conn.list_offset(topic_name) == 6
    # a producer id the partition does not know starts at whatever sequence it sends (its
    # state may have expired: KIP-360), and is held to it from then on
    other, _ = conn.init_ok(None)
    assert other != pid
    assert conn.produce(topic_name, batch(other, 0, 4, 1)) == (NONE, 6)
    assert conn.produce(topic_name, batch(other, 0, 6, 1))[0] == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert conn.produce(topic_name, batch(other, 0, 5, 1)) == (NONE, 7)


def test_a_sequence_wrapping_inside_a_batch_continues_at_its_wrapped_end(
        conn: TxnConnection, topic_name: str) -> None:
    """Sequences wrap past 2**31 - 1 to 0, also inside a batch (Kafka's lastSequence): a
    long-lived producer goes on, and a retry of the wrapping batch is a duplicate."""
    assert conn.create_topic(topic_name) == NONE
    pid, epoch = conn.init_ok(None)
    top = 2**31 - 1
    assert conn.produce(topic_name, batch(pid, epoch, top - 2, 5)) == (NONE, 0)  # ends at 1
    assert conn.produce(topic_name, batch(pid, epoch, 2, 1)) == (NONE, 5)
    assert conn.produce(topic_name, batch(pid, epoch, top - 2, 5)) == (NONE, 0)
    assert conn.produce(topic_name, batch(pid, epoch, 4, 1))[0] == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert conn.list_offset(topic_name) == 6


def _records(conn: TxnConnection, topic: str) -> list[Any]:
    from kafka.record.memory_records import MemoryRecords
    raw = conn.fetch(topic).records or b""
    records = MemoryRecords(raw)
    out = []
    while records.has_next():
        b = records.next_batch()
        if b is None:
            break
        out.extend(b)
    return out


def test_transactional_batch_to_a_partition_not_added(conn: TxnConnection,
                                                       topic_name: str) -> None:
    assert conn.create_topic(topic_name, 2) == NONE
    tid = f"tid-{topic_name}"
    pid, epoch = conn.init_ok(tid)
    # no transaction at all yet
    code, _ = conn.produce(topic_name, batch(pid, epoch, 0, 2, transactional=True), 0, tid)
    assert code == INVALID_TXN_STATE
    assert conn.add_partitions(tid, pid, epoch, {topic_name: [0]}) == {(topic_name, 0): NONE}
    # partition 1 was not added
    code, _ = conn.produce(topic_name, batch(pid, epoch, 0, 2, transactional=True), 1, tid)
    assert code == INVALID_TXN_STATE
    assert conn.list_offset(topic_name, 1) == 0
    # partition 0 was
    assert conn.produce(topic_name, batch(pid, epoch, 0, 2, transactional=True), 0, tid) == \
        (NONE, 0)
    assert conn.list_offset(topic_name, 0, READ_COMMITTED) == 0
    assert conn.end_txn(tid, pid, epoch, True) == NONE
    assert conn.list_offset(topic_name, 0) == 3
    assert conn.list_offset(topic_name, 0, READ_COMMITTED) == 3
    assert conn.list_offset(topic_name, 1) == 0
    assert conn.committed_values(topic_name, 0) == [b"v-0", b"v-1"]


def test_a_transactional_batch_is_written_only_under_its_own_transactional_id(
        conn: TxnConnection, topic_name: str) -> None:
    # as Kafka: transactional records without a transactional id are refused
    # (TRANSACTIONAL_ID_AUTHORIZATION_FAILED), and a producer id is verified against the id
    # the request names, so nobody writes into another producer's open transaction
    assert conn.create_topic(topic_name) == NONE
    tid, other = f"tid-{topic_name}", f"other-{topic_name}"
    pid, epoch = conn.init_ok(tid)
    conn.init_ok(other)
    assert conn.add_partitions(tid, pid, epoch, {topic_name: [0]}) == {(topic_name, 0): NONE}
    code, _ = conn.produce(topic_name, batch(pid, epoch, 0, 2, transactional=True), 0, None)
    assert code == TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    code, _ = conn.produce(topic_name, batch(pid, epoch, 0, 2, transactional=True), 0, other)
    assert code == INVALID_PRODUCER_ID_MAPPING
    assert conn.list_offset(topic_name, 0) == 0
    assert conn.produce(topic_name, batch(pid, epoch, 0, 1, transactional=True), 0, tid) == \
        (NONE, 0)
    assert conn.end_txn(tid, pid, epoch, True) == NONE
    assert conn.committed_values(topic_name, 0) == [b"v-0"]


def test_txn_offset_commit_before_add_offsets(conn: TxnConnection, topic_name: str) -> None:
    assert conn.create_topic(topic_name) == NONE
    tid, group = f"tid-{topic_name}", f"grp-{topic_name}"
    pid, epoch = conn.init_ok(tid)
    for version in (0, 1, 2, 3):
        got = conn.txn_offset_commit(tid, group, pid, epoch, topic_name, {0: 5}, version)
        assert got == {0: INVALID_TXN_STATE}, (version, got)
    assert conn.offset_fetch(group, topic_name, [0]) == {0: -1}
    # with AddOffsetsToTxn it works, and counts only once the transaction commits
    assert conn.add_offsets(tid, pid, epoch, group) == NONE
    assert conn.txn_offset_commit(tid, group, pid, epoch, topic_name, {0: 5}) == {0: NONE}
    assert conn.offset_fetch(group, topic_name, [0], version=5) == {0: -1}
    assert conn.end_txn(tid, pid, epoch, False) == NONE
    assert conn.offset_fetch(group, topic_name, [0]) == {0: -1}
    assert conn.add_offsets(tid, pid, epoch, group) == NONE
    assert conn.txn_offset_commit(tid, group, pid, epoch, topic_name, {0: 7}) == {0: NONE}
    assert conn.end_txn(tid, pid, epoch, True) == NONE
    assert conn.offset_fetch(group, topic_name, [0]) == {0: 7}
    # after the end, TxnOffsetCommit is refused again
    assert conn.txn_offset_commit(tid, group, pid, epoch, topic_name, {0: 9}) == \
        {0: INVALID_TXN_STATE}
    assert conn.offset_fetch(group, topic_name, [0]) == {0: 7}


def test_unknown_producer_id(conn: TxnConnection, topic_name: str) -> None:
    assert conn.create_topic(topic_name) == NONE
    tid = f"tid-{topic_name}"
    pid, epoch = conn.init_ok(tid)
    bogus = pid + 123_456
    for version in (0, 1, 2, 3):
        assert conn.end_txn(tid, bogus, epoch, True, version) == INVALID_PRODUCER_ID_MAPPING
    for version in (0, 3, 4):
        assert conn.add_partitions(tid, bogus, epoch, {topic_name: [0]}, version) == \
            {(topic_name, 0): INVALID_PRODUCER_ID_MAPPING}, version
    # an id never initialised at all
    assert conn.end_txn(f"never-{tid}", pid, epoch, True) == INVALID_PRODUCER_ID_MAPPING
    assert conn.add_partitions(f"never-{tid}", pid, epoch, {topic_name: [0]}) == \
        {(topic_name, 0): INVALID_PRODUCER_ID_MAPPING}
    # a transactional batch of a producer id the coordinator never handed out
    code, _ = conn.produce(topic_name, batch(bogus, 0, 0, 1, transactional=True), 0, tid)
    assert code in (INVALID_PRODUCER_ID_MAPPING, INVALID_TXN_STATE)
    assert conn.list_offset(topic_name) == 0
    assert conn.describe_transactions([tid]).transaction_states[0].transaction_state == "Empty"


# -- tenants -------------------------------------------------------------------------------

class TenantConnection(TxnConnection):
    def login(self, username: str, token: str) -> None:
        hand = self.call(SaslHandshakeRequest[1](mechanism="PLAIN"), 1, SaslHandshakeResponse)
        assert hand.error_code == NONE, hand
        answer = self.call(SaslAuthenticateRequest[2](
            auth_bytes=plain_message(username, "token:" + token)), 2, SaslAuthenticateResponse)
        assert answer.error_code == NONE, answer


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess,
                                                                              bytes]]:
    secret = secrets.token_bytes(32)
    process = BrokerProcess(Path(tmp_path_factory.mktemp("txn-tenants")), {
        **FAST_TXN, "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0",
        "tokenSecretKey": "data:;base64," + base64.b64encode(secret).decode()}).start()
    yield process, secret
    process.stop()


def _tenant(sasl_broker: tuple[BrokerProcess, bytes], username: str,
            role: str) -> TenantConnection:
    process, secret = sasl_broker
    token = jwt.encode({"sub": role, "exp": int(time.time()) + 3600}, secret, algorithm="HS256")
    conn = TenantConnection(process.port)
    conn.login(username, token)
    return conn


def test_tenant_b_cannot_touch_tenant_a_offsets_or_topics(
        sasl_broker: tuple[BrokerProcess, bytes]) -> None:
    a = _tenant(sasl_broker, "tenanta", "alice")
    b = _tenant(sasl_broker, "tenantb", "bob")
    try:
        assert a.create_topic("t", 2) == NONE
        assert b.create_topic("t", 2) == NONE
        for p in range(2):
            assert a.produce("t", batch(*a.init_ok(None), 0, 10), p)[0] == NONE
            assert b.produce("t", batch(*b.init_ok(None), 0, 10), p)[0] == NONE
        # A commits offsets of its group g transactionally
        pid_a, epoch_a = a.init_ok("tx")
        assert a.add_offsets("tx", pid_a, epoch_a, "g") == NONE
        assert a.txn_offset_commit("tx", "g", pid_a, epoch_a, "t", {0: 4, 1: 6}) == \
            {0: NONE, 1: NONE}
        assert a.end_txn("tx", pid_a, epoch_a, True) == NONE
        assert a.offset_fetch("g", "t", [0, 1]) == {0: 4, 1: 6}
        a_ends = {p: a.list_offset("t", p) for p in range(2)}

        # B, with the same transactional id, group id and topic name: its own namespace
        pid_b, epoch_b = b.init_ok("tx")
        assert b.add_offsets("tx", pid_b, epoch_b, "g") == NONE
        b_got = b.txn_offset_commit("tx", "g", pid_b, epoch_b, "t", {0: 9, 1: 9})
        assert b_got == {0: NONE, 1: NONE}
        # B names A's topic by its full name: refused
        full = b.txn_offset_commit("tx", "g", pid_b, epoch_b, "tenanta/default/t", {0: 1})
        assert full == {0: TOPIC_AUTHORIZATION_FAILED}, full
        assert b.end_txn("tx", pid_b, epoch_b, True) == NONE
        assert b.offset_fetch("g", "t", [0, 1]) == {0: 9, 1: 9}
        assert a.offset_fetch("g", "t", [0, 1]) == {0: 4, 1: 6}

        # B cannot add A's topic to its transaction, and cannot write into it
        for version in (3, 4):
            got = b.add_partitions("tx", pid_b, epoch_b, {"tenanta/default/t": [0]}, version)
            assert got == {("tenanta/default/t", 0): TOPIC_AUTHORIZATION_FAILED}, (version, got)
        mixed = b.add_partitions("tx", pid_b, epoch_b, {"tenanta/default/t": [1], "t": [1]})
        assert mixed[("tenanta/default/t", 1)] == TOPIC_AUTHORIZATION_FAILED, mixed
        assert mixed[("t", 1)] != NONE, mixed  # not attempted: the request failed as a whole
        code, _ = b.produce("tenanta/default/t", batch(pid_b, epoch_b, 0, 1, transactional=True),
                            0, "tx")
        assert code == TOPIC_AUTHORIZATION_FAILED
        # B's transaction over A's group offsets: B's "g" is B's own group
        assert b.add_offsets("tx", pid_b, epoch_b, "g") == NONE
        assert b.txn_offset_commit("tx", "g", pid_b, epoch_b, "t", {0: 1}) == {0: NONE}
        assert b.end_txn("tx", pid_b, epoch_b, True) == NONE
        assert a.offset_fetch("g", "t", [0, 1]) == {0: 4, 1: 6}
        assert b.offset_fetch("g", "t", [0, 1]) == {0: 1, 1: 9}
        assert {p: a.list_offset("t", p) for p in range(2)} == a_ends
        # A's transaction state is untouched by B's use of the same transactional id
        state = a.describe_transactions(["tx"]).transaction_states[0]
        assert (state.producer_id, state.producer_epoch) == (pid_a, epoch_a), state
        assert state.transaction_state == "CompleteCommit", state
        listed = b.list_transactions().transaction_states
        assert [(t.transactional_id, t.producer_id) for t in listed] == [("tx", pid_b)], listed
    finally:
        a.close()
        b.close()


def test_end_txn_retries_and_contradictions(conn: TxnConnection, topic_name: str) -> None:
    assert conn.create_topic(topic_name) == NONE
    tid = f"tid-{topic_name}"
    pid, epoch = conn.init_ok(tid)
    assert conn.add_partitions(tid, pid, epoch, {topic_name: [0]}) == {(topic_name, 0): NONE}
    assert conn.produce(topic_name, batch(pid, epoch, 0, 2, True), 0, tid) == (NONE, 0)
    assert conn.end_txn(tid, pid, epoch, True) == NONE
    assert conn.list_offset(topic_name) == 3
    # a retried commit is answered without a second marker; an abort now is refused
    assert conn.end_txn(tid, pid, epoch, True) == NONE
    assert conn.end_txn(tid, pid, epoch, False) == INVALID_TXN_STATE
    assert conn.list_offset(topic_name) == 3
    assert conn.committed_values(topic_name) == [b"v-0", b"v-1"]
    # a newer epoch than the coordinator knows is fenced as an older one, as Kafka
    assert conn.end_txn(tid, pid, epoch + 5, True) == PRODUCER_FENCED
    # a transactional batch after the commit, without AddPartitionsToTxn, is refused
    code, _ = conn.produce(topic_name, batch(pid, epoch, 2, 1, True), 0, tid)
    assert code == INVALID_TXN_STATE
    assert conn.list_offset(topic_name) == 3


def test_init_producer_id_with_current_epoch_bumps_it(conn: TxnConnection,
                                                      topic_name: str) -> None:
    tid = f"tid-{topic_name}"
    pid, epoch = conn.init_ok(tid)
    answer = conn.init_pid(tid, 60_000, version=4, producer_id=pid, epoch=epoch)
    assert (answer.error_code, answer.producer_id, answer.producer_epoch) == \
        (NONE, pid, epoch + 1), answer
    # an unknown producer id for a known transactional id is fenced, not handed over
    answer = conn.init_pid(tid, 60_000, version=4, producer_id=pid + 999, epoch=0)
    assert answer.error_code in (PRODUCER_FENCED, INVALID_PRODUCER_EPOCH), answer
    state = conn.describe_transactions([tid]).transaction_states[0]
    assert (state.producer_id, state.producer_epoch) == (pid, epoch + 1)


def test_describe_producers_of_unknown_partition(conn: TxnConnection, topic_name: str) -> None:
    assert conn.create_topic(topic_name) == NONE
    answer = conn.describe_producers(topic_name, [0, 5])
    codes = {p.partition_index: p.error_code for p in answer.topics[0].partitions}
    assert codes == {0: NONE, 5: UNKNOWN_TOPIC_OR_PARTITION}, answer
    missing = conn.describe_producers(f"missing-{topic_name}", [0]).topics[0].partitions[0]
    assert missing.error_code == UNKNOWN_TOPIC_OR_PARTITION, missing


def test_list_transactions_filters(conn: TxnConnection, topic_name: str) -> None:
    assert conn.create_topic(topic_name) == NONE
    tid = f"tid-{topic_name}"
    pid, epoch = conn.init_ok(tid)
    assert conn.add_partitions(tid, pid, epoch, {topic_name: [0]}) == {(topic_name, 0): NONE}
    time.sleep(0.3)
    older = conn.list_transactions(["Ongoing"], version=1, duration=200).transaction_states
    assert tid in [t.transactional_id for t in older]
    younger = conn.list_transactions(["Ongoing"], version=1, duration=60_000)
    assert tid not in [t.transactional_id for t in younger.transaction_states]
    assert conn.end_txn(tid, pid, epoch, False) == NONE
    listed = conn.list_transactions(["CompleteAbort"], [pid]).transaction_states
    assert [(t.transactional_id, t.producer_id) for t in listed] == [(tid, pid)]


def test_list_transactions_patterns_run_in_linear_time(conn: TxnConnection,
                                                      topic_name: str) -> None:
    """The transactional id pattern (KIP-1152) is matched by RE2, as Kafka matches it with
    RE2/J: a pattern that backtracks for hours in Python's ``re`` answers at once, a
    pattern RE2 refuses answers INVALID_REGULAR_EXPRESSION, and the connection stays."""
    tid = f"tid-{topic_name}-" + "a" * 40
    conn.init_ok(tid)
    listed = conn.list_transactions(version=2, pattern="(.+)+Z").transaction_states
    assert tid not in [t.transactional_id for t in listed]
    listed = conn.list_transactions(version=2, pattern=f"tid-{topic_name}-a+").transaction_states
    assert [t.transactional_id for t in listed] == [tid]
    for bad in ("(", "x" * 2000):
        answer = conn.list_transactions(version=2, pattern=bad)
        assert (answer.error_code, answer.transaction_states) == \
            (INVALID_REGULAR_EXPRESSION, []), bad
    assert conn.list_transactions(version=2, pattern="").error_code == NONE


def test_the_last_stable_offset_never_lies_below_the_log_start(conn: TxnConnection,
                                                                topic_name: str) -> None:
    """DeleteRecords past an open transaction's first offset: the last stable offset (in
    ListOffsets and Fetch) is the log start, as Kafka reports it, so a read_committed
    reader positioned there fetches without OFFSET_OUT_OF_RANGE."""
    assert conn.create_topic(topic_name) == NONE
    tid = f"tid-{topic_name}"
    pid, epoch = conn.init_ok(tid)
    assert conn.add_partitions(tid, pid, epoch, {topic_name: [0]}) == {(topic_name, 0): NONE}
    assert conn.produce(topic_name, batch(pid, epoch, 0, 2, True), 0, tid) == (NONE, 0)
    for _ in range(3):
        conn.produce(topic_name, batch(-1, -1, -1, 1))
    assert conn.list_offset(topic_name, isolation=READ_COMMITTED) == 0
    assert conn.delete_records(topic_name, 4) == (NONE, 4)
    assert conn.list_offset(topic_name, isolation=READ_COMMITTED) == 4
    answer = conn.fetch(topic_name, 0, 4, READ_COMMITTED)
    assert (answer.error_code, answer.last_stable_offset, answer.log_start_offset) == \
        (NONE, 4, 4)
    assert conn.end_txn(tid, pid, epoch, False) == NONE
    assert conn.list_offset(topic_name, isolation=READ_COMMITTED) == 6


T0 = 1_700_000_000_000


def test_read_committed_list_offsets_by_time_stops_at_the_last_stable_offset(
        conn: TxnConnection, topic_name: str) -> None:
    """As Kafka: a timestamp (or max-timestamp) lookup for a read_committed reader finds
    only offsets below the last stable offset; past it the answer is offset -1."""
    assert conn.create_topic(topic_name) == NONE
    plain = build_batch([(b"k", b"old"), (b"k", b"old")], timestamp=T0)
    assert conn.produce(topic_name, bytes(plain)) == (NONE, 0)
    tid = f"tid-{topic_name}"
    pid, epoch = conn.init_ok(tid)
    assert conn.add_partitions(tid, pid, epoch, {topic_name: [0]}) == {(topic_name, 0): NONE}
    open_txn = build_batch([(b"k", b"new"), (b"k", b"new")], timestamp=T0 + 5_000,
                           producer_id=pid, producer_epoch=epoch, base_sequence=0,
                           transactional=True)
    assert conn.produce(topic_name, bytes(open_txn), 0, tid) == (NONE, 2)
    assert conn.list_offset(topic_name, isolation=READ_COMMITTED) == 2
    for isolation, expected in ((READ_UNCOMMITTED, (0, 2, 3)), (READ_COMMITTED, (0, -1, -1))):
        assert tuple(conn.list_offset(topic_name, isolation=isolation, timestamp=target)
                     for target in (T0, T0 + 2_000, -3)) == expected, isolation
    assert conn.end_txn(tid, pid, epoch, True) == NONE
    wait_until(lambda: conn.list_offset(topic_name, isolation=READ_COMMITTED) == 5, 10,
               "the commit marker")
    assert conn.list_offset(topic_name, isolation=READ_COMMITTED, timestamp=T0 + 2_000) == 2


def test_tenant_b_cannot_write_markers_into_tenant_a(
        sasl_broker: tuple[BrokerProcess, bytes]) -> None:
    """WriteTxnMarkers (an administrator's abort of a hanging transaction) with
    authorization disabled: every login passes the cluster check, the tenant boundary still
    keeps each to its own tenant's partitions."""
    a = _tenant(sasl_broker, "tenanta", "alice")
    b = _tenant(sasl_broker, "tenantb", "bob")
    try:
        assert a.create_topic("hang", 1) == NONE
        pid, epoch = a.init_ok("hang-tx")
        assert a.add_partitions("hang-tx", pid, epoch, {"hang": [0]}) == {("hang", 0): NONE}
        assert a.produce("hang", batch(pid, epoch, 0, 2, transactional=True), 0,
                         "hang-tx")[0] == NONE
        assert b.write_markers(pid, epoch, False, {"tenanta/default/hang": [0]}) == {
            ("tenanta/default/hang", 0): TOPIC_AUTHORIZATION_FAILED}
        assert b.write_markers(pid, epoch, False, {"hang": [0]}) == {
            ("hang", 0): UNKNOWN_TOPIC_OR_PARTITION}  # its own namespace has no such topic
        assert a.list_offset("hang", 0, READ_UNCOMMITTED) == 2
        assert a.list_offset("hang", 0, READ_COMMITTED) == 0
        assert a.write_markers(pid, epoch, False, {"hang": [0]}) == {("hang", 0): NONE}
        assert a.list_offset("hang", 0, READ_COMMITTED) == 3
    finally:
        a.close()
        b.close()
