"""Transactions acceptance 4: ``kill -9`` of the broker in the middle of a commit leaves each
transaction fully visible or fully invisible after restart, and idempotence state (producer
ids, epochs, sequences) survives both a clean restart and ``kill -9``."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.broker_process import REPO, BrokerProcess
from tests.clients import create_topic
from tests.txn_helpers import (
    COORDINATOR_LOAD_IN_PROGRESS,
    NONE,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    TxnConnection,
    batch,
    read_all,
    start_broker,
    wait_until,
)

PARTITIONS = 8
PER_PARTITION = 1500
DELAYS = [0.0, 0.001, 0.002, 0.003, 0.005, 0.008, 0.015, 0.03]


def _settle(broker: BrokerProcess, tid: str) -> None:
    """Re-initialise the transactional id: the coordinator finishes or aborts what is left."""
    conn = TxnConnection(broker.port)
    try:
        conn.init_ok(tid)
    finally:
        conn.close()


def _recovery(broker: BrokerProcess, tid: str, tag: str) -> str | None:
    """What the restarted coordinator found of ``tid``'s transaction: the state of one it
    completed (PrepareCommit, PrepareAbort), Ongoing for one it aborted, None when it was
    over before the kill. A new transactional id's line marks the log read this far."""
    conn = TxnConnection(broker.port)
    try:
        conn.init_ok(f"{tid}-{tag}-mark")
    finally:
        conn.close()
    broker.wait_for_log(rf"transactional id {tid}-{tag}-mark has producer id", 30)
    for line in broker.lines:
        if f"completing transaction {tid} (" in line:
            return line.split(f"completing transaction {tid} (")[1].split(")")[0]
        if f"aborting the open transaction of {tid} " in line:
            return "Ongoing"
    return None


