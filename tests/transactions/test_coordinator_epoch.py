"""The coordinator epoch at the partition and the group, as Kafka's ``appendEndTxnMarker``:
a transaction marker (or a group's transaction end) whose coordinator epoch is below the
last one that ended a transaction of the producer there, or whose producer epoch is below
the producer's, is refused and changes nothing; an equal or higher one is accepted and
raises what is kept. What is kept survives a producer snapshot (one written before it was
kept reads as -1), a replay of the markers, and for a group a replay of its log,
compacted or not. The regression on a cluster with real clients is
``tests/cluster/test_cluster_stale_coordinator.py``."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from broker_core.codec.batch_header import read_header
from broker_core.codec.markers import marker_batch
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.groups import offsets_topic
from broker_core.groups.config import GroupConfig
from broker_core.groups.coordinator import GroupCoordinator
from broker_core.groups.model import Group, TxnFence
from broker_core.groups.offsets import OffsetToCommit
from broker_core.partition_producers import PartitionProducers
from broker_core.producer_states import ProducerStates
from broker_core.storage import LogConfig, PartitionLog, open_storage
from tests.groups.test_offsets_txn_order import GROUP, OFFSETS_TOPIC, TOPIC, _coordinator, _served
from tests.txn_helpers import batch

PID, EPOCH = 7, 2


def _opened(state: PartitionProducers, base: int, sequence: int = 0) -> None:
    """A transactional batch of the producer at ``base``: its transaction is open."""
    header = read_header(bytearray(batch(PID, EPOCH, sequence, 1, transactional=True)))
    state.record(header, base, header.max_timestamp)


def _refused(state: PartitionProducers, epoch: int, coordinator_epoch: int) -> ErrorCode:
    with pytest.raises(KafkaApiError) as refused:
        state.check_marker(PID, epoch, coordinator_epoch)
    return refused.value.code


def test_a_marker_of_a_lower_coordinator_epoch_is_refused() -> None:
    state = PartitionProducers()
    _opened(state, 0)
    state.check_marker(PID, EPOCH, 3)
    state.end_transaction(PID, EPOCH, True, 1, 0, coordinator_epoch=3)
    _opened(state, 2, 1)  # the next transaction
    assert _refused(state, EPOCH, 2) == ErrorCode.TRANSACTION_COORDINATOR_FENCED
    assert _refused(state, EPOCH, 0) == ErrorCode.TRANSACTION_COORDINATOR_FENCED
    assert state.last_stable_offset(3, 0) == 2  # still open
    state.check_marker(PID, EPOCH, -1)  # unknown (a request of an older broker): not judged


def test_a_marker_of_a_lower_producer_epoch_is_refused() -> None:
    state = PartitionProducers()
    _opened(state, 0)
    assert _refused(state, EPOCH - 1, 9) == ErrorCode.INVALID_PRODUCER_EPOCH


def test_equal_and_higher_epochs_are_accepted_and_kept() -> None:
    state = PartitionProducers()
    _opened(state, 0)
    state.check_marker(PID, EPOCH, 3)
    state.end_transaction(PID, EPOCH, False, 1, 0, coordinator_epoch=3)
    state.check_marker(PID, EPOCH, 3)
    state.check_marker(PID, EPOCH + 1, 4)
    state.end_transaction(PID, EPOCH + 1, False, 2, 0, coordinator_epoch=4)
    assert (state.producers[PID].epoch, state.producers[PID].coordinator_epoch) == \
        (EPOCH + 1, 4)
    # a batch of a new producer epoch keeps the coordinator epoch
    header = read_header(bytearray(batch(PID, EPOCH + 2, 0, 1, transactional=True)))
    state.record(header, 3, header.max_timestamp)
    assert _refused(state, EPOCH + 2, 3) == ErrorCode.TRANSACTION_COORDINATOR_FENCED


def test_the_coordinator_epoch_survives_a_snapshot() -> None:
    state = PartitionProducers()
    _opened(state, 0)
    state.end_transaction(PID, EPOCH, True, 1, 0, coordinator_epoch=6)
    document = json.loads(json.dumps(state.to_json(2)))
    restored = PartitionProducers.from_json(document)
    assert restored.producers[PID].coordinator_epoch == 6
    assert _refused(restored, EPOCH, 5) == ErrorCode.TRANSACTION_COORDINATOR_FENCED
    # a snapshot written before the coordinator epoch was kept: four items, read as -1
    document["producers"][str(PID)] = document["producers"][str(PID)][:4]
    old = PartitionProducers.from_json(document)
    assert old.producers[PID].coordinator_epoch == -1
    old.check_marker(PID, EPOCH, 0)


def test_a_replay_of_the_markers_gives_the_coordinator_epoch(tmp_path: Path) -> None:
    """The producer state rebuilt from a real partition log reads the coordinator epoch
    from the markers' values (the latest one counts)."""
    log = PartitionLog(tmp_path / "p", LogConfig())
    for sequence, coordinator_epoch in ((0, 2), (1, 8)):
        data = bytearray(batch(PID, EPOCH, sequence, 1, transactional=True))
        log.append(data, read_header(data))
        marker = marker_batch(PID, EPOCH, True, int(time.time() * 1000), coordinator_epoch)
        log.append(marker, read_header(marker))
    state = ProducerStates().get("t", 0, log)
    assert state.producers[PID].coordinator_epoch == 8
    assert _refused(state, EPOCH, 7) == ErrorCode.TRANSACTION_COORDINATOR_FENCED
    log.close()


