"""The log cleaner: a thread of its own that, every ``logCleanerBackoffMs``, looks at the
partitions of compacted topics this broker writes (not the broker's own system topics,
which compact their snapshots themselves), cleans those due (``cleaning``) and keeps the
cleaner's metrics. Its reads and writes together stay under
``logCleanerIoMaxBytesPerSecond`` (paced by sleeping in its thread), so the event loop
and the appends never wait for it beyond the short swap of a cleaned segment.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from broker_core import metrics
from broker_core.codec.errors import MalformedBatch
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
    Checkpoint,
    CompactionSettings,
    Stopped,
    clean,
    dirt,
    first_batch_timestamp,
)

log = logging.getLogger(__name__)


class Pacer:
    """Sleeps so that the bytes counted stay under a rate (0: no limit); raises Stopped
    once ``stopping`` is set."""

    def __init__(self, max_bytes_per_second: int, stopping: threading.Event) -> None:
        self._rate = max_bytes_per_second
        self._stopping = stopping
        self._since = time.monotonic()
        self._spent = 0

    def __call__(self, size: int) -> None:
        if self._stopping.is_set():
            raise Stopped
        if self._rate <= 0:
            return
        self._spent += size
        ahead = self._spent / self._rate - (time.monotonic() - self._since)
        if ahead > 0.005 and self._stopping.wait(ahead):
            raise Stopped


class LogCleaner:
    """Cleans the due partitions of compacted topics, one round per :meth:`run_once`."""

    def __init__(self, storage: Storage, configs_of: Callable[[str], Mapping[str, str] | None],
                 writes: Callable[[str, int], bool], io_max_bytes_per_second: int,
                 clock: Callable[[], int] = wall_clock_ms,
                 cleaned: Callable[[str, int, PartitionStore, int], None] | None = None,
                 map_bytes: int = DEFAULT_MAP_BYTES) -> None:
        """``configs_of`` gives a topic's effective configs (None: not to be cleaned);
        ``writes`` whether this broker writes a partition; ``cleaned`` is told each
        checkpoint saved (``ProducerStates.cleaned``: aborted transactions below it are no
        longer listed); ``map_bytes`` bounds the key map of one cleaning
        (``logCleanerDedupeBufferSize``: a partition whose dirty keys outgrow it is cleaned
        over several rounds)."""
        self._storage = storage
        self._configs_of = configs_of
        self._writes = writes
        self._rate = io_max_bytes_per_second
        self._clock = clock
        self._cleaned = cleaned
        self._map_bytes = map_bytes
        self._firsts: dict[tuple[str, int, int, int], int] = {}
        """The first batch's timestamp of each dirty segment seen in the last round (read
        once per segment, not every round)."""
        self.stopping = threading.Event()
        """Set when the broker stops: the cleaning under way is left, nothing swapped."""

    def run_once(self) -> int:
        """Clean every due partition once (in the calling thread); return how many."""
        pace = Pacer(self._rate, self.stopping)
        cleaned = 0
        delay = 0
        firsts: dict[tuple[str, int, int, int], int] = {}

        def first_timestamp(store: PartitionStore, segment: SealedSegment) -> int:
            key = (store.location, segment.ident,
                   max(segment.first_offset, store.log_start_offset), segment.size_bytes)
            stamp = self._firsts.get(key)
            firsts[key] = stamp if stamp is not None else first_batch_timestamp(store, segment)
            return firsts[key]

        for name, index, store in list(self._storage.all_partitions()):
            configs = self._configs_of(name)
            if configs is None or "compact" not in list_items(configs["cleanup.policy"]) \
                    or not self._writes(name, index):
                continue
            settings = CompactionSettings.of(configs)
            try:
                now = self._clock()
                checkpoint = Checkpoint.load(store)
                found = dirt(store, settings, now, checkpoint, first_timestamp)
                metrics.CLEANER_DIRTY_RATIO.labels(name, str(index)).set(found.ratio)
                delay = max(delay, found.delay_ms)
                if not found.due:
                    continue
                log.info("log cleaner: cleaning %s (dirty ratio %.2f, %d segment(s))",
                         store.location, found.ratio, len(found.cleanable),
                         extra=topic_fields(name))
                done = clean(store, found.cleanable, settings, now, pace, checkpoint,
                             self._map_bytes)
            except Stopped:
                break
            except (StorageError, OSError, MalformedBatch, ValueError) as exc:
                log.warning("log cleaner: %s not cleaned: %s", store.location, exc,
                            extra=topic_fields(name))
                continue
            if done is None:
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
        return cleaned
