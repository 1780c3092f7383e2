"""Producer-state snapshots: taken as partitions move on, only after the fsync that covers
them, never into a topic deleted meanwhile; a rebuild replays only what follows the
snapshot, and gives the same state as a replay of the whole partition.

Real partition logs on a real file system; the broker-process test at the end kills the
broker with SIGKILL.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_core import producer_states
from broker_core.codec.batch_header import read_header
from broker_core.producer_states import SNAPSHOT_FILE, ProducerStates
from broker_core.storage import LogConfig, PartitionLog
from broker_core.storage.model import BatchInfo
from tests.txn_helpers import NONE, TxnConnection, batch, start_broker, wait_until

PID, EPOCH = 7, 0


def _produce(log: PartitionLog, states: ProducerStates, first_seq: int, batches: int,
             per_batch: int = 2) -> None:
    """Append idempotent batches the way the engine does: check, append, record."""
    state = states.get("t", 0, log)
    for n in range(batches):
        data = bytearray(batch(PID, EPOCH, first_seq + n * per_batch, per_batch))
        header = read_header(data)
        assert state.check(header) is None
        base = log.append(data, header)
        state.record(header, base, header.max_timestamp)


async def _flush(log: PartitionLog) -> None:
    log.flush()


def _restarted(log: PartitionLog) -> PartitionLog:
    """The partition as the next start opens it."""
    log.close()
    return PartitionLog(log.directory, LogConfig())


def _snapshot(log: PartitionLog) -> dict[str, object]:
    document: dict[str, object] = json.loads((log.directory / SNAPSHOT_FILE).read_text())
    return document


def test_a_rebuild_replays_only_what_follows_the_snapshot(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = PartitionLog(tmp_path / "p", LogConfig())
    states = ProducerStates()
    _produce(log, states, 0, 10)
    assert asyncio.run(states.checkpoint(_flush)) == 1
    assert _snapshot(log)["offset"] == 20
    _produce(log, states, 20, 3)  # written after the snapshot, then the process dies
    expected = states.get("t", 0, log).to_json(log.next_offset)
    log = _restarted(log)

    caplog.set_level(logging.INFO, logger=producer_states.__name__)
    rebuilt = ProducerStates().get("t", 0, log)
    assert rebuilt.to_json(log.next_offset) == expected
    assert "the snapshot at offset 20, 3 batch(es) replayed" in caplog.text
    # the snapshot stays: it is still a valid starting point for the next rebuild
    assert _snapshot(log)["offset"] == 20
    # and the whole-log replay agrees
    (log.directory / SNAPSHOT_FILE).unlink()
    caplog.clear()
    assert ProducerStates().get("t", 0, log).to_json(log.next_offset) == expected
    assert "the log start, 13 batch(es) replayed" in caplog.text
    log.close()


def test_a_snapshot_below_the_log_start_is_taken_again(tmp_path: Path) -> None:
    """Retention that empties an idle partition moves its log start past the last
    snapshot, which a rebuild would then ignore: the next checkpoint takes it again, so
    the producer's idempotence state outlives its batches across a restart."""
    now = [1_000_000]
    config = LogConfig(retention_ms=1000)
    log = PartitionLog(tmp_path / "p", config, clock=lambda: now[0])
    states = ProducerStates()
    _produce(log, states, 0, 10)
    assert asyncio.run(states.checkpoint(_flush)) == 1
    _produce(log, states, 20, 3)  # not due for a snapshot yet
    assert asyncio.run(states.checkpoint(_flush)) == 0
    now[0] += 2_000
    assert log.enforce_retention() == 1  # the open ledger, rolled
    assert log.log_start_offset == log.next_offset == 26
    expected = states.get("t", 0, log).to_json(26)
    assert asyncio.run(states.checkpoint(_flush)) == 1
    assert _snapshot(log)["offset"] == 26
    log.close()
    log = PartitionLog(log.directory, config, clock=lambda: now[0])
    assert ProducerStates().get("t", 0, log).to_json(26) == expected
    log.close()