@pytest.mark.parametrize("compaction_bytes", [1 << 30, 1], ids=["log", "compacted"])
def test_a_group_refuses_a_fenced_transaction_end(tmp_path: Path,
                                                  compaction_bytes: int) -> None:
    """The end of the producer's transaction 1 at coordinator epoch 3; its transaction 2's
    offset pending: an end from coordinator epoch 2, or of an older producer epoch, is
    refused and leaves it pending, also once the group's log is replayed (compacted:
    what the compaction keeps holds the epochs)."""
    async def committed(groups: GroupCoordinator) -> int | None:
        found = groups.committed(OFFSETS_TOPIC, GROUP, [(TOPIC, 0)])[(TOPIC, 0)]
        return None if found is None else found.offset

    async def refused(groups: GroupCoordinator, epoch: int, coordinator_epoch: int
                      ) -> ErrorCode:
        with pytest.raises(KafkaApiError) as error:
            await groups.complete_txn(OFFSETS_TOPIC, GROUP, PID, True, epoch,
                                      coordinator_epoch)
        return error.value.code

    async def scenario() -> None:
        logs = open_storage(tmp_path.as_uri(), LogConfig())
        logs.create_topic(TOPIC, 1, {})
        groups = _coordinator(logs, compaction_bytes)
        await _served(groups)
        await groups.txn_commit(OFFSETS_TOPIC, GROUP, PID, "", None, -1, [
            OffsetToCommit(TOPIC, 0, 10, -1, "")])
        await groups.complete_txn(OFFSETS_TOPIC, GROUP, PID, True, EPOCH, 3)
        await groups.txn_commit(OFFSETS_TOPIC, GROUP, PID, "", None, -1, [
            OffsetToCommit(TOPIC, 0, 20, -1, "")])
        assert await refused(groups, EPOCH, 2) == ErrorCode.TRANSACTION_COORDINATOR_FENCED
        assert await refused(groups, EPOCH - 1, 3) == ErrorCode.INVALID_PRODUCER_EPOCH
        assert await committed(groups) == 10
        assert groups.unstable(OFFSETS_TOPIC, GROUP) == {(TOPIC, 0)}
        await groups.stop()
        logs.close()

        logs = open_storage(tmp_path.as_uri(), LogConfig())
        again = _coordinator(logs, 1 << 30)
        await _served(again)
        assert await refused(again, EPOCH, 2) == ErrorCode.TRANSACTION_COORDINATOR_FENCED
        assert await committed(again) == 10
        await again.complete_txn(OFFSETS_TOPIC, GROUP, PID, True, EPOCH, 3)
        assert await committed(again) == 20
        await again.stop()
        logs.close()

    asyncio.run(scenario())


EXPIRATION = 60_000
IDLE, BUSY = PID, PID + 1


