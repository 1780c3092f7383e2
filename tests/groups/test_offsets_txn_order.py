"""A transaction's offset and a plain OffsetCommit of the same partition: the later record
wins, as Kafka's ``completePendingTxnOffsetCommit`` installs a transaction's offset only
over an older one. TxnOffsetCommit(100), then OffsetCommit(200), then the transaction's
commit leaves 200; in memory, after a replay of the log, and after a replay of a
compacted log (coordinator driven directly, on real storage)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker_core.appends import AppendPath
from broker_core.durability import FlushScheduler
from broker_core.groups.config import GroupConfig
from broker_core.groups.coordinator import GroupCoordinator
from broker_core.groups.offsets import OffsetToCommit
from broker_core.storage import LogConfig, Storage, open_storage
from broker_core.system_topics import SystemTopic

OFFSETS_TOPIC = "public/__kafka/__consumer_offsets"
TOPIC = "public/default/t"
GROUP = "g"
PRODUCER = 7


def _coordinator(logs: Storage, compaction_bytes: int,
                 config: GroupConfig | None = None) -> GroupCoordinator:
    store = SystemTopic(logs, AppendPath(FlushScheduler(2**63 - 1, 0)), "__consumer_offsets",
                        1, 1 << 20, compaction_bytes)
    groups = GroupCoordinator(config or GroupConfig(), store)
    groups.start()
    return groups


async def _served(groups: GroupCoordinator) -> None:
    for _ in range(500):
        if groups.check(OFFSETS_TOPIC, GROUP) == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the offsets partition was not replayed")


def _committed(groups: GroupCoordinator) -> dict[int, int | None]:
    found = groups.committed(OFFSETS_TOPIC, GROUP, [(TOPIC, 0), (TOPIC, 1)])
    return {p: None if c is None else c.offset for (_, p), c in found.items()}


@pytest.mark.parametrize("compaction_bytes", [1 << 30, 1], ids=["log", "compacted"])
def test_a_plain_commit_after_the_transactions_offset_wins(tmp_path: Path,
                                                           compaction_bytes: int) -> None:
    """Partition 0: the transaction's offset, then a plain one (which stays); partition 1:
    a plain offset, then the transaction's (which wins)."""
    async def scenario() -> None:
        logs = open_storage(tmp_path.as_uri(), LogConfig())
        logs.create_topic(TOPIC, 2, {})
        groups = _coordinator(logs, compaction_bytes)
        await _served(groups)
        error, results = await groups.commit(OFFSETS_TOPIC, GROUP, "", None, -1, [
            OffsetToCommit(TOPIC, 1, 10, -1, "")])
        assert (error, set(results.values())) == (0, {0})
        error, results = await groups.txn_commit(OFFSETS_TOPIC, GROUP, PRODUCER, "", None, -1, [
            OffsetToCommit(TOPIC, 0, 100, -1, ""), OffsetToCommit(TOPIC, 1, 110, -1, "")])
        assert (error, set(results.values())) == (0, {0})
        error, results = await groups.commit(OFFSETS_TOPIC, GROUP, "", None, -1, [
            OffsetToCommit(TOPIC, 0, 200, -1, "")])
        assert (error, set(results.values())) == (0, {0})
        assert _committed(groups) == {0: 200, 1: 10}
        await groups.complete_txn(OFFSETS_TOPIC, GROUP, PRODUCER, True)
        assert _committed(groups) == {0: 200, 1: 110}
        await groups.stop()
        logs.close()

        logs = open_storage(tmp_path.as_uri(), LogConfig())
        again = _coordinator(logs, 1 << 30)
        await _served(again)
        assert _committed(again) == {0: 200, 1: 110}
        await again.stop()
        logs.close()

    asyncio.run(scenario())


def test_a_compaction_keeps_the_order_a_later_commit_decides_by(tmp_path: Path) -> None:
    """A compaction between the plain commit and the transaction's end keeps the
    transaction's offset before the later plain one: the end, replayed after it, leaves
    the plain one."""
    async def scenario() -> None:
        logs = open_storage(tmp_path.as_uri(), LogConfig())
        logs.create_topic(TOPIC, 2, {})
        groups = _coordinator(logs, 1 << 30)
        await _served(groups)
        await groups.txn_commit(OFFSETS_TOPIC, GROUP, PRODUCER, "", None, -1, [
            OffsetToCommit(TOPIC, 0, 100, -1, "")])
        await groups.commit(OFFSETS_TOPIC, GROUP, "", None, -1, [
            OffsetToCommit(TOPIC, 0, 200, -1, "")])
        await groups.stop()
        logs.close()

        logs = open_storage(tmp_path.as_uri(), LogConfig())
        compacting = _coordinator(logs, 1)  # its next write compacts the partition first
        await _served(compacting)
        await compacting.complete_txn(OFFSETS_TOPIC, GROUP, PRODUCER, True)
        assert _committed(compacting) == {0: 200, 1: None}
        await compacting.stop()
        compacted = logs.partition(OFFSETS_TOPIC, 0)
        assert compacted is not None and compacted.log_start_offset > 0
        logs.close()

        logs = open_storage(tmp_path.as_uri(), LogConfig())
        again = _coordinator(logs, 1 << 30)
        await _served(again)
        assert _committed(again) == {0: 200, 1: None}
        await again.stop()
        logs.close()

    asyncio.run(scenario())
