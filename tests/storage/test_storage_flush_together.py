"""Partitions flushed together (one syncfs for many, as the periodic flush of thousands of
dirty partitions does) record their flush as an fsync each would: after a crash (no
close), each opens with what was appended; a closed one is skipped; a new partition made
without fsyncs opens empty and then takes appends."""

from __future__ import annotations

from pathlib import Path

from broker_core.storage import LogConfig, PartitionLog, flush_together
from broker_core.storage.partition_flush import FLUSH_TOGETHER_MIN
from tests.storage.test_storage_partition import add

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
