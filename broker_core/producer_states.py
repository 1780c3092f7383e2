"""The producer state of every partition, loaded on first use and snapshotted as it goes.

A partition's state is rebuilt from its newest snapshot (``producer-state.json`` in the
partition's key-value area) plus the batches written after it. Snapshots are taken at clean
shutdown, right after a rebuild that replayed batches written before this start (so a
crash loop never replays the same tail twice), and, while the broker runs, once a
partition has moved on by ``SNAPSHOT_EVERY_RECORDS`` offsets, ``SNAPSHOT_EVERY_BYTES`` of
log or ``SNAPSHOT_MAX_AGE_S`` seconds: so after ``kill -9`` the rebuild replays at most
that tail, not the whole partition. (With more than ``CHECKED_PER_ROUND`` partitions
loaded, a round of checks looks at that many of them in turn.) Only a rebuild that replays what
an earlier run wrote is logged at INFO; a partition created in this run says nothing.

A snapshot only ever names an offset whose batches are already fsynced: it is encoded at
offset *O*, the partition is fsynced (covering *O*), and only then is the file replaced.
So whatever a crash or a power loss leaves of the log still holds every batch below the
snapshot's offset, and replaying from there is exact. A snapshot that is unreadable, or
outside ``[log start, next offset]``, is ignored and the partition replayed from its start.

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
import contextlib
import functools
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice

from broker_core.compaction.cleaning import Checkpoint
from broker_core.partition_producers import PartitionProducers, Snapshot
from broker_core.storage import PartitionStore, StorageError
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
LOAD_THREADS = 2
"""Threads reading producer states (:meth:`ProducerStates.load`)."""
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
    expired: bool = False  # producers were forgotten since that snapshot
    replayed: bool = False  # the load replayed batches of an earlier run

    def due(self, now: float) -> bool:
        offset = self.partition.next_offset
        if self.expired or self.replayed:
            return True
        if self.saved_offset is None:  # a rebuild would replay the whole partition
            return offset > self.partition.log_start_offset
        moved = offset - self.saved_offset
        return moved >= SNAPSHOT_EVERY_RECORDS or (
            moved != 0 and (now - self.saved_at >= SNAPSHOT_MAX_AGE_S
                            or self.partition.size_bytes - self.saved_size
                            >= SNAPSHOT_EVERY_BYTES))


DEFAULT_EXPIRATION_MS = 86_400_000
"""Kafka's ``producer.id.expiration.ms``: one day."""


