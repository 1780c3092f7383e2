"""The log cleaner: a thread of its own that, every ``logCleanerBackoffMs``, looks at the
partitions of compacted topics this broker writes (not the broker's own system topics,
which compact their snapshots themselves), cleans those due (``cleaning``) and keeps the
cleaner's metrics. A partition whose last cleaning a transaction without its marker
bounded (a producer hung until its timeout) is not read again for it until its log
changes (an append: perhaps the marker) or a delete horizon passes (:class:`_Wait`), so
an open transaction does not cost a read of the partition every round. Its reads and
writes together stay under ``logCleanerIoMaxBytesPerSecond`` (paced by sleeping in its
thread), so the event loop and the appends never wait for it beyond the short swap of a
cleaned segment; while it cleans, a thread waiting for the GIL gets it within
:data:`GIL_TURN_SECONDS` (:func:`short_gil_turns`), so the event loop does not wait a
whole switch interval for the cleaner's parsing at each of its callbacks.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from broker_core import metrics
from broker_core.codec.errors import MalformedBatch
from broker_core.partition_producers import DEFAULT_EXPIRATION_MS
from broker_core.storage import (
    PartitionStore,
    SealedSegment,
    Storage,
    StorageError,
    wall_clock_ms,
)
from broker_core.topic_configs import list_items
from common.log_fields import topic_fields

from .cleaning import (
    DEFAULT_MAP_BYTES,
    Blocked,
    Checkpoint,
    CompactionSettings,
    Stopped,
    clean,
    dirt,
    first_batch_timestamp,
)

log = logging.getLogger(__name__)


GIL_TURN_SECONDS = 0.0005
"""The interpreter's switch interval while a cleaning runs (its default is 5 ms)."""


