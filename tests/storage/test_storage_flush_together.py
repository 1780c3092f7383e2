"""Partitions flushed together (one syncfs for many, as the periodic flush of thousands of
dirty partitions does) record their flush as an fsync each would: after a crash (no
close), each opens with what was appended; a closed one is skipped; a new partition made
without fsyncs opens empty and then takes appends. Partitions closed together (a clean
stop: temp metadata for all, a syncfs, the renames, a syncfs) open sealed and are not
rewritten at the next start; a crash in the middle of that loses nothing."""

from __future__ import annotations

from pathlib import Path

from broker_core.storage import LogConfig, PartitionLog, flush_together
from broker_core.storage.fsutil import TEMP_SUFFIX
from broker_core.storage.metadata import METADATA_FILE, load_metadata
from broker_core.storage.partition_flush import FLUSH_TOGETHER_MIN, close_together
from tests.storage.test_storage_partition import add, decode

COUNT = FLUSH_TOGETHER_MIN + 4


def test_flushed_together_then_crashed(tmp_path: Path) -> None:
    logs = [PartitionLog(tmp_path / str(i), LogConfig(), fresh=True) for i in range(COUNT)]
    for i, log in enumerate(logs):
        add(log, 0, i + 1)
    logs[0].close()
    outcomes = flush_together(logs)
    assert all(outcome is False for outcome in outcomes)  # no checkpoint due, no error
    for i, log in enumerate(logs[1:], start=1):  # a crash: reopened without a close
        again = PartitionLog(tmp_path / str(i), LogConfig())
        assert again.next_offset == i + 1
        again.close()
        log.close()


def test_a_clean_stop_and_start_rewrite_nothing(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "p", LogConfig(), fresh=True)
    add(log, 0, 3)
    log.close()
    metadata = tmp_path / "p" / "partition.json"
    written = metadata.stat().st_mtime_ns
    again = PartitionLog(tmp_path / "p", LogConfig())
    assert again.next_offset == 3
    again.close()
    assert metadata.stat().st_mtime_ns == written
    third = PartitionLog(tmp_path / "p", LogConfig())
    assert add(third, 3, 2) == 3
    third.close()
    assert metadata.stat().st_mtime_ns != written
    assert PartitionLog(tmp_path / "p", LogConfig()).next_offset == 5


def _written(tmp_path: Path, count: int = COUNT) -> list[PartitionLog]:
    """``count`` partitions, each with records in a sealed ledger and in the open one."""
    logs = [PartitionLog(tmp_path / str(i), LogConfig(), fresh=True) for i in range(count)]
    for i, log in enumerate(logs):
        add(log, 0, i + 1)
        log.roll()
        add(log, i + 1, 2)
    return logs


def _check_reopened(tmp_path: Path, count: int = COUNT) -> None:
    """Each partition opens with every record appended, its offsets in order."""
    for i in range(count):
        again = PartitionLog(tmp_path / str(i), LogConfig())
        try:
            assert again.next_offset == i + 3
            offsets: list[int] = []
            while len(offsets) < i + 3:
                read = [offset for offset, _ in decode(again.read(len(offsets), 1 << 20))]
                assert read, f"nothing at offset {len(offsets)} of partition {i}"
                offsets += read
            assert offsets == list(range(i + 3))
            assert not (tmp_path / str(i) / (METADATA_FILE + TEMP_SUFFIX)).exists()
        finally:
            again.close()


def test_closed_together_then_started(tmp_path: Path) -> None:
    logs = _written(tmp_path)
    idle = PartitionLog(tmp_path / "idle", LogConfig(), fresh=True)
    add(idle, 0, 1)
    idle.close()
    idle = PartitionLog(tmp_path / "idle", LogConfig())
    unchanged = (tmp_path / "idle" / METADATA_FILE).stat().st_mtime_ns
    assert close_together([*logs, idle]) == [None] * (COUNT + 1)
    assert (tmp_path / "idle" / METADATA_FILE).stat().st_mtime_ns == unchanged
    for i in range(COUNT):  # sealed: the metadata says so, a start rewrites nothing
        metadata = load_metadata(tmp_path / str(i))
        assert metadata is not None
        assert metadata.next_offset == i + 3
        assert all(facts.sealed and facts.synced for facts in metadata.ledgers)
    stored = [(tmp_path / str(i) / METADATA_FILE).stat().st_mtime_ns for i in range(COUNT)]
    _check_reopened(tmp_path)
    assert [(tmp_path / str(i) / METADATA_FILE).stat().st_mtime_ns
            for i in range(COUNT)] == stored
    assert close_together(logs) == [None] * COUNT  # closed already: nothing to do


def test_a_crash_inside_a_stop_together_loses_nothing(tmp_path: Path) -> None:
    """kill -9 after every partition wrote its temp metadata and half of them renamed it:
    each opens with what was appended (its new metadata, or its old one and a scan)."""
    logs = _written(tmp_path)
    points = [log.close_begin() for log in logs]
    assert all(point is not None for point in points)
    for point in points[: COUNT // 2]:
        assert point is not None
        point.finish(synced=False)
    for point in points:
        assert point is not None
        point.release()
    _check_reopened(tmp_path)


def test_few_partitions_close_one_by_one(tmp_path: Path) -> None:
    logs = _written(tmp_path, 3)
    assert close_together(logs) == [None, None, None]
    _check_reopened(tmp_path, 3)