_Pending = tuple[PartitionStore, asyncio.Future[tuple[_Loaded, int]]]
"""A load under way: the partition store it reads, and the read's outcome."""


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
        self._loading: dict[tuple[str, int], _Pending] = {}
        """The loads under way in worker threads (:meth:`load`), by partition."""
        self._readers = ThreadPoolExecutor(max_workers=LOAD_THREADS,
                                           thread_name_prefix="producer-state")
        """Threads of their own: a request's thousand loads never queue the fsyncs of the
        default executor."""

    def get(self, topic: str, index: int, partition: PartitionStore) -> PartitionProducers:
        """The state of a partition, loading it from snapshot and log when needed (on the
        caller's thread: :meth:`load` first keeps that off the event loop)."""
        known = self._states.get((topic, index))
        if known is not None and known.partition is partition:
            return known.state
        return self._install((topic, index), _load(partition)[0])

    def loaded(self, topic: str, index: int, partition: PartitionStore) -> bool:
        """Whether :meth:`get` has the partition's state at hand (no load)."""
        known = self._states.get((topic, index))
        return known is not None and known.partition is partition

    async def load(self, topic: str, index: int, partition: PartitionStore) -> None:
        """Load a partition's state unless it is loaded: the snapshot, and the log up to
        its end as the load began, read in a worker thread (a snapshot and a log replay
        are reads of files or database round trips, which the event loop must not wait
        for: a thousand partitions moved to this broker, or an idempotent producer's first
        batch to each of ten thousand); then, on the loop, the batches appended since.
        Loads of one partition at once share one read. A load that fails, or that an
        :meth:`invalidate` overtook, installs nothing: :meth:`get` loads it then, and says
        why."""
        pending = self.prefetch(topic, index, partition)
        if pending is not None:
            with contextlib.suppress(Exception):  # get() loads again, and raises it
                await asyncio.shield(pending[1])

    def prefetch(self, topic: str, index: int, partition: PartitionStore) -> _Pending | None:
        """Start loading a partition's state in a worker thread, unless it is loaded
        (None) or being loaded; the load under way. Once read, it is installed on the
        loop (:meth:`_read_done`) whether or not anyone waits for it, before the waiters
        resume."""
        key = (topic, index)
        if self.loaded(topic, index, partition):
            self._loading.pop(key, None)
            return None
        pending = self._loading.get(key)
        if pending is None or pending[0] is not partition:
            future = asyncio.get_running_loop().run_in_executor(
                self._readers, _load, partition, partition.next_offset)
            pending = self._loading[key] = (partition, future)
            future.add_done_callback(functools.partial(self._read_done, key, pending))
        return pending

    def _read_done(self, key: tuple[str, int], pending: _Pending,
                   future: asyncio.Future[tuple[_Loaded, int]]) -> None:
        """A load's read ended (on the loop): replay what was appended meanwhile and
        install it, unless it failed, was invalidated or replaced meanwhile, or the state
        was loaded otherwise (:meth:`get`)."""
        failed = future.cancelled() or future.exception() is not None
        if self._loading.get(key) is not pending:
            return
        del self._loading[key]
        partition = pending[0]
        if failed or self.loaded(key[0], key[1], partition):
            return
        loaded, reached = future.result()
        try:
            _replay(loaded, partition, reached)
        except Exception:  # get() loads again, and raises it to the request
            return
        self._install(key, loaded)

    def close(self) -> None:
        """Stop the loads' threads (loads under way are not waited for)."""
        self._readers.shutdown(wait=False, cancel_futures=True)

    def _install(self, key: tuple[str, int], loaded: _Loaded) -> PartitionProducers:
        """Make a partition's freshly loaded state the one in use."""
        loaded.expired = loaded.state.expire(_now_ms(), self.expiration_ms) > 0
        with self._cleaned_lock:
            reported = self._cleaned.get(key)
            if reported is not None and reported[0] is loaded.partition:
                loaded.state.cleaned_below = max(loaded.state.cleaned_below, reported[1])
            self._states[key] = loaded
        return loaded.state

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

    def invalidate(self, topic: str, index: int) -> None:
        """Drop one partition's state, to be rebuilt from snapshot and log on next use: an
        append failed and may still have been stored (a database commit whose reply was
        lost), so memory can no longer say which batches are in the log."""
        self._states.pop((topic, index), None)
        self._loading.pop((topic, index), None)  # a load under way installs nothing

    def forget(self, topic: str) -> None:
        """Drop the states of a deleted topic."""
        for key in [k for k in self._states if k[0] == topic]:
            del self._states[key]
        for key in [k for k in self._loading if k[0] == topic]:
            del self._loading[key]
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
        for key, loaded in [(k, v) for k, v in self._in_turn() if v.due(now)]:
            partition = loaded.partition
            offset = partition.next_offset
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
            loaded.state.forget_aborted_before(partition.log_start_offset)
            try:
                _write(partition, loaded.state.to_json(partition.next_offset))
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


def _load(partition: PartitionStore, end: int | None = None) -> tuple[_Loaded, int]:
    """A partition's state from its snapshot and the batches after it, up to ``end`` (the
    whole log: None); and the offset it is exact up to."""
    snapshot = _read(partition)
    state, saved = snapshot if snapshot is not None else (PartitionProducers(), None)
    state.cleaned_below = Checkpoint.load(partition).offset
    offset = saved if saved is not None else partition.log_start_offset
    loaded = _Loaded(partition, state, saved, time.monotonic(), partition.size_bytes)
    reached = _replay(loaded, partition, offset, end)
    return loaded, reached


def _replay(loaded: _Loaded, partition: PartitionStore, offset: int,
            end: int | None = None) -> int:
    """Apply the batches from ``offset`` on (those before ``end``, if given) to a state
    being loaded; the offset it is exact up to."""
    replayed = earlier = 0  # batches replayed; of them, written before this start
    if offset < partition.next_offset and (end is None or offset < end):
        for info in partition.headers_from(offset):
            if end is not None and info.base_offset >= end:
                break
            loaded.state.apply(info)
            offset = info.last_offset + 1
            replayed += 1
            earlier += info.base_offset < partition.opened_next_offset
    if replayed:
        log.log(logging.INFO if earlier else logging.DEBUG,
                "%s: producer state rebuilt from %s, %d batch(es) replayed",
                partition.location,
                f"the snapshot at offset {loaded.saved_offset}"
                if loaded.saved_offset is not None else "the log start", replayed)
    loaded.replayed = loaded.replayed or earlier > 0
    loaded.saved_size = partition.size_bytes
    return offset
