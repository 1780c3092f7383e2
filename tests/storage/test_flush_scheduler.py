"""The fsync policy: grouped fsyncs on demand, periodic fsyncs, and early writeback.

Real partition logs on a real file system; the one subclass below only counts calls.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from broker_core.durability import WRITEBACK_INTERVAL_MS, FlushScheduler
from broker_core.storage import LogConfig, PartitionLog
from broker_core.storage.fsutil import start_writeback
from tests.batches import build_batch
from tests.storage_helpers import headed


class CountingLog(PartitionLog):
    """A partition log that counts fsyncs and writeback requests."""

    flushes = 0
    writebacks = 0

    def flush(self) -> bool:
        self.flushes += 1
        return super().flush()

    def start_writeback(self) -> None:
        self.writebacks += 1
        super().start_writeback()


def test_start_writeback_is_available_for_ledger_files(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100_000)
    fd = os.open(path, os.O_RDWR)
    try:
        assert start_writeback(fd, 0, 100_000)  # Linux: sync_file_range is there
        assert not start_writeback(fd, 0, 0)  # nothing to do
    finally:
        os.close(fd)


def test_writeback_follows_appends_across_rolls(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "p", LogConfig())
    for round_ in range(3):
        for _ in range(5):
            log.append(*headed(build_batch([(None, b"v" * 1000)], timestamp=1)))
        log.start_writeback()
        log.start_writeback()  # nothing new: a no-op
        if round_ == 1:
            log.roll()
    log.flush()
    assert log.next_offset == 15
    assert sum(len(chunk) for chunk in log.read(0, 1 << 30)) > 15_000
    log.close()


def test_writeback_runs_between_periodic_fsyncs(tmp_path: Path) -> None:
    log = CountingLog(tmp_path / "p", LogConfig())

    async def scenario() -> None:
        scheduler = FlushScheduler(flush_interval_messages=1 << 60, flush_interval_ms=1000)
        scheduler.start()
        for _ in range(6):
            log.append(*headed(build_batch([(None, b"v" * 1000)], timestamp=1)))
            assert scheduler.appended(log, 1) is None  # no fsync is due by count
            await asyncio.sleep(WRITEBACK_INTERVAL_MS / 1000 * 1.5)
        assert log.writebacks >= 3 and log.flushes == 0
        idle = log.writebacks
        await asyncio.sleep(WRITEBACK_INTERVAL_MS / 1000 * 3)
        assert log.writebacks == idle  # nothing appended: no writeback requested
        await asyncio.sleep(1.0)
        assert log.flushes == 1  # the periodic fsync came on time
        await scheduler.stop()

    asyncio.run(scenario())
    log.close()