@pytest.mark.parametrize("compaction_bytes", [1 << 30, 1], ids=["log", "compacted"])
def test_a_group_forgets_the_fences_of_idle_producers(tmp_path: Path,
                                                      compaction_bytes: int) -> None:
    """A producer's fence is forgotten by the offsets expiry once its last end is older
    than ``transactionalIdExpirationMs`` and it has no offsets pending; one with offsets
    pending keeps it. A compaction after that leaves the forgotten one out; a coordinator
    that replays the log (compacted or not) reads the same end times and, at the same
    time, keeps the same fences."""
    config = GroupConfig(transactional_id_expiration_ms=EXPIRATION)

    async def scenario() -> None:
        logs = open_storage(tmp_path.as_uri(), LogConfig())
        logs.create_topic(TOPIC, 1, {})
        groups = _coordinator(logs, compaction_bytes, config)
        await _served(groups)
        for pid, offset in ((IDLE, 10), (BUSY, 11)):
            await groups.txn_commit(OFFSETS_TOPIC, GROUP, pid, "", None, -1, [
                OffsetToCommit(TOPIC, 0, offset, -1, "")])
            await groups.complete_txn(OFFSETS_TOPIC, GROUP, pid, True, EPOCH, 3)
        await groups.txn_commit(OFFSETS_TOPIC, GROUP, BUSY, "", None, -1, [
            OffsetToCommit(TOPIC, 0, 12, -1, "")])  # pending
        group = groups.find(OFFSETS_TOPIC, GROUP)
        assert group is not None
        kept = dict(group.txn_fences)
        assert set(kept) == {IDLE, BUSY}
        last = max(fence.ended_ms for fence in kept.values())

        await groups.expire_offsets(kept[IDLE].ended_ms + EXPIRATION)  # not over it yet
        assert group.txn_fences == kept
        await groups.expire_offsets(last + EXPIRATION + 1)  # both over: BUSY has pending
        assert group.txn_fences == {BUSY: kept[BUSY]}
        # forgotten: a very late end of the idle producer is not judged any more (its id
        # expired, its producer id is never handed out again: nothing of it is pending)
        await groups.complete_txn(OFFSETS_TOPIC, GROUP, IDLE, False, EPOCH, 2)
        assert set(group.txn_fences) == {IDLE, BUSY}
        forgotten_at = group.txn_fences[IDLE].ended_ms + EXPIRATION + 1
        await groups.expire_offsets(forgotten_at)
        assert groups.find(OFFSETS_TOPIC, GROUP) is group
        assert group.txn_fences == {BUSY: kept[BUSY]}
        stored = logs.partition(OFFSETS_TOPIC, 0)
        assert stored is not None
        start = stored.log_start_offset
        for offset in range(30, 130):  # compacted once the snapshot's size is written
            await groups.commit(OFFSETS_TOPIC, GROUP, "", None, -1, [
                OffsetToCommit(TOPIC, 0, offset, -1, "")])
            if compaction_bytes > 1 or stored.log_start_offset > start:
                break
        assert (stored.log_start_offset > start) == (compaction_bytes == 1)
        await groups.stop()
        logs.close()

        logs = open_storage(tmp_path.as_uri(), LogConfig())
        again = _coordinator(logs, 1 << 30, config)
        await _served(again)
        replayed = again.find(OFFSETS_TOPIC, GROUP)
        assert replayed is not None
        if compaction_bytes == 1:  # the compaction wrote only the fence kept
            assert replayed.txn_fences == {BUSY: kept[BUSY]}
        else:  # the log holds every end, each with its own time: forgotten alike
            assert replayed.txn_fences[BUSY] == kept[BUSY]
            assert replayed.txn_fences[IDLE].ended_ms == forgotten_at - EXPIRATION - 1
            await again.expire_offsets(forgotten_at - 1)
            assert set(replayed.txn_fences) == {IDLE, BUSY}
        await again.expire_offsets(forgotten_at)
        assert replayed.txn_fences == {BUSY: kept[BUSY]}
        with pytest.raises(KafkaApiError) as error:
            await again.complete_txn(OFFSETS_TOPIC, GROUP, BUSY, True, EPOCH, 2)
        assert error.value.code == ErrorCode.TRANSACTION_COORDINATOR_FENCED
        await again.stop()
        logs.close()

    asyncio.run(scenario())


def test_a_replayed_end_takes_its_records_time_else_the_replays() -> None:
    """An end record carries its time; one written before it did counts as ended at the
    replay (later than it was: its fence is kept longer, never forgotten early)."""
    groups: dict[tuple[str, str], Group] = {}
    key, value = offsets_topic.txn_end_record(GROUP, IDLE, True, EPOCH, 3, ended_ms=1_000)
    offsets_topic.replay(groups, OFFSETS_TOPIC, 0, key, value, 5_000)
    legacy = json.loads(value)
    del legacy["endedMs"]
    key, value = offsets_topic.txn_end_record(GROUP, BUSY, True, EPOCH, 3, ended_ms=0)
    offsets_topic.replay(groups, OFFSETS_TOPIC, 0, key, json.dumps(legacy).encode(), 5_000)
    group = groups[(OFFSETS_TOPIC, GROUP)]
    assert group.txn_fences == {IDLE: TxnFence(EPOCH, 3, 1_000), BUSY: TxnFence(EPOCH, 3, 5_000)}
    assert group.forget_txn_fences(5_000 + EXPIRATION, EXPIRATION) == 1
    assert set(group.txn_fences) == {BUSY}
    # what a compaction keeps: the fence still kept, with its time
    assert offsets_topic.snapshot([group], []) == [
        offsets_topic.txn_end_record(GROUP, BUSY, False, EPOCH, 3, ended_ms=5_000)]