def test_kill_during_commit_is_all_or_nothing(tmp_path: Path) -> None:
    broker = start_broker(tmp_path / "data")
    topic = "crash-topic"
    tid = "crash-tid"
    outcomes: dict[str, int] = {}
    recovered: list[str | None] = []
    try:
        create_topic(broker.bootstrap, topic, PARTITIONS)
        for n, delay in enumerate(DELAYS):
            tag = f"round{n}"
            worker = subprocess.Popen(
                [sys.executable, "-m", "tests.txn_helpers", "crash-producer", broker.bootstrap,
                 topic, tid, tag, str(PARTITIONS), str(PER_PARTITION)],
                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            try:
                assert worker.stdout is not None
                line = worker.stdout.readline()
                assert line.strip() == "committing", line
                time.sleep(delay)
                broker.kill()
            finally:
                worker.kill()
                worker.wait(10)
            broker.start()
            _settle(broker, tid)
            found = _recovery(broker, tid, tag)
            recovered.append(found)
            got = read_all(broker.bootstrap, topic, PARTITIONS, "read_committed", timeout=30)
            per_round = Counter(v.decode().split(":")[0] for _, _, v in got)
            for m in range(n + 1):
                seen = per_round.get(f"round{m}", 0)
                assert seen in (0, PARTITIONS * PER_PARTITION), \
                    f"round {m} half visible after the crash of round {n}: {seen} records\n" \
                    f"{broker.log_text()[-4000:]}"
                if m < n:
                    assert seen == outcomes[f"round{m}"], "an earlier outcome changed"
            outcomes[tag] = per_round.get(tag, 0)
            # what the restarted coordinator found decides the outcome: a commit it
            # completed, or one done before the kill, is visible; an open one is aborted
            assert outcomes[tag] == (0 if found in ("PrepareAbort", "Ongoing")
                                     else PARTITIONS * PER_PARTITION), (found, outcomes)
            # every partition holds the same outcome and nothing is left open
            by_partition = Counter((p, v.decode().split(":")[0]) for p, _, v in got)
            for p in range(PARTITIONS):
                assert by_partition.get((p, tag), 0) == outcomes[tag] // PARTITIONS
            conn = TxnConnection(broker.port)
            try:
                for p in range(PARTITIONS):
                    assert conn.list_offset(topic, p, READ_COMMITTED) == \
                        conn.list_offset(topic, p, READ_UNCOMMITTED)
            finally:
                conn.close()
    finally:
        broker.kill()
    # report what happened (both outcomes are fine, a half one is not)
    print("outcomes per round:", outcomes, "found at restart:", recovered)


def _idempotent_restart(tmp_path: Path, hard: bool) -> None:
    broker = start_broker(tmp_path / "data")
    try:
        topic = "idem"
        conn = TxnConnection(broker.port)
        assert conn.create_topic(topic, 1) == NONE
        pid, epoch = conn.init_ok(None)
        offsets = []
        for i in range(5):
            code, base = conn.produce(topic, batch(pid, epoch, 2 * i, 2))
            assert code == NONE
            offsets.append(base)
        assert offsets == [0, 2, 4, 6, 8]
        conn.close()
        if hard:
            broker.kill()
        else:
            assert broker.stop() == 0
        broker.start()
        conn = TxnConnection(broker.port)
        # a retry of the last batch: acknowledged at its original offset, not written again
        assert conn.produce(topic, batch(pid, epoch, 8, 2)) == (NONE, 8)
        assert conn.produce(topic, batch(pid, epoch, 6, 2)) == (NONE, 6)
        assert conn.list_offset(topic) == 10
        # a gap is refused
        assert conn.produce(topic, batch(pid, epoch, 12, 1))[0] == OUT_OF_ORDER_SEQUENCE_NUMBER
        assert conn.list_offset(topic) == 10
        # the next sequence continues
        assert conn.produce(topic, batch(pid, epoch, 10, 2)) == (NONE, 10)
        assert conn.list_offset(topic) == 12
        values = [v for _, v, _ in _decoded(conn, topic)]
        assert values == [f"v-{i}".encode() for i in range(12)]
        # a newer producer id from the restarted broker is a different one
        other, _ = conn.init_ok(None)
        assert other != pid
        conn.close()
        # once more across a second restart of the other kind
        if hard:
            assert broker.stop() == 0
        else:
            broker.kill()
        broker.start()
        conn = TxnConnection(broker.port)
        assert conn.produce(topic, batch(pid, epoch, 10, 2)) == (NONE, 10)
        assert conn.produce(topic, batch(pid, epoch, 13, 1))[0] == OUT_OF_ORDER_SEQUENCE_NUMBER
        assert conn.produce(topic, batch(pid, epoch, 12, 1)) == (NONE, 12)
        assert conn.list_offset(topic) == 13
        conn.close()
    finally:
        broker.kill()


def _decoded(conn: TxnConnection, topic: str) -> list[tuple[int, bytes | None, bool]]:
    from tests.txn_helpers import decode_records
    return decode_records(conn.fetch(topic).records or b"")


@pytest.mark.parametrize("hard", [False, True], ids=["sigterm", "kill-9"])
def test_idempotence_state_survives_restart(tmp_path: Path, hard: bool) -> None:
    _idempotent_restart(tmp_path, hard)


def test_open_transaction_survives_restart_and_is_aborted_on_reinit(tmp_path: Path) -> None:
    """An open transaction still holds back the LSO after ``kill -9``; re-initialising the
    transactional id aborts it and its records never become visible."""
    broker = start_broker(tmp_path / "data")
    try:
        conn = TxnConnection(broker.port)
        assert conn.create_topic("t", 2) == NONE
        pid, epoch = conn.init_ok("tid")
        assert conn.add_partitions("tid", pid, epoch, {"t": [0, 1]}) == \
            {("t", 0): NONE, ("t", 1): NONE}
        assert conn.produce("t", batch(pid, epoch, 0, 3, True), 0, "tid") == (NONE, 0)
        assert conn.produce("t", batch(pid, epoch, 0, 3, True), 1, "tid") == (NONE, 0)
        conn.close()
        broker.kill()
        broker.start()
        conn = TxnConnection(broker.port)
        assert conn.list_offset("t", 0, READ_COMMITTED) == 0
        assert conn.list_offset("t", 1, READ_COMMITTED) == 0
        new_pid, new_epoch = conn.init_ok("tid")
        assert new_pid == pid and new_epoch > epoch
        for p in range(2):
            assert conn.list_offset("t", p) == 4
            assert conn.list_offset("t", p, READ_COMMITTED) == 4
            assert conn.committed_values("t", p) == []
        conn.close()
    finally:
        broker.kill()


UNSTABLE_OFFSET_COMMIT = 88


def _stable_fetch(conn: TxnConnection, group: str, topic: str) -> tuple[int, int]:
    """(error code, offset) of partition 0 from OffsetFetch v7 with require_stable, asked
    by name; the same must come for all of the group's partitions (topics null)."""
    from kafka.protocol.consumer import OffsetFetchRequest, OffsetFetchResponse
    request = OffsetFetchRequest[7](group_id=group, require_stable=True, topics=[
        OffsetFetchRequest.OffsetFetchRequestTopic(name=topic, partition_indexes=[0])])
    answer = conn.call(request, 7, OffsetFetchResponse)
    part = answer.topics[0].partitions[0]
    every = conn.call(OffsetFetchRequest[7](group_id=group, require_stable=True, topics=None),
                      7, OffsetFetchResponse)
    [(name, [whole])] = [(t.name, t.partitions) for t in every.topics]
    assert (name, whole.error_code, whole.committed_offset) == \
        (topic, part.error_code, part.committed_offset)
    return int(part.error_code), int(part.committed_offset)


@pytest.mark.parametrize("hard", [False, True], ids=["sigterm", "kill-9"])
def test_transaction_outcomes_and_pending_offsets_survive_restart(tmp_path: Path,
                                                                  hard: bool) -> None:
    broker = start_broker(tmp_path / "data")
    tid, group, topic = "tid", "g", "t"
    try:
        conn = TxnConnection(broker.port)
        assert conn.create_topic(topic, 1) == NONE
        pid, epoch = conn.init_ok(tid)
        seq = 0
        for n, (count, offset, end) in enumerate(((3, 3, True), (2, 99, False),
                                                  (2, 50, None))):
            assert conn.add_partitions(tid, pid, epoch, {topic: [0]}) == {(topic, 0): NONE}
            assert conn.produce(topic, batch(pid, epoch, seq, count, True, prefix=f"t{n}"),
                                0, tid)[0] == NONE
            seq += count
            assert conn.add_offsets(tid, pid, epoch, group) == NONE
            assert conn.txn_offset_commit(tid, group, pid, epoch, topic, {0: offset}) == \
                {0: NONE}
            if end is not None:
                assert conn.end_txn(tid, pid, epoch, end) == NONE
        # offsets 0-2 t0, 3 commit marker, 4-5 t1, 6 abort marker, 7-8 t2 (open)
        assert conn.list_offset(topic) == 9
        assert conn.list_offset(topic, 0, READ_COMMITTED) == 7
        assert conn.offset_fetch(group, topic, [0]) == {0: 3}
        assert _stable_fetch(conn, group, topic)[0] == UNSTABLE_OFFSET_COMMIT
        conn.close()
        if hard:
            broker.kill()
        else:
            assert broker.stop() == 0
        broker.start()
        conn = TxnConnection(broker.port)
        wait_until(lambda: conn.describe_transactions([tid]).transaction_states[0].error_code
                   != COORDINATOR_LOAD_IN_PROGRESS, 20, "the coordinator to load")
        assert conn.list_offset(topic) == 9
        assert conn.list_offset(topic, 0, READ_COMMITTED) == 7
        assert conn.committed_values(topic) == [b"t0-0", b"t0-1", b"t0-2"]
        assert conn.offset_fetch(group, topic, [0]) == {0: 3}
        assert _stable_fetch(conn, group, topic)[0] == UNSTABLE_OFFSET_COMMIT
        state = conn.describe_transactions([tid]).transaction_states[0]
        assert (state.transaction_state, state.producer_id, state.producer_epoch) == \
            ("Ongoing", pid, epoch), state
        # the same producer may still commit its open transaction after the restart
        if not hard:
            assert conn.end_txn(tid, pid, epoch, True) == NONE
            expected_offset, values = 50, [b"t0-0", b"t0-1", b"t0-2", b"t2-5", b"t2-6"]
        else:  # or a new session aborts it
            assert conn.init_ok(tid)[1] > epoch
            expected_offset, values = 3, [b"t0-0", b"t0-1", b"t0-2"]
        assert conn.list_offset(topic) == 10
        assert conn.list_offset(topic, 0, READ_COMMITTED) == 10
        assert conn.committed_values(topic) == values
        assert conn.offset_fetch(group, topic, [0]) == {0: expected_offset}
        assert _stable_fetch(conn, group, topic) == (NONE, expected_offset)
        conn.close()
        # and once more across a restart
        broker.kill()
        broker.start()
        conn = TxnConnection(broker.port)
        assert conn.committed_values(topic) == values
        assert conn.offset_fetch(group, topic, [0]) == {0: expected_offset}
        assert conn.list_offset(topic, 0, READ_COMMITTED) == 10
        conn.close()
    finally:
        broker.kill()
