"""The fsync policy: grouped fsyncs on demand, periodic fsyncs, and early writeback.

Real partition logs on a real file system; the one subclass below only counts calls.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

from broker_core.codec.batch_header import BatchHeader
from broker_core.durability import (
    WRITEBACK_INTERVAL_MS,
    WRITEBACK_MIN_BYTES,
    FlushScheduler,
    TopicFlush,
)
from broker_core.storage import LogConfig, PartitionLog
from broker_core.storage.fsutil import start_writeback
from broker_core.storage.partition_flush import FLUSH_TOGETHER_MIN
from tests.batches import build_batch
from tests.storage_helpers import headed
from tests.wakeups import CountingLoop, run_counting


def append_to(scheduler: FlushScheduler, log: PartitionLog, batch: bytearray,
              header: BatchHeader, topic: TopicFlush | None = None
              ) -> asyncio.Future[None] | None:
    """Append ``batch`` to ``log`` and tell ``scheduler``, as the append path does
    (``topic``: the topic's own flush policy)."""
    base = log.append(batch, header)
    return scheduler.appended(log, ("t", 0), base, header.record_count, len(batch), topic)


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
            batch, header = headed(build_batch([(None, b"v" * WRITEBACK_MIN_BYTES)],
                                               timestamp=1))
            assert append_to(scheduler, log, batch, header) is None  # no fsync due by count
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


def test_an_idle_scheduler_waits_for_an_append_then_fsyncs_it(tmp_path: Path) -> None:
    """With nothing appended the periodic round arms no timer (it used to wake twenty
    times a second for nothing: an idle broker's largest cost); the first append after
    a long idle wakes it, and the periodic fsync still covers that append."""
    log = CountingLog(tmp_path / "p", LogConfig())

    async def scenario(loop: CountingLoop) -> None:
        scheduler = FlushScheduler(flush_interval_messages=1 << 60, flush_interval_ms=100)
        scheduler.start()
        await asyncio.sleep(0)  # the periodic round starts: nothing is dirty
        before = loop.wakeups
        await asyncio.sleep(0.5)  # five flush intervals, ten writeback rounds
        assert loop.wakeups - before == 1  # this test's own sleep, nothing else
        batch, header = headed(build_batch([(None, b"v" * 1000)], timestamp=1))
        assert append_to(scheduler, log, batch, header) is None  # no fsync due by count
        for _ in range(1000):  # the periodic fsync, at most a flush interval later
            if log.flushes:
                break
            await asyncio.sleep(0.01)
        assert log.flushes == 1
        await scheduler.stop()

    run_counting(scenario)
    log.close()


def test_small_appends_leave_writeback_to_the_fsync(tmp_path: Path) -> None:
    """A record at a time to many partitions starts no writeback until one of them holds
    ``WRITEBACK_MIN_BYTES`` not yet written back; the periodic fsync covers the rest."""
    logs = [CountingLog(tmp_path / str(i), LogConfig()) for i in range(4)]

    async def scenario() -> None:
        scheduler = FlushScheduler(flush_interval_messages=1 << 60, flush_interval_ms=0)
        scheduler.start()
        for log in logs:
            batch, header = headed(build_batch([(None, b"v" * 1000)], timestamp=1))
            append_to(scheduler, log, batch, header)
        await scheduler._writeback()
        assert [log.writebacks for log in logs] == [0, 0, 0, 0]
        for _ in range(WRITEBACK_MIN_BYTES // 1000 + 1):
            batch, header = headed(build_batch([(None, b"v" * 1000)], timestamp=1))
            append_to(scheduler, logs[0], batch, header)
        await scheduler._writeback()
        assert [log.writebacks for log in logs] == [1, 0, 0, 0]
        await scheduler.stop()
        assert all(log.flushes == 1 for log in logs)  # the stop fsyncs every dirty one

    asyncio.run(scenario())
    for log in logs:
        log.close()


def test_flushes_requested_together_sync_once(tmp_path: Path) -> None:
    """Flushes of many partitions asked for in one turn of the event loop (one produce
    request's partitions under ``flushIntervalMessages=1``) run as one ``flush_together``
    (no fsync of their own); each partition is then durable as its own fsync would make
    it, and one asked for meanwhile waits for the next round."""
    logs = [CountingLog(tmp_path / str(i), LogConfig()) for i in range(FLUSH_TOGETHER_MIN)]

    async def scenario() -> None:
        scheduler = FlushScheduler(flush_interval_messages=1, flush_interval_ms=0)
        waits = []
        for log in logs:
            batch, header = headed(build_batch([(None, b"v" * 100)], timestamp=1))
            wait = append_to(scheduler, log, batch, header)
            assert wait is not None
            waits.append(wait)
        batch, header = headed(build_batch([(None, b"w" * 100)], timestamp=1))
        again = append_to(scheduler, logs[0], batch, header)  # the first round is under way
        assert again is not None and again is not waits[0]
        await asyncio.gather(*waits)
        # one syncfs for all: no fsync of their own (the first's next round may already
        # have run by now, so it is counted after that round)
        assert [log.flushes for log in logs[1:]] == [0] * (len(logs) - 1)
        await again
        assert logs[0].flushes == 1  # only its second round, alone: an fsync of its own
        await scheduler.stop()

    asyncio.run(scenario())
    for i, log in enumerate(logs):  # as after a crash: reopened without a close
        reopened = PartitionLog(tmp_path / str(i), LogConfig())
        assert reopened.next_offset == (2 if i == 0 else 1)
        reopened.close()
        log.close()


class HeldLog(PartitionLog):
    """A partition log whose fsync waits until the test lets it go (a slow disk)."""

    def __init__(self, directory: Path, config: LogConfig) -> None:
        super().__init__(directory, config)
        self.go = threading.Event()

    def flush(self) -> bool:
        self.go.wait(30)
        return super().flush()


def test_a_retry_waits_for_the_fsync_its_batch_waits_for(tmp_path: Path) -> None:
    """With an fsync before each acknowledgement (flushIntervalMessages=1), a retry of a
    batch already appended (a duplicate) is acknowledged only once the fsync covering the
    batch is done: ``pending`` follows the partition's fsync under way or requested."""
    log = HeldLog(tmp_path / "p", LogConfig())

    async def scenario() -> None:
        scheduler = FlushScheduler(flush_interval_messages=1, flush_interval_ms=0)
        assert scheduler.pending(log) is None  # nothing appended
        batch, header = headed(build_batch([(None, b"v")], timestamp=1))
        original = append_to(scheduler, log, batch, header)
        assert original is not None
        retry = scheduler.pending(log)
        assert retry is not None
        await asyncio.sleep(0.2)
        assert not original.done() and not retry.done()  # the fsync is held
        retry.cancel()  # the retry's connection went: the original is not touched
        again = scheduler.pending(log)
        assert again is not None
        log.go.set()
        await asyncio.wait_for(asyncio.gather(original, again), 30)
        assert scheduler.pending(log) is None  # done: nothing pending any more
        await scheduler.stop()

    asyncio.run(scenario())
    log.close()


def test_what_readers_see_follows_the_fsyncs_producers_wait_for(tmp_path: Path) -> None:
    """``high_watermark``: an append no producer waits to be fsynced is visible at once;
    one whose producer waits (the count reached) is not, nor is anything after it, until
    that fsync is done, which wakes the partition's parked fetches. Without a count (the
    default) nothing is ever held."""
    log = HeldLog(tmp_path / "p", LogConfig())
    plain = PartitionLog(tmp_path / "q", LogConfig())

    async def scenario() -> None:
        scheduler = FlushScheduler(flush_interval_messages=2, flush_interval_ms=0)
        batch, header = headed(build_batch([(None, b"v")], timestamp=1))
        assert append_to(scheduler, log, batch, header) is None
        assert scheduler.high_watermark(log) == 1  # below the count: visible at once
        woken = asyncio.ensure_future(scheduler.waiters.wait_any([("t", 0)], 30))
        batch, header = headed(build_batch([(None, b"v")], timestamp=1))
        wait = append_to(scheduler, log, batch, header)
        assert wait is not None  # the count is reached: its producer waits for the fsync
        batch, header = headed(build_batch([(None, b"v")], timestamp=1))
        assert append_to(scheduler, log, batch, header) is None
        assert (log.next_offset, scheduler.high_watermark(log)) == (3, 1)
        for _ in range(20):
            await asyncio.sleep(0)
        assert not woken.done()  # the fsync is held
        log.go.set()
        await asyncio.wait_for(wait, 30)
        assert await woken
        assert scheduler.high_watermark(log) == 3  # the one after was not due an fsync

        default = FlushScheduler(flush_interval_messages=2**63 - 1, flush_interval_ms=0)
        for _ in range(3):
            batch, header = headed(build_batch([(None, b"v")], timestamp=1))
            assert append_to(default, plain, batch, header) is None
            assert default.high_watermark(plain) == plain.next_offset
        assert not default._held
        await scheduler.stop()
        await default.stop()

    asyncio.run(scenario())
    log.close()
    plain.close()


def test_a_producer_cancelled_does_not_cancel_the_others_wait(tmp_path: Path) -> None:
    """Producers whose appends wait for the same fsync round (flushIntervalMessages=1)
    each get a wait of their own: one cancelled (its connection closed while it waited)
    leaves the others to be answered once the fsync is done, not with CancelledError."""

    async def scenario() -> None:
        scheduler = FlushScheduler(1, 0)
        log = PartitionLog(tmp_path / "p", LogConfig())
        first = append_to(scheduler, log, *headed(build_batch([(None, b"a")], timestamp=1)))
        second = append_to(scheduler, log, *headed(build_batch([(None, b"b")], timestamp=1)))
        third = append_to(scheduler, log, *headed(build_batch([(None, b"c")], timestamp=1)))
        assert first is not None and second is not None and third is not None
        waiting = [asyncio.ensure_future(asyncio.wait_for(f, 30))
                   for f in (first, second, third)]
        await asyncio.sleep(0)
        waiting[1].cancel()  # as a closed connection's waiting stage is cancelled
        await waiting[0]  # answered, not CancelledError
        await waiting[2]
        assert waiting[1].cancelled()
        await scheduler.stop()
        log.close()

    asyncio.run(scenario())


def test_a_topics_flush_messages_and_flush_ms_tighten_the_brokers_policy(
        tmp_path: Path) -> None:
    """``flush.messages`` 2 on one topic: its producers wait for an fsync every second
    record, the broker's other partitions not; ``flush.ms`` 0 with no periodic fsync at
    all (``flushIntervalMs`` 0): the partition is fsynced without anyone asking; a
    ``flush.ms`` longer than the broker's interval arms nothing of its own."""
    tight, loose, timed = (CountingLog(tmp_path / name, LogConfig())
                           for name in ("tight", "loose", "timed"))

    async def scenario() -> None:
        scheduler = FlushScheduler(flush_interval_messages=1 << 60, flush_interval_ms=0)
        policy = TopicFlush(messages=2, ms=1 << 62)
        answers = []
        for log, topic in ((tight, policy), (loose, None), (tight, policy)):
            batch, header = headed(build_batch([(None, b"v")], timestamp=1))
            answers.append(append_to(scheduler, log, batch, header, topic))
        assert answers[0] is None and answers[1] is None and answers[2] is not None
        await answers[2]
        assert (tight.flushes, loose.flushes) == (1, 0)
        batch, header = headed(build_batch([(None, b"v")], timestamp=1))
        assert append_to(scheduler, timed, batch, header, TopicFlush(1 << 60, 0)) is None
        for _ in range(1000):  # the timer flush.ms armed fsyncs it, with no one waiting
            if timed.flushes:
                break
            await asyncio.sleep(0.01)
        assert timed.flushes == 1
        later = FlushScheduler(flush_interval_messages=1 << 60, flush_interval_ms=1000)
        batch, header = headed(build_batch([(None, b"v")], timestamp=1))
        append_to(later, loose, batch, header, TopicFlush(1 << 60, 5000))
        assert all(state.due is None for state in later._state.values())
        await scheduler.stop()
        await later.stop()

    asyncio.run(scenario())
    for log in (tight, loose, timed):
        log.close()
