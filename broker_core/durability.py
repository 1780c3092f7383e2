"""When appended data is fsynced: the ``flushIntervalMessages`` / ``flushIntervalMs`` policy.

An append is written to the ledger file before it is acknowledged, so a crash of the
broker process never loses an acknowledged record. Power loss is covered by fsync: a
partition is fsynced once ``flush_interval_messages`` records are unflushed (and the
producers of those records wait for that fsync before they are answered), and every dirty
partition is fsynced at least every ``flush_interval_ms``. Concurrent producers that
need the same partition fsynced share one fsync, and the fsyncs requested in one turn of
the event loop (the partitions of one produce request, of a periodic round) run together:
from ``FLUSH_TOGETHER_MIN`` partitions on as one ``syncfs`` in one worker-thread job. A
failed fsync takes the partition offline until restart (``PartitionStore.offline``): its
waiting producers get a storage error.

What readers see follows the fsyncs a producer waits for (``high_watermark``): an append
whose acknowledgement waits for an fsync (its partition reached ``flush_interval_messages``)
is not visible to Fetch and ListOffsets before that fsync is done, nor is anything appended
after it; parked fetches are woken once it is. So a consumer never reads an offset a power
loss can take back and give to another record, as in Kafka, whose ``flush.messages`` flushes
before the high watermark moves. Appends no producer waits for (below the count, or the
default, no count at all) are visible at once: the high watermark is then the written end,
and nothing is held, looked up or woken later.

A topic can tighten the policy for its partitions (``TopicFlush``): its ``flush.messages``
takes the place of ``flush_interval_messages``, and a ``flush.ms`` shorter than
``flush_interval_ms`` (or any, when that is 0) fsyncs a partition within that time of an
append, by a timer the first unflushed append arms. A longer ``flush.ms`` changes nothing:
the periodic fsync still takes the partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from broker_core import metrics
from broker_core.storage import PartitionStore, flush_together
from broker_core.storage.partition_flush import FLUSH_TOGETHER_MIN
from broker_core.storage_faults import WriteFaults, WriteKind
from broker_core.waiters import AppendWaiters, TopicPartition

log = logging.getLogger(__name__)


WRITEBACK_INTERVAL_MS = 50
WRITEBACK_MIN_BYTES = 64 * 1024
"""A partition's writeback is started once this much was appended since the last: what is
less is left to the kernel and the next fsync (10,000 partitions taking a record each
cost a job per partition and round otherwise, for nothing the fsync would miss)."""


@dataclass(frozen=True, slots=True)
class TopicFlush:
    """A topic's own flush policy: its ``flush.messages`` and ``flush.ms``."""

    messages: int
    """fsync once this many records are unflushed (their producers wait for it)."""
    ms: int
    """fsync within this many ms of an append, when sooner than the periodic fsync."""


@dataclass(slots=True)
class _PartitionState:
    unflushed: int = 0
    unwritten_bytes: int = 0
    running: asyncio.Future[None] | None = None
    next_round: asyncio.Future[None] | None = None
    due: asyncio.TimerHandle | None = None
    """The fsync a topic's ``flush.ms`` armed, not run yet."""


@dataclass(slots=True)
class _Hold:
    """A partition whose readers see less than is written: offsets below ``end`` only,
    until the fsyncs its waiting producers asked for are done."""

    end: int
    key: TopicPartition
    """Whose parked fetches to wake when ``end`` moves."""