@contextmanager
def short_gil_turns() -> Iterator[None]:
    """Within the block, a thread waiting for the GIL asks for it after
    :data:`GIL_TURN_SECONDS` instead of the interpreter's switch interval (5 ms by
    default), then restores it. The cleaner holds the GIL while it parses records; the
    event loop takes it back at every callback, so with the default each of a request's
    callbacks could wait up to 5 ms for the cleaner."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(min(previous, GIL_TURN_SECONDS))
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


class Pacer:
    """Sleeps so that the bytes counted stay under a rate (0: no limit); raises Stopped
    once ``stopping`` is set."""

    def __init__(self, max_bytes_per_second: int, stopping: threading.Event) -> None:
        self._rate = max_bytes_per_second
        self._stopping = stopping
        self._since = time.monotonic()
        self._spent = 0

    @property
    def spent(self) -> int:
        """The bytes counted so far."""
        return self._spent

    def __call__(self, size: int) -> None:
        if self._stopping.is_set():
            raise Stopped
        self._spent += size
        if self._rate <= 0:
            return
        ahead = self._spent / self._rate - (time.monotonic() - self._since)
        if ahead > 0.005 and self._stopping.wait(ahead):
            raise Stopped


@dataclass(frozen=True, slots=True)
class _Wait:
    """A partition whose last cleaning was bounded by a transaction without its marker
    (from ``open_from`` on): cleaning it again finds nothing more to do while its log is
    as it was then (same start and end: no marker appended, nothing removed) and no
    delete horizon below the transaction passed since (the records' timestamps and
    ``min.compaction.lag.ms`` matter only beyond it)."""

    open_from: int
    log_start: int
    log_end: int
    tried_at: int

    def holds(self, store: PartitionStore, checkpoint: Checkpoint, now: int) -> bool:
        horizon = checkpoint.horizon
        return store.next_offset == self.log_end \
            and store.log_start_offset == self.log_start \
            and not (horizon is not None and self.tried_at < horizon <= now)


class LogCleaner:
    """Cleans the due partitions of compacted topics, one round per :meth:`run_once`."""

    def __init__(self, storage: Storage, configs_of: Callable[[str], Mapping[str, str] | None],
                 writes: Callable[[str, int], bool], io_max_bytes_per_second: int,
                 clock: Callable[[], int] = wall_clock_ms,
                 cleaned: Callable[[str, int, PartitionStore, int], None] | None = None,
                 map_bytes: int = DEFAULT_MAP_BYTES,
                 producer_expiration_ms: int = DEFAULT_EXPIRATION_MS) -> None:
        """``configs_of`` gives a topic's effective configs (None: not to be cleaned);
        ``writes`` whether this broker writes a partition; ``cleaned`` is told each
        checkpoint saved (``ProducerStates.cleaned``: aborted transactions below it are no
        longer listed); ``map_bytes`` bounds the key map of one cleaning
        (``logCleanerDedupeBufferSize``: a partition whose dirty keys outgrow it is cleaned
        over several rounds); ``producer_expiration_ms`` is ``producerIdExpirationMs`` (a
        producer idle that long keeps no empty last batch)."""
        self._storage = storage
        self._configs_of = configs_of
        self._writes = writes
        self._rate = io_max_bytes_per_second
        self._clock = clock
        self._cleaned = cleaned
        self._map_bytes = map_bytes
        self._producer_expiration_ms = producer_expiration_ms
        self._firsts: dict[tuple[str, int, int, int], int] = {}
        """The first batch's timestamp of each dirty segment seen in the last round (read
        once per segment, not every round)."""
        self._waits: dict[str, _Wait] = {}
        """By partition location: those an open transaction blocked (see :class:`_Wait`)."""
        self._failing: dict[str, str] = {}
        """By partition location: why the last round could not clean it (told once)."""
        self.io_bytes = 0
        """The bytes the cleaner read and wrote so far (what its pacing counts)."""
        self.stopping = threading.Event()
        """Set when the broker stops: the cleaning under way is left, nothing swapped."""

    def _not_cleaned(self, name: str, location: str, exc: Exception,
                     failing: dict[str, str]) -> None:
        """Log why a partition could not be cleaned: once while the cause stays the same
        (a bad config, a damaged batch: each round would say it again)."""
        expected = isinstance(exc, StorageError | OSError | MalformedBatch | ValueError)
        cause = f"{exc}" if expected else f"{type(exc).__name__}: {exc}"
        failing[location] = cause
        if self._failing.get(location) != cause:
            log.warning("log cleaner: %s not cleaned: %s", location, cause,
                        extra=topic_fields(name))

    def run_once(self) -> int:
        """Clean every due partition once (in the calling thread); return how many."""
        pace = Pacer(self._rate, self.stopping)
        cleaned = 0
        delay = 0
        firsts: dict[tuple[str, int, int, int], int] = {}
        waits: dict[str, _Wait] = {}

        def first_timestamp(store: PartitionStore, segment: SealedSegment) -> int:
            key = (store.location, segment.ident,
                   max(segment.first_offset, store.log_start_offset), segment.size_bytes)
            stamp = self._firsts.get(key)
            firsts[key] = stamp if stamp is not None else first_batch_timestamp(store, segment)
            return firsts[key]

        # a topic's settings (None: not compacted, or its configs cannot be read), once a
        # round: 10,000 partitions of 1,000 topics made 10,000 lookups of every config key
        compacted: dict[str, CompactionSettings | None] = {}
        failing: dict[str, str] = {}
        for name, index, store in list(self._storage.all_partitions()):
            start = store.log_start_offset
            try:
                if name not in compacted:
                    compacted[name] = None  # its settings fail: left alone this round
                    configs = self._configs_of(name)
                    if configs is not None \
                            and "compact" in list_items(configs["cleanup.policy"]):
                        compacted[name] = CompactionSettings.of(
                            configs, self._producer_expiration_ms)
                settings = compacted[name]
                if settings is None or not self._writes(name, index):
                    continue
                now = self._clock()
                checkpoint = Checkpoint.load(store)
                found = dirt(store, settings, now, checkpoint, first_timestamp)
                metrics.CLEANER_DIRTY_RATIO.labels(name, str(index)).set(found.ratio)
                delay = max(delay, found.delay_ms)
                if not found.due:
                    continue
                wait = self._waits.get(store.location)
                if wait is not None and wait.holds(store, checkpoint, now):
                    waits[store.location] = wait
                    continue
                log_start, log_end = store.log_start_offset, store.next_offset
                log.info("log cleaner: cleaning %s (dirty ratio %.2f, %d segment(s))",
                         store.location, found.ratio, len(found.cleanable),
                         extra=topic_fields(name))
                with short_gil_turns():
                    done = clean(store, found.cleanable, settings, now, pace, checkpoint,
                                 self._map_bytes)
            except Stopped:
                break
            except Exception as exc:  # one partition never stops the others
                if isinstance(exc, StorageError | ValueError) \
                        and store.log_start_offset != start:  # retention or DeleteRecords
                    log.debug("log cleaner: %s not cleaned: the log start moved from %d "
                              "to %d meanwhile (%s)", store.location, start,
                              store.log_start_offset, exc)  # overtook its reads: next round
                else:
                    self._not_cleaned(name, store.location, exc, failing)
                continue
            if done is None:
                continue
            open_from = done.open_from
            if open_from is not None:
                waits[store.location] = _Wait(open_from, log_start, log_end, now)
                if store.location not in self._waits:
                    log.info("log cleaner: %s not cleaned from offset %d on while the "
                             "transaction starting there is open", store.location, open_from,
                             extra=topic_fields(name))
            if isinstance(done, Blocked):
                continue
            if self._cleaned is not None:
                self._cleaned(name, index, store, done.checkpoint)
            cleaned += 1
            reclaimed = max(done.bytes_before - done.bytes_after, 0)
            metrics.CLEANER_RUNS.inc()
            metrics.CLEANER_BYTES_RECLAIMED.inc(reclaimed)
            log.info("log cleaner: cleaned %s below offset %d: %d segment(s) rewritten, "
                     "%d bytes reclaimed", store.location, done.end, done.segments, reclaimed,
                     extra=topic_fields(name))
        metrics.CLEANER_MAX_DELAY.set(delay / 1000)
        self._firsts = firsts
        self._waits = waits
        self._failing = failing
        self.io_bytes += pace.spent
        return cleaned
