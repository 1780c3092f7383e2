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
from broker_core.storage import Storage, StorageError, wall_clock_ms
from broker_core.topic_configs import list_items

from .cleaning import Checkpoint, CompactionSettings, Stopped, clean, dirt

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
                 clock: Callable[[], int] = wall_clock_ms) -> None:
        """``configs_of`` gives a topic's effective configs (None: not to be cleaned);
        ``writes`` whether this broker writes a partition."""
        self._storage = storage
        self._configs_of = configs_of
        self._writes = writes
        self._rate = io_max_bytes_per_second
        self._clock = clock
        self.stopping = threading.Event()
        """Set when the broker stops: the cleaning under way is left, nothing swapped."""

    def run_once(self) -> int:
        """Clean every due partition once (in the calling thread); return how many."""
        pace = Pacer(self._rate, self.stopping)
        cleaned = 0
        delay = 0
        for name, index, store in list(self._storage.all_partitions()):
            configs = self._configs_of(name)
            if configs is None or "compact" not in list_items(configs["cleanup.policy"]) \
                    or not self._writes(name, index):
                continue
            settings = CompactionSettings.of(configs)
            try:
                now = self._clock()
                checkpoint = Checkpoint.load(store)
                found = dirt(store, settings, now, checkpoint)
                metrics.CLEANER_DIRTY_RATIO.labels(name, str(index)).set(found.ratio)
                delay = max(delay, found.delay_ms)
                if not found.due:
                    continue
                log.info("log cleaner: cleaning %s (dirty ratio %.2f, %d segment(s))",
                         store.location, found.ratio, len(found.cleanable))
                done = clean(store, found.cleanable, settings, now, pace, checkpoint)
            except Stopped:
                break
            except (StorageError, OSError, MalformedBatch, ValueError) as exc:
                log.warning("log cleaner: %s not cleaned: %s", store.location, exc)
                continue
            if done is None:
                continue
            cleaned += 1
            reclaimed = max(done.bytes_before - done.bytes_after, 0)
            metrics.CLEANER_RUNS.inc()
            metrics.CLEANER_BYTES_RECLAIMED.inc(reclaimed)
            log.info("log cleaner: cleaned %s below offset %d: %d segment(s) rewritten, "
                     "%d bytes reclaimed", store.location, done.end, done.segments, reclaimed)
        metrics.CLEANER_MAX_DELAY.set(delay / 1000)
        return cleaned