class FlushScheduler:
    """Counts unflushed records per partition and runs grouped fsyncs in a worker thread."""

    def __init__(self, flush_interval_messages: int, flush_interval_ms: int,
                 faults: WriteFaults | None = None,
                 waiters: AppendWaiters | None = None) -> None:
        self.flush_interval_messages = flush_interval_messages
        self.flush_interval_ms = flush_interval_ms
        self.faults = faults if faults is not None else WriteFaults()
        self.waiters = waiters if waiters is not None else AppendWaiters()
        """The parked fetches, woken when what they may read grows."""
        self._state: dict[int, _PartitionState] = {}
        self._held: dict[int, _Hold] = {}
        """Partitions with an append that is not visible before its fsync (empty unless
        ``flush_interval_messages`` is reached: the default never holds one)."""
        self._logs: dict[int, PartitionStore] = {}
        self._unwritten: set[int] = set()
        """Partitions with ``WRITEBACK_MIN_BYTES`` appended since their last writeback (a
        set, not a flag per partition: a round with 10,000 partitions must not walk them
        all)."""
        self._dirty: set[int] = set()
        """Partitions appended to since the periodic flush last took them (some may have
        been fsynced since, by a count or a snapshot): what it looks at, not all of them."""
        self._timer: asyncio.Task[None] | None = None
        self._idle: asyncio.Future[None] | None = None
        """Set while the periodic round waits for an append (nothing dirty, nothing to
        write back): resolved by the next :meth:`appended`."""
        self._queued: list[tuple[PartitionStore, _PartitionState]] = []
        """Flushes requested in this turn of the event loop, started together at its end."""
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        """Start the periodic flush (no-op when ``flush_interval_ms`` is 0: only counts apply)."""
        if self.flush_interval_ms > 0 and self._timer is None:
            self._timer = asyncio.get_running_loop().create_task(self._periodic())

    async def stop(self) -> None:
        """Stop the periodic flush and fsync whatever is still dirty."""
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
            self._timer = None
        await self.flush_dirty()

    def forget(self, partition: PartitionStore) -> None:
        """Drop a partition that is being deleted."""
        state = self._state.pop(id(partition), None)
        if state is not None and state.due is not None:
            state.due.cancel()
        self._logs.pop(id(partition), None)
        self._unwritten.discard(id(partition))
        self._dirty.discard(id(partition))
        self._held.pop(id(partition), None)

    def high_watermark(self, partition: PartitionStore) -> int:
        """The end of what readers may see of ``partition``: its next offset, but for the
        appends that wait for an fsync not done yet (and those after them)."""
        held = self.held_from(partition)
        return partition.next_offset if held is None else held

    def held_from(self, partition: object) -> int | None:
        """The first offset of ``partition`` held from readers (an append waiting for its
        fsync, and everything after it), or None when nothing is held."""
        if self._held:
            hold = self._held.get(id(partition))
            if hold is not None:
                return hold.end
        return None

    def appended(self, partition: PartitionStore, name: TopicPartition, base: int,
                 records: int, size: int,
                 topic: TopicFlush | None = None) -> asyncio.Future[None] | None:
        """Record an append of ``records`` in ``size`` bytes at offset ``base`` of
        ``partition`` (topic-partition ``name``, whose topic's own policy is ``topic``:
        None, the broker's); return a future to await before acknowledging, if one is
        due. The append is then not visible (nor anything after it) until that fsync is
        done, which wakes the partition's parked fetches: the caller wakes them only when
        this returns None."""
        key = id(partition)
        state = self._state.get(key)
        if state is None:
            state = self._state[key] = _PartitionState()
            self._logs[key] = partition
        state.unflushed += records
        state.unwritten_bytes += size
        self._dirty.add(key)
        if self._idle is not None:
            self._wake_periodic()
        if state.unwritten_bytes >= WRITEBACK_MIN_BYTES:
            state.unwritten_bytes = 0
            self._unwritten.add(key)
        if topic is not None and state.due is None and self._sooner(topic.ms):
            state.due = asyncio.get_running_loop().call_later(
                topic.ms / 1000, self._flush_due, key)
        limit = self.flush_interval_messages if topic is None else topic.messages
        if state.unflushed >= limit:
            if key not in self._held:
                self._held[key] = _Hold(base, name)
            return self._request_flush(partition, state)
        return None

    def _sooner(self, flush_ms: int) -> bool:
        """Whether a topic's ``flush.ms`` asks for an fsync sooner than the periodic one."""
        return self.flush_interval_ms == 0 or flush_ms < self.flush_interval_ms

    def _flush_due(self, key: int) -> None:
        """A topic's ``flush.ms`` is up for partition ``key``: fsync what it has unflushed
        (a failure is noted as the periodic fsync's are)."""
        state = self._state.get(key)
        if state is None:
            return
        state.due = None
        task = asyncio.get_running_loop().create_task(self._flush_keys({key}))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def flush(self, partition: PartitionStore) -> asyncio.Future[None]:
        """fsync everything appended to ``partition`` so far (sharing a running fsync's
        next round, as producers do)."""
        key = id(partition)
        state = self._state.get(key)
        if state is None:
            state = self._state[key] = _PartitionState()
            self._logs[key] = partition
        return self._request_flush(partition, state)

    def pending(self, partition: PartitionStore) -> asyncio.Future[None] | None:
        """The partition's fsync under way or requested, as a future of its own (the
        caller may cancel it): what covers everything appended to it so far and due to be
        fsynced. None: nothing pending."""
        state = self._state.get(id(partition))
        source = None if state is None else (state.next_round or state.running)
        return None if source is None else _own(source)

    def _request_flush(self, partition: PartitionStore,
                       state: _PartitionState) -> asyncio.Future[None]:
        """The fsync round that covers what was appended so far, as a future of the
        caller's own: the producers of a round share it, and a waiting producer cancelled
        (its connection closed) must not cancel the others' wait."""
        return _own(self._round(partition, state))

    def _round(self, partition: PartitionStore,
               state: _PartitionState) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        if state.running is None:
            state.unflushed = 0
            state.unwritten_bytes = 0
            running = state.running = loop.create_future()
            running.add_done_callback(_retrieve)  # a periodic flush has no one awaiting it
            if not self._queued:
                loop.call_soon(self._start_queued)
            self._queued.append((partition, state))
            return running
        # A flush is running and may have missed this append: wait for the following one.
        if state.next_round is None:
            state.next_round = loop.create_future()
        return state.next_round

    def _start_queued(self) -> None:
        """Start the flushes requested in one turn of the event loop (a produce request's
        partitions, other connections' meanwhile, a periodic round): from
        ``FLUSH_TOGETHER_MIN`` partitions on in one worker-thread job (``flush_together``:
        one ``syncfs``), fewer each in a job of its own (they run side by side)."""
        queued, self._queued = self._queued, []
        groups = [queued] if len(queued) >= FLUSH_TOGETHER_MIN else [[item] for item in queued]
        loop = asyncio.get_running_loop()
        for group in groups:
            task = loop.create_task(self._flush_group(group))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _flush_group(self, group: list[tuple[PartitionStore, _PartitionState]],
                           shared: asyncio.Future[None] | None = None) -> None:
        """Flush ``group`` in one job; settle each partition's flush with its own outcome,
        or, for those whose flush is ``shared`` (a periodic round's), that future with the
        first failure (the others are noted here)."""
        outcomes: list[bool | BaseException]
        # what the fsync covers at least: every append so far is written (on this loop)
        ends = [partition.next_offset for partition, _ in group] if self._held else None
        try:
            started = time.perf_counter()
            flushed = await asyncio.get_running_loop().run_in_executor(
                None, flush_together, [partition for partition, _ in group])
            metrics.FSYNC.observe(time.perf_counter() - started)
            outcomes = list(flushed)
        except BaseException as exc:  # cancelled (the loop is closing), or unexpected
            outcomes = [exc] * len(group)
        failures: list[BaseException] = []
        for at, ((partition, state), outcome) in enumerate(zip(group, outcomes, strict=True)):
            running = state.running
            if ends is not None and not isinstance(outcome, BaseException):
                self._reveal(partition, state, ends[at])
            self._settled(partition, state)
            if outcome is True:
                self.faults.succeeded(WriteKind.CHECKPOINTS)
            if running is shared:
                if isinstance(outcome, BaseException):
                    failures.append(outcome)
            elif running is not None and not running.done():
                _settle(running, outcome)
        if shared is not None and not shared.done():
            for failure in failures[1:]:
                if isinstance(failure, OSError):
                    self.faults.failed(failure, "a partition's fsync or metadata",
                                       WriteKind.CHECKPOINTS)
            _settle(shared, failures[0] if failures else False)
        if outcomes and isinstance(outcomes[0], asyncio.CancelledError):
            raise outcomes[0]

    def _reveal(self, partition: PartitionStore, state: _PartitionState, durable: int) -> None:
        """``partition`` is fsynced up to ``durable`` at least: let its readers see that
        far, or everything written if no producer waits for a later fsync (the appends
        since were not due one), and wake its parked fetches. A failed fsync reveals
        nothing: the partition is offline."""
        hold = self._held.get(id(partition))
        if hold is None:
            return
        if state.next_round is None:
            del self._held[id(partition)]
        elif durable > hold.end:
            hold.end = durable
        else:
            return
        self.waiters.notify(hold.key)

    def _settled(self, partition: PartitionStore, state: _PartitionState) -> None:
        """A partition's fsync is over: start the round its waiting producers asked for."""
        state.running = None
        follower = state.next_round
        state.next_round = None
        if follower is not None:
            chained = self._round(partition, state)
            chained.add_done_callback(lambda done: _copy_outcome(done, follower))

    async def flush_dirty(self) -> None:
        """fsync every partition with unflushed records: those with no fsync running
        together (one worker-thread job; from ``FLUSH_TOGETHER_MIN`` of them on, one
        ``syncfs`` instead of an fsync each: 10,000 dirty partitions cost about one fsync
        and one job, not 10,000 of each, and one future, not one each), the others in their
        running fsync's next round."""
        keys, self._dirty = self._dirty, set()
        try:
            await self._flush_keys(keys)
        except BaseException:  # cancelled by stop(): its own round looks at them again
            self._dirty |= keys
            raise

    async def _flush_keys(self, keys: set[int]) -> None:
        """:meth:`flush_dirty` of the partitions ``keys`` (those still unflushed)."""
        dirty = [(self._logs[key], state) for key in keys
                 if (state := self._state.get(key)) is not None and state.unflushed > 0]
        pending = [self._request_flush(partition, state)
                   for partition, state in dirty if state.running is not None]
        free = [(partition, state) for partition, state in dirty if state.running is None]
        if free:
            shared: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            shared.add_done_callback(_retrieve)  # this round may be cancelled (a stop)
            for _, state in free:
                state.unflushed = 0
                state.unwritten_bytes = 0
                state.running = shared
            task = asyncio.get_running_loop().create_task(self._flush_group(free, shared))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            pending.append(shared)
        if pending:
            results = await asyncio.gather(*pending, return_exceptions=True)
            for result in results:
                if isinstance(result, OSError):
                    self.faults.failed(result, "a partition's fsync or metadata",
                                       WriteKind.CHECKPOINTS)
                elif isinstance(result, BaseException):
                    log.error("periodic fsync failed: %s", result)

    def _wake_periodic(self) -> None:
        idle, self._idle = self._idle, None
        if idle is not None and not idle.done():
            idle.set_result(None)

    async def _periodic(self) -> None:
        """Start the writeback every ``WRITEBACK_INTERVAL_MS`` and fsync what is dirty every
        ``flush_interval_ms``; with nothing dirty, wait for the next append instead of
        waking for nothing (an idle broker), then fsync it within ``flush_interval_ms``."""
        loop = asyncio.get_running_loop()
        interval = self.flush_interval_ms / 1000
        next_flush = loop.time() + interval
        while True:
            if not self._dirty and not self._unwritten:
                self._idle = loop.create_future()
                try:
                    await self._idle
                finally:
                    self._idle = None
                if next_flush <= loop.time():  # parked past it: a full interval from now
                    next_flush = loop.time() + interval
            await asyncio.sleep(min(WRITEBACK_INTERVAL_MS / 1000,
                                    max(next_flush - loop.time(), 0)))
            if loop.time() >= next_flush:
                next_flush = loop.time() + interval
                await self.flush_dirty()
            else:
                await self._writeback()

    async def _writeback(self) -> None:
        """Start the kernel writing out every partition appended to since the last round."""
        keys, self._unwritten = self._unwritten, set()
        due = [self._logs[key] for key in keys if key in self._logs]
        if due:
            await asyncio.get_running_loop().run_in_executor(None, _start_writeback, due)


def _start_writeback(partitions: list[PartitionStore]) -> None:
    for partition in partitions:
        try:
            partition.start_writeback()
        except OSError as exc:  # only an optimisation: the periodic fsync still runs
            log.debug("writeback of %s failed: %s", partition, exc)


def _copy_outcome(source: asyncio.Future[None], target: asyncio.Future[None]) -> None:
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif (error := source.exception()) is not None:
        target.set_exception(error)
    else:
        target.set_result(None)


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


def _settle(future: asyncio.Future[None], outcome: bool | BaseException) -> None:
    """Settle a flush's future with its outcome (whether it checkpointed, or its error)."""
    if isinstance(outcome, asyncio.CancelledError):
        future.cancel()
    elif isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(None)


def _own(source: asyncio.Future[None]) -> asyncio.Future[None]:
    """A future of its own that ends as ``source`` does (cancelling it leaves ``source``
    alone)."""
    follower: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    follower.add_done_callback(_retrieve)
    source.add_done_callback(lambda done: _copy_outcome(done, follower))
    return follower