def test_the_snapshot_is_written_only_after_its_fsync(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "p", LogConfig())
    states = ProducerStates()
    _produce(log, states, 0, 4)

    async def scenario() -> None:
        release = asyncio.Event()
        asked: list[int] = []

        async def slow_flush(partition: PartitionLog) -> None:
            asked.append(partition.next_offset)
            await release.wait()
            partition.flush()

        task = asyncio.create_task(states.checkpoint(slow_flush))
        await asyncio.sleep(0.05)
        assert asked == [8]
        assert not (log.directory / SNAPSHOT_FILE).exists()
        _produce(log, states, 8, 1)  # an append while the fsync runs: not in this snapshot
        release.set()
        assert await task == 1

    asyncio.run(scenario())
    assert _snapshot(log)["offset"] == 8
    log.close()


def test_a_topic_deleted_during_the_fsync_gets_no_snapshot(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "p", LogConfig())
    states = ProducerStates()
    _produce(log, states, 0, 2)

    async def deleting_flush(partition: PartitionLog) -> None:
        partition.flush()
        states.forget("t")

    assert asyncio.run(states.checkpoint(deleting_flush)) == 0
    assert not (log.directory / SNAPSHOT_FILE).exists()
    log.close()


def test_when_a_partition_is_due(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = PartitionLog(tmp_path / "p", LogConfig())
    states = ProducerStates()
    states.get("t", 0, log)
    assert asyncio.run(states.checkpoint(_flush)) == 0  # empty: nothing to replay
    _produce(log, states, 0, 1)
    assert asyncio.run(states.checkpoint(_flush)) == 1  # no snapshot yet
    assert asyncio.run(states.checkpoint(_flush)) == 0  # nothing moved
    _produce(log, states, 2, 1)
    assert asyncio.run(states.checkpoint(_flush)) == 0  # moved a little, not for long
    monkeypatch.setattr(producer_states, "SNAPSHOT_EVERY_RECORDS", 3)
    _produce(log, states, 4, 1)
    assert asyncio.run(states.checkpoint(_flush)) == 1  # moved far enough
    monkeypatch.setattr(producer_states, "SNAPSHOT_MAX_AGE_S", 0.0)
    _produce(log, states, 6, 1)
    assert asyncio.run(states.checkpoint(_flush)) == 1  # moved, and old enough
    assert _snapshot(log)["offset"] == 8
    monkeypatch.setattr(producer_states, "SNAPSHOT_MAX_AGE_S", 3600.0)
    monkeypatch.setattr(producer_states, "SNAPSHOT_EVERY_RECORDS", 100_000)
    monkeypatch.setattr(producer_states, "SNAPSHOT_EVERY_BYTES", log.size_bytes * 2)
    _produce(log, states, 8, 1)
    assert asyncio.run(states.checkpoint(_flush)) == 0  # moved a little, not for long
    _produce(log, states, 10, 1, per_batch=2000)
    assert asyncio.run(states.checkpoint(_flush)) == 1  # the log grew by enough bytes
    assert _snapshot(log)["offset"] == 2010
    log.close()


def test_a_checkpoint_of_many_partitions_looks_at_a_share_of_them_in_turn(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each round holds the event loop for at most ``CHECKED_PER_ROUND`` checks: with more
    partitions loaded, the rounds take them in turn, and every due one gets its snapshot
    within a turn."""
    monkeypatch.setattr(producer_states, "CHECKED_PER_ROUND", 2)
    states = ProducerStates()
    logs = [PartitionLog(tmp_path / f"p{n}", LogConfig()) for n in range(5)]
    for n, log in enumerate(logs):
        state = states.get("t", n, log)
        data = bytearray(batch(PID + n, EPOCH, 0, 2))
        header = read_header(data)
        state.record(header, log.append(data, header), header.max_timestamp)
    assert [asyncio.run(states.checkpoint(_flush)) for _ in range(4)] == [2, 2, 1, 0]
    assert all((log.directory / SNAPSHOT_FILE).exists() for log in logs)
    for log in logs:
        log.close()


def test_a_rebuild_of_an_earlier_runs_batches_is_snapshotted_at_once(tmp_path: Path) -> None:
    """A clean point: once the replay is done the state is saved, so the next rebuild
    starts from here whatever happens next (however soon the next crash comes)."""
    log = PartitionLog(tmp_path / "p", LogConfig())
    states = ProducerStates()
    _produce(log, states, 0, 4)
    assert asyncio.run(states.checkpoint(_flush)) == 1
    _produce(log, states, 8, 4)  # and the process dies before the next snapshot
    log = _restarted(log)
    states = ProducerStates()
    states.get("t", 0, log)  # replays the 4 batches after the snapshot at 8
    assert asyncio.run(states.checkpoint(_flush)) == 1
    assert _snapshot(log)["offset"] == 16
    assert asyncio.run(states.checkpoint(_flush)) == 0  # once
    log.close()


def test_a_partition_new_in_this_run_is_not_said_to_be_rebuilt(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Loading the state of a partition whose batches were all written in this run is no
    crash recovery, and the log does not say it is."""
    log = PartitionLog(tmp_path / "p", LogConfig())
    for _ in range(3):  # a plain producer: its batches never load the producer state
        data = bytearray(batch(-1, -1, -1, 2))
        log.append(data, read_header(data))
    caplog.set_level(logging.INFO, logger=producer_states.__name__)
    states = ProducerStates()
    states.get("t", 0, log)
    assert "rebuilt" not in caplog.text and "replayed" not in caplog.text
    assert asyncio.run(states.checkpoint(_flush)) == 1  # still worth a snapshot
    log.close()


@pytest.mark.parametrize("content", [b"{not json", b"", b'{"offset": 999}'],
                         ids=["garbage", "empty", "beyond-the-log"])
def test_an_unusable_snapshot_means_a_whole_replay(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes) -> None:
    log = PartitionLog(tmp_path / "p", LogConfig())
    states = ProducerStates()
    _produce(log, states, 0, 5)
    expected = states.get("t", 0, log).to_json(log.next_offset)
    log = _restarted(log)
    (log.directory / SNAPSHOT_FILE).write_bytes(content)
    caplog.set_level(logging.INFO, logger=producer_states.__name__)
    assert ProducerStates().get("t", 0, log).to_json(log.next_offset) == expected
    assert "the log start, 5 batch(es) replayed" in caplog.text
    log.close()


def test_kill_9_replays_only_the_tail_and_keeps_idempotence(tmp_path: Path) -> None:
    """On a running broker: enough records for a snapshot, a few more batches, SIGKILL;
    the restarted broker replays those few and still knows every producer sequence."""
    data = tmp_path / "data"
    broker = start_broker(data)
    try:
        conn = TxnConnection(broker.port)
        assert conn.create_topic("snap", 1) == NONE
        pid, epoch = conn.init_ok(None)
        per_batch, big = 2000, producer_states.SNAPSHOT_EVERY_RECORDS // 2000 + 1
        for n in range(big):
            assert conn.produce("snap", batch(pid, epoch, n * per_batch, per_batch))[0] == NONE
        first_tail = big * per_batch

        def snapshot_offset() -> int:
            found = list(data.rglob(SNAPSHOT_FILE))
            if not found:
                return -1
            try:
                return int(json.loads(found[0].read_text())["offset"])
            except ValueError:  # caught between write and rename: look again
                return -1

        wait_until(lambda: snapshot_offset() >= producer_states.SNAPSHOT_EVERY_RECORDS, 90,
                   "a producer snapshot")
        # the snapshot may have come before the last big batches: they are replayed too
        snapshot_at = snapshot_offset()
        replayed = (first_tail - snapshot_at) // per_batch + 4
        tail = [conn.produce("snap", batch(pid, epoch, first_tail + 3 * i, 3))
                for i in range(4)]
        assert [code for code, _ in tail] == [NONE] * 4
        conn.close()
        broker.kill()

        broker.start()
        conn = TxnConnection(broker.port)
        last_seq = first_tail + 9
        # a retry of the last batch is answered with its offset, not written again
        assert conn.produce("snap", batch(pid, epoch, last_seq, 3)) == (NONE, tail[-1][1])
        assert conn.produce("snap", batch(pid, epoch, last_seq + 3, 1)) == \
            (NONE, tail[-1][1] + 3)
        conn.close()
        broker.wait_for_log(rf"snapshot at offset {snapshot_at}, {replayed} batch\(es\) "
                            "replayed")
    finally:
        broker.kill()


def test_a_crash_loop_replays_a_flat_tail(tmp_path: Path) -> None:
    """kill -9 again and again under an idempotent producer: each start replays only what
    was written since the last start (the broker's own report), never a growing tail."""
    data = tmp_path / "data"
    broker = start_broker(data)
    per_cycle, replays = 10, []
    try:
        conn = TxnConnection(broker.port)
        assert conn.create_topic("loop", 1) == NONE
        pid, epoch = conn.init_ok(None)
        assert conn.produce("loop", batch(pid, epoch, 0, 2))[0] == NONE
        wait_until(lambda: _snapshot_offset(data) >= 2, 20, "the first snapshot")
        seq = 2
        for _cycle in range(4):
            for _ in range(per_cycle):
                assert conn.produce("loop", batch(pid, epoch, seq, 2))[0] == NONE
                seq += 2
            conn.close()
            broker.kill()
            broker.start()
            conn = TxnConnection(broker.port)
            code, offset = conn.produce("loop", batch(pid, epoch, seq, 2))  # loads the state
            assert code == NONE
            seq += 2
            line = broker.wait_for_log(r"producer state rebuilt .* batch\(es\) replayed")
            replays.append(int(line.rsplit(", ", 1)[1].split()[0]))
            wait_until(lambda: _snapshot_offset(data) >= offset + 2, 20,  # noqa: B023
                       "the snapshot after the rebuild")
        conn.close()
    finally:
        broker.kill()
    assert replays == [per_cycle] * 4, replays


def _snapshot_offset(data: Path) -> int:
    for found in data.rglob(SNAPSHOT_FILE):
        try:
            return int(json.loads(found.read_text())["offset"])
        except ValueError:  # caught between write and rename: look again
            return -1
    return -1


def test_an_invalidated_partition_recognises_a_batch_stored_behind_its_back(
        tmp_path: Path) -> None:
    """An append whose outcome is unknown (a database commit whose reply was lost) may have
    stored the batch without the state recording it: after ``invalidate`` the rebuilt
    state knows it, so the producer's retry is a duplicate instead of a second copy."""
    log = PartitionLog(tmp_path / "p", LogConfig())
    states = ProducerStates()
    _produce(log, states, 0, 2)
    data = bytearray(batch(PID, EPOCH, 4, 2))
    header = read_header(data)
    assert states.get("t", 0, log).check(header) is None
    stored = log.append(data, header)  # not recorded
    assert states.get("t", 0, log).check(header) is None  # memory would accept it again
    states.invalidate("t", 0)
    assert states.get("t", 0, log).check(header) == stored
    log.close()


def test_a_snapshot_leaves_out_batches_not_yet_stored() -> None:
    """An engine that commits in groups records a batch before its commit: a snapshot taken
    meanwhile must not name it (were the commit to fail, the producer's retry would be taken
    for a duplicate of a batch that is not in the log)."""
    from broker_core.partition_producers import PartitionProducers

    state = PartitionProducers()
    for n, base in enumerate((0, 2, 4)):  # the batch at 4 waits for its commit
        header = read_header(bytearray(batch(PID, EPOCH, n * 2, 2)))
        state.record(header, base, header.max_timestamp)
    restored = PartitionProducers.from_json(json.loads(json.dumps(state.to_json(4))))
    retry = read_header(bytearray(batch(PID, EPOCH, 4, 2)))
    assert restored.check(retry) is None  # not a duplicate: it is appended again
    stored = read_header(bytearray(batch(PID, EPOCH, 2, 2)))
    assert restored.check(stored) == 2  # a retry of a stored batch still is one


def test_a_snapshot_taken_while_every_remembered_batch_waits_keeps_the_producer_going(
        ) -> None:
    """The five batches a partition remembers of a producer may all be waiting for their
    group commit when a snapshot is taken (five requests in flight): the batches stored
    before them are remembered no more. Should those commits fail, the state rebuilt from
    that snapshot must take the producer's retry of the first of them (were it refused
    OUT_OF_ORDER_SEQUENCE_NUMBER, "expected 0", librdkafka would bump its epoch and
    renumber its messages), yet still fence an older epoch."""
    from broker_core.errors import ErrorCode, KafkaApiError
    from broker_core.partition_producers import PartitionProducers

    state = PartitionProducers()
    for n in range(8):  # offsets 6.. (sequences 6..15) wait for their commit
        header = read_header(bytearray(batch(PID, EPOCH + 1, n * 2, 2)))
        state.record(header, n * 2, header.max_timestamp)
    restored = PartitionProducers.from_json(json.loads(json.dumps(state.to_json(6))))
    retry = read_header(bytearray(batch(PID, EPOCH + 1, 6, 2)))
    assert restored.check(retry) is None  # appended again, not refused
    with pytest.raises(KafkaApiError) as fenced:
        restored.check(read_header(bytearray(batch(PID, EPOCH, 6, 2))))
    assert fenced.value.code == ErrorCode.INVALID_PRODUCER_EPOCH
    restored.record(retry, 6, retry.max_timestamp)  # from here on, sequences are checked
    with pytest.raises(KafkaApiError) as gap:
        restored.check(read_header(bytearray(batch(PID, EPOCH + 1, 12, 2))))
    assert gap.value.code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    again = PartitionProducers.from_json(json.loads(json.dumps(restored.to_json(8))))
    assert again.check(read_header(bytearray(batch(PID, EPOCH + 1, 8, 2)))) is None
    with pytest.raises(KafkaApiError):  # the flag is not carried past a stored batch
        again.check(read_header(bytearray(batch(PID, EPOCH + 1, 10, 2))))


@pytest.mark.parametrize("commit", [False, True])
def test_a_snapshot_taken_before_a_marker_is_stored_keeps_its_transaction_open(
        commit: bool) -> None:
    """An engine that commits in groups applies a transaction marker to the state before
    it is stored: a snapshot valid up to an offset between the transaction's first record
    and its marker must still count the transaction open. Were it closed, the state rebuilt
    from it and the log would list no aborted transaction once the abort marker is replayed
    (read_committed fetches would serve the aborted records), nor hold the last stable
    offset back if the marker's commit failed."""
    from broker_core.partition_producers import PartitionProducers

    state = PartitionProducers()
    for base in (0, 2):  # a transaction's records at 0..3; its marker at 4 waits to commit
        header = read_header(bytearray(batch(PID, EPOCH, base, 2, transactional=True)))
        state.record(header, base, header.max_timestamp)
    state.end_transaction(PID, EPOCH, commit, 4, 0)
    assert state.last_stable_offset(5, 0) == 5
    restored = PartitionProducers.from_json(json.loads(json.dumps(state.to_json(4))))
    assert restored.last_stable_offset(4, 0) == 0  # the marker not stored: still open
    restored.end_transaction(PID, EPOCH, commit, 4, 0)  # replayed once it is stored
    assert restored.last_stable_offset(5, 0) == 5
    assert restored.aborted_between(0, 5) == ([] if commit else [(PID, 0)])


class _Overtaken(PartitionLog):
    """A partition whose first replay is overtaken by a drop (retention or DeleteRecords,
    which on PostgreSQL run in worker threads): after the first batch read, the log
    start moves to ``drop_to`` and the reader's ledger goes."""

    drop_to = 0

    def headers_from(self, offset: int) -> Iterator[BatchInfo]:
        reader = super().headers_from(offset)
        if not self.drop_to:
            yield from reader
            return
        yield next(reader)
        self.delete_records_before(self.drop_to)
        self.drop_to = 0
        yield from reader


def test_a_replay_a_drop_overtakes_goes_on_from_the_new_log_start(tmp_path: Path) -> None:
    """The rest of the log is replayed all the same: a producer known only from batches
    after the drop still has its retry recognised (else appended twice)."""
    log = PartitionLog(tmp_path / "p", LogConfig(segment_bytes=300))
    states = ProducerStates()
    _produce(log, states, 0, 10)
    state = states.get("t", 0, log)
    later = [read_header(bytearray(batch(PID + 1, EPOCH, seq, 2))) for seq in (0, 2, 4)]
    for seq, header in zip((0, 2, 4), later, strict=True):
        base = log.append(bytearray(batch(PID + 1, EPOCH, seq, 2)), header)
        state.record(header, base, header.max_timestamp)
    assert len(log.sealed_segments()) > 3
    log.close()
    overtaken = _Overtaken(tmp_path / "p", LogConfig(segment_bytes=300))
    overtaken.drop_to = 12
    rebuilt = ProducerStates().get("t", 0, overtaken)
    assert overtaken.log_start_offset >= 10 and overtaken.drop_to == 0
    assert rebuilt.check(later[-1]) == overtaken.next_offset - 2  # a duplicate
    overtaken.close()
