"""The producer state of every partition, loaded on first use and snapshotted as it goes.

A partition's state is rebuilt from its newest snapshot (``producer-state.json`` in the
partition's key-value area) plus the batches written after it. Snapshots are taken at clean
shutdown, right after a rebuild that replayed batches written before this start (so a
crash loop never replays the same tail twice), and, while the broker runs, once a
partition has moved on by ``SNAPSHOT_EVERY_RECORDS`` offsets, ``SNAPSHOT_EVERY_BYTES`` of
log or ``SNAPSHOT_MAX_AGE_S`` seconds: so after ``kill -9`` the rebuild replays at most
that tail, not the whole partition, on the event loop. (With more than
``CHECKED_PER_ROUND`` partitions loaded, a round of checks looks at that many of them in
turn.) Only a rebuild that replays what an earlier run wrote is logged at INFO; a
partition created in this run says nothing.

A snapshot only ever names an offset whose batches are already fsynced: it is encoded at
offset *O*, the partition is fsynced (covering *O*), and only then is the file replaced.
So whatever a crash or a power loss leaves of the log still holds every batch below the
snapshot's offset, and replaying from there is exact. A snapshot that is unreadable, or
outside ``[log start, next offset]``, is ignored and the partition replayed from its start;
so one that retention or DeleteRecords left below the log start (an idle partition emptied
by ``retention.ms`` has its log start moved to its end) is due again at once, and the
producers' idempotence state, kept in memory meanwhile, survives a restart.

Producers idle past the expiration are dropped from every loaded partition by
:meth:`ProducerStates.expire` (run by the engine every
``producerIdExpirationCheckIntervalMs``), and from a partition's state as it is loaded;
a partition that lost some gets a fresh snapshot at the next checkpoint.

The log cleaner removes the records of aborted transactions and, later, their markers:
each state's ``cleaned_below`` (below it no aborted record is left, and no aborted
transaction is listed) is read from the cleaner's checkpoint when the state is loaded, and
raised by :meth:`ProducerStates.cleaned` from the cleaner's thread after each cleaning,
under a lock that a load also takes, so no interleaving leaves a loaded state behind.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from itertools import islice

from broker_core.compaction.cleaning import Checkpoint
from broker_core.partition_producers import (
    DEFAULT_EXPIRATION_MS,
    RESUME_GRACE_S,
    PartitionProducers,
    Snapshot,
)
from broker_core.storage import (
    OffsetOutOfRange,
    PartitionStore,
    StorageError,
    commit_generation,
    group_committed,
)
from broker_core.storage_faults import WriteFaults, WriteKind

log = logging.getLogger(__name__)

SNAPSHOT_KEY = "producer-state.json"
"""The snapshot's key in the partition's key-value area (a file in its directory)."""
SNAPSHOT_FILE = SNAPSHOT_KEY
SNAPSHOT_EVERY_RECORDS = 50_000
"""A partition this many offsets past its last snapshot gets a new one."""
SNAPSHOT_EVERY_BYTES = 16 << 20
"""A partition whose log grew this many bytes past its last snapshot gets a new one."""
SNAPSHOT_MAX_AGE_S = 30.0
"""A partition that moved at all gets a new snapshot after this long."""
_RESUMED_KEPT = 1024
"""Notes of :meth:`ProducerStates.resume` kept at least before those past their grace are
dropped (then again at twice what a pruning kept, so that each costs little per note)."""
CHECKED_PER_ROUND = 1024
"""Loaded partitions a checkpoint looks at, in turn: with 10,000 of them, each is looked
at every tenth round, and a round holds the event loop for a thousand checks (and at most
as many snapshots to encode), not ten thousand."""

Flush = Callable[[PartitionStore], Awaitable[None]]


@dataclass(slots=True)
class _Loaded:
    partition: PartitionStore
    state: PartitionProducers
    saved_offset: int | None  # offset of the snapshot on disk; None: there is none
    saved_at: float  # time.monotonic() of that snapshot (or of the load)
    saved_size: int  # the log's size in bytes at that snapshot (or at the load)
    generation: int  # the partition's commit generation when the state was loaded
    expired: bool = False  # producers were forgotten since that snapshot
    replayed: bool = False  # the load replayed batches of an earlier run

    def current(self) -> bool:
        """Whether the partition's commit generation is still the one the state was
        loaded at (else a write to it failed, or it moved, since: the state may count a
        failed batch as stored, at an offset a later batch took; never snapshot it, the
        next use rebuilds it)."""
        return self.generation == commit_generation(self.partition)

    def due(self, now: float) -> bool:
        offset = self.partition.next_offset
        if self.expired or self.replayed:
            return True
        if self.saved_offset is None:  # a rebuild would replay the whole partition
            return offset > self.partition.log_start_offset
        if self.saved_offset < self.partition.log_start_offset:
            return True  # a rebuild would ignore it (retention or DeleteRecords passed it)
        moved = offset - self.saved_offset
        return moved >= SNAPSHOT_EVERY_RECORDS or (
            moved != 0 and (now - self.saved_at >= SNAPSHOT_MAX_AGE_S
                            or self.partition.size_bytes - self.saved_size
                            >= SNAPSHOT_EVERY_BYTES))


class ProducerStates:
    """Producer state of every partition, rebuilt on first use."""

    def __init__(self, expiration_ms: int = DEFAULT_EXPIRATION_MS,
                 faults: WriteFaults | None = None) -> None:
        self.expiration_ms = expiration_ms
        self.faults = faults if faults is not None else WriteFaults()
        self._states: dict[tuple[str, int], _Loaded] = {}
        self._cleaned: dict[tuple[str, int], tuple[PartitionStore, int]] = {}
        """The latest checkpoint the log cleaner reported for a partition (its store)."""
        self._cleaned_lock = threading.Lock()
        self._turn = 0  # where the next checkpoint's look at the loaded partitions starts
        self._resumed: dict[tuple[str, int], float] = {}
        """When a partition last refused a produce as not its leader or failed an append
        (:meth:`resume`), while that matters (``RESUME_GRACE_S``)."""
        self._prune_at = _RESUMED_KEPT

    def get(self, topic: str, index: int, partition: PartitionStore) -> PartitionProducers:
        """The state of a partition, loading it from snapshot and log when needed: on
        first use, and once an append failed after it was judged against the state
        (its commit generation moved on: what the log holds is read again)."""
        if self.loaded(topic, index, partition):
            return self._states[(topic, index)].state
        stale = self._states.get((topic, index))
        if stale is not None and stale.partition is partition:  # an append to it failed
            self.resume(topic, index)
        loaded = _load(partition, commit_generation(partition))
        loaded.state.resumed_at = self._resumed.get((topic, index))
        loaded.expired = loaded.state.expire(_now_ms(), self.expiration_ms) > 0
        with self._cleaned_lock:
            reported = self._cleaned.get((topic, index))
            if reported is not None and reported[0] is partition:
                loaded.state.cleaned_below = max(loaded.state.cleaned_below, reported[1])
            self._states[(topic, index)] = loaded
        return loaded.state

    def loaded(self, topic: str, index: int, partition: PartitionStore) -> bool:
        """Whether :meth:`get` would answer without loading."""
        known = self._states.get((topic, index))
        return known is not None and known.partition is partition and known.current()

    def cleaned(self, topic: str, index: int, partition: PartitionStore, offset: int) -> None:
        """The log cleaner saved its checkpoint ``offset`` for a partition (called from the
        cleaner's thread): aborted transactions below it are listed no more."""
        with self._cleaned_lock:
            self._cleaned[(topic, index)] = (partition, offset)
            loaded = self._states.get((topic, index))
            if loaded is not None and loaded.partition is partition:
                loaded.state.cleaned_below = max(loaded.state.cleaned_below, offset)

    def expire(self) -> int:
        """Forget the producers of every loaded partition that have been idle for the
        expiration or longer (open transactions keep theirs); return how many."""
        now = _now_ms()
        forgotten = 0
        for loaded in self._states.values():
            count = loaded.state.expire(now, self.expiration_ms)
            if count:
                loaded.expired = True
                forgotten += count
        if forgotten:
            log.info("forgot %d producer id(s) idle for %d ms or more", forgotten,
                     self.expiration_ms)
        return forgotten

    def producer_count(self) -> int:
        """Producer ids remembered, summed over the loaded partitions (safe to call from
        another thread, such as the metrics endpoint's: the partitions are copied first)."""
        return sum(len(loaded.state.producers) for loaded in list(self._states.values()))

    def resume(self, topic: str, index: int) -> None:
        """The partition refused a produce as not its leader, or an append to it failed:
        for ``RESUME_GRACE_S`` its producers' batches that skip sequences are taken for
        ones whose predecessor is to come again (``partition_producers``)."""
        now = time.monotonic()
        if len(self._resumed) >= self._prune_at:  # past twice what the last pruning kept
            self._resumed = {key: at for key, at in self._resumed.items()
                             if now - at < RESUME_GRACE_S}
            self._prune_at = max(_RESUMED_KEPT, 2 * len(self._resumed))
        self._resumed[(topic, index)] = now
        known = self._states.get((topic, index))
        if known is not None:
            known.state.resumed_at = now

    def invalidate(self, topic: str, index: int) -> None:
        """Drop one partition's state, to be rebuilt from snapshot and log on next use: an
        append failed and may have been stored in part, or the partition moved between
        brokers, so memory can no longer say which batches are in the log."""
        self._states.pop((topic, index), None)

    def forget(self, topic: str) -> None:
        """Drop the states of a deleted topic."""
        for key in [k for k in self._states if k[0] == topic]:
            del self._states[key]
        for key in [k for k in self._resumed if k[0] == topic]:
            del self._resumed[key]
        with self._cleaned_lock:
            for key in [k for k in self._cleaned if k[0] == topic]:
                del self._cleaned[key]

    async def checkpoint(self, flush: Flush) -> int:
        """Snapshot every loaded partition that is due (see the module docstring; of
        many, those :meth:`_in_turn`); return
        how many snapshots were written. ``flush`` fsyncs a partition's appends so far: the
        due partitions' flushes are asked for at once (the flush policy runs them as one
        group: 10,000 partitions an idempotent producer wrote to cost a syncfs, not 10,000
        fsyncs one after the other) and their snapshots written in one worker-thread job."""
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        due: list[tuple[tuple[str, int], _Loaded, int, Snapshot]] = []
        for key, loaded in self._in_turn():
            partition = loaded.partition
            offset = partition.next_offset  # before the check: stored below it at that time
            if not loaded.current():
                del self._states[key]
                continue
            if not loaded.due(now):
                continue
            loaded.state.forget_aborted_before(partition.log_start_offset)
            due.append((key, loaded, offset, loaded.state.to_json(offset)))
        if not due:
            return 0
        flushed = await asyncio.gather(*[flush(loaded.partition) for _, loaded, _, _ in due],
                                       return_exceptions=True)
        fsynced = []
        for item, outcome in zip(due, flushed, strict=True):
            if isinstance(outcome, OSError | StorageError):
                log.debug("no producer snapshot of %s: %s", item[1].partition.location, outcome)
            elif isinstance(outcome, BaseException):
                raise outcome
            elif self._states.get(item[0]) is item[1]:  # not deleted (or replaced) meanwhile
                fsynced.append(item)
        if not fsynced:
            return 0
        # the store refuses once the partition is closed (deleted): a topic created again
        # meanwhile under the same name must not receive this snapshot
        outcomes = await loop.run_in_executor(
            None, _write_all, [(loaded.partition, document) for _, loaded, _, document in fsynced])
        written = 0
        for (_, loaded, offset, _), outcome in zip(fsynced, outcomes, strict=True):
            partition = loaded.partition
            if isinstance(outcome, StorageError):
                log.debug("no producer snapshot of %s: %s", partition.location, outcome)
                continue
            if isinstance(outcome, OSError):  # logged once per cause; the next round retries
                self.faults.failed(outcome, f"the producer snapshot of {partition.location}",
                                   WriteKind.SNAPSHOTS)
                continue
            self.faults.succeeded(WriteKind.SNAPSHOTS)
            loaded.saved_offset, loaded.saved_at = offset, time.monotonic()
            loaded.saved_size = partition.size_bytes
            loaded.expired = loaded.replayed = False  # expire() runs in this task only
            written += 1
        return written

    def _in_turn(self) -> list[tuple[tuple[str, int], _Loaded]]:
        """The loaded partitions this checkpoint looks at: all of them, or the next
        ``CHECKED_PER_ROUND`` in turn."""
        count = len(self._states)
        if count <= CHECKED_PER_ROUND:
            return list(self._states.items())
        start = self._turn % count
        end = self._turn = start + CHECKED_PER_ROUND
        # islice skips without a tuple each (a copy of them all costs collections too)
        return [*islice(self._states.items(), start, end),
                *islice(self._states.items(), max(end - count, 0))]

    def save(self) -> str | None:
        """Snapshot every loaded partition at shutdown (after the final fsync); one that
        cannot be written (a full disk) does not stop the others. Returns what failed, in
        one line, or None."""
        failed: list[tuple[PartitionStore, OSError]] = []
        for loaded in self._states.values():
            partition = loaded.partition
            offset = partition.next_offset
            if not loaded.current():
                continue
            loaded.state.forget_aborted_before(partition.log_start_offset)
            try:
                _write(partition, loaded.state.to_json(offset))
            except StorageError:
                continue  # a deleted partition
            except OSError as exc:
                failed.append((partition, exc))
        if not failed:
            return None
        first, error = failed[0]
        return (f"{len(failed)} of {len(self._states)} producer snapshot(s) not written "
                f"(first: {first.location}: {error}); those partitions replay more at the "
                "next start")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _write(partition: PartitionStore, document: Snapshot) -> None:
    """Replace the partition's snapshot. No fsync: a snapshot the disk lost or cut short is
    unreadable or older, and either way only makes the next rebuild replay more."""
    data = json.dumps(document, separators=(",", ":")).encode()
    partition.state.put(SNAPSHOT_KEY, data, durable=False)


def _write_all(snapshots: list[tuple[PartitionStore, Snapshot]]
               ) -> list[OSError | StorageError | None]:
    """:func:`_write` each; each one's error, or None."""
    outcomes: list[OSError | StorageError | None] = []
    for partition, document in snapshots:
        try:
            _write(partition, document)
        except (OSError, StorageError) as exc:
            outcomes.append(exc)
        else:
            outcomes.append(None)
    return outcomes


def _read(partition: PartitionStore) -> tuple[PartitionProducers, int] | None:
    """The snapshot's state and offset when it is usable for ``partition``, else None."""
    path = f"{partition.location}/{SNAPSHOT_KEY}"
    try:
        stored = partition.state.get(SNAPSHOT_KEY)
        if stored is None:
            return None
        document = json.loads(stored)
        offset = document["offset"]
        if not partition.log_start_offset <= offset <= partition.next_offset:
            log.info("%s: producer snapshot at %d is outside the log [%d, %d]; replaying "
                     "the whole partition", path, offset, partition.log_start_offset,
                     partition.next_offset)
            return None
        return PartitionProducers.from_json(document), int(offset)
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        log.warning("%s: ignoring unreadable producer snapshot: %s", path, exc)
        return None


def _load(partition: PartitionStore, generation: int) -> _Loaded:
    if group_committed(partition):  # the state counts the appends under way
        partition.settle()
    snapshot = _read(partition)
    state, saved = snapshot if snapshot is not None else (PartitionProducers(), None)
    state.cleaned_below = Checkpoint.load(partition).offset
    offset = saved if saved is not None else partition.log_start_offset
    replayed = earlier = 0  # batches replayed; of them, written before this start
    while offset < partition.next_offset:
        try:
            for info in partition.headers_from(offset):
                state.apply(info)
                replayed += 1
                earlier += info.base_offset < partition.opened_next_offset
                offset = info.last_offset + 1
        except OffsetOutOfRange:
            pass  # a drop passed the offset first
        start = partition.log_start_offset
        if offset >= start:
            break  # the end reached (the reader follows appends), or the partition closed
        offset = start  # a drop (in another thread) overtook the replay: on from there
    if replayed:
        log.log(logging.INFO if earlier else logging.DEBUG,
                "%s: producer state rebuilt from %s, %d batch(es) replayed",
                partition.location,
                f"the snapshot at offset {saved}" if saved is not None else "the log start",
                replayed)
    return _Loaded(partition, state, saved, time.monotonic(), partition.size_bytes,
                   generation, replayed=earlier > 0)
