"""Read-ahead of the PostgreSQL engine: while a consumer is behind, the batches after the
page a fetch gave it are read in a worker thread, a window of ``WINDOW_PAGES`` pages at a
time, so its next fetches are answered from memory instead of waiting for the database
on the event loop.

Each partition has a :class:`Buffer`: the batches read ahead from the offset where the
last read ended, and at most one window being read after them, started whenever fewer
than two pages are left. A read at exactly that offset takes its page from the buffer (by
the same rule as a fresh read: the first batch whole, then those that fit); a read
elsewhere drops the buffer and reads afresh, and so does a read at the end of the log (so
appends committed meanwhile are seen). All buffers and windows of one storage hold at most
``budget`` bytes (each window counted at its size limit): beyond that, reads simply do not
read ahead.

What is buffered is what the database held when it was read. Retention and DeleteRecords
only remove offsets below the new log start (which a read checks first), but the log
cleaner replaces the rows of whole segments (``replace_segments``), and a partition that
was another broker's for a while may have been cleaned by it: so the cleaner's swap, once
committed, and every change of ownership (``fence``) drop the buffer, from their own
thread. A drop moves the buffer's generation on: a window being read then is not kept
(its query may have run before the swap committed), and a read waiting for it reads
afresh. The cleaner raises ``cleaned_below`` only after its swap returned, and a fetch
reads it before reading the log: a fetch that no longer lists the aborted transactions
below it gets no batch read ahead before the swap.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import TypeVar

from .errors import StorageError
from .model import BatchInfo

_BUDGET = 64 << 20
"""Bytes the pages ahead of one storage may hold together."""
_THREADS = 2
THREAD_NAME = "edge-pg-read"
"""What the names of the read-ahead workers' threads start with."""
WINDOW_PAGES = 4
"""Pages (of the size the last read asked for) read ahead in one query."""

T = TypeVar("T")


class ReadAhead:
    """Worker threads that read pages ahead, within a byte budget; thread-safe."""

    def __init__(self, budget: int = _BUDGET, threads: int = _THREADS) -> None:
        self._budget = budget
        self._held = 0
        self._lock = threading.Lock()
        self._closed = False
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix=THREAD_NAME)

    def start(self, size: int, read: Callable[[], T]) -> Future[T] | None:
        """Run ``read`` in a worker, counting ``size`` bytes until :meth:`release`; None
        when the budget is spent or the storage is closing."""
        with self._lock:
            if self._closed or self._held + size > self._budget:
                return None
            self._held += size
            try:
                return self._pool.submit(read)
            except RuntimeError:  # shut down meanwhile
                self._held -= size
                return None

    def release(self, size: int) -> None:
        """``size`` bytes started are used or dropped."""
        with self._lock:
            self._held -= size

    def close(self) -> None:
        """Stop reading ahead; pages being read are finished first."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)


class _Window:
    """A window being read in a worker: from ``start``, ``size`` bytes counted against the
    budget, at the buffer's ``generation`` when it started."""

    __slots__ = ("future", "generation", "size", "start")

    def __init__(self, start: int, size: int, future: Future[list[BatchInfo]],
                 generation: int) -> None:
        self.start = start
        self.size = size
        self.future = future
        self.generation = generation


class Buffer:
    """One partition's batches read ahead of its consumer: read by one reader at a time
    (the event loop's fetches), dropped from any thread; a lock guards its state, never
    held while the database is waited for."""

    def __init__(self, pool: ReadAhead, read: Callable[[int, int], list[BatchInfo]]) -> None:
        self._pool = pool
        self._read = read
        self._lock = threading.Lock()
        self._generation = 0
        """Moves on at each drop: rows read ahead at an older one are not kept."""
        self._rows: deque[BatchInfo] = deque()
        self._rows_bytes = 0
        self._at = -1  # the offset the buffer answers a read at; -1: none
        self._held = 0  # bytes counted against the budget for what was read
        self._window: _Window | None = None

    def take(self, offset: int, max_bytes: int) -> list[BatchInfo] | None:
        """The page at ``offset`` from memory, waiting for the window being read when the
        page runs into it; None when nothing is buffered there, or when the buffer was
        dropped meanwhile (read afresh)."""
        page: list[BatchInfo] = []
        taken = 0
        with self._lock:
            if offset != self._at:
                self._drop()
                return None
            generation = self._generation
        while True:
            with self._lock:
                if self._generation != generation:
                    return None
                while self._rows and not (page and taken + len(self._rows[0].batch)
                                          > max_bytes):
                    info = self._rows.popleft()
                    self._rows_bytes -= len(info.batch)
                    page.append(info)
                    taken += len(info.batch)
                    offset = info.last_offset + 1
                window = self._window
                if self._rows or window is None or window.start != offset:
                    if not page:
                        return None
                    self._at = offset
                    if not self._rows and window is None:
                        self._release()
                    return page
                self._window = None  # this reader waits for it (no drop cancels it)
            self._absorb(window)

    def follow(self, after: int, end: int, max_bytes: int) -> None:
        """A read ended at ``after`` (the committed end is ``end``): read the next window
        ahead when fewer than two pages are buffered after it."""
        if after >= end:
            return
        with self._lock:
            if after != self._at:
                self._drop()
                self._at = after
            if self._window is not None or self._rows_bytes >= 2 * max_bytes:
                return
            start = self._rows[-1].last_offset + 1 if self._rows else after
            if start >= end:
                return
            size = WINDOW_PAGES * max_bytes
            future = self._pool.start(size, lambda: self._read(start, size))
            if future is not None:  # started under the lock: a drop sees it
                self._window = _Window(start, size, future, self._generation)

    def _absorb(self, window: _Window) -> None:
        """Wait for ``window`` (lock not held) and buffer what it read, unless the buffer
        was dropped meanwhile: its rows may have been read before the stored ones
        changed."""
        rows: list[BatchInfo] = []
        try:
            rows = window.future.result()
        except (OSError, StorageError, CancelledError):
            pass  # read afresh
        finally:
            with self._lock:
                if self._generation != window.generation:
                    self._pool.release(window.size)
                else:
                    self._held += window.size
                    self._rows.extend(rows)
                    self._rows_bytes += sum(len(info.batch) for info in rows)

    def _release(self) -> None:
        if self._held:
            self._pool.release(self._held)
            self._held = 0

    def drop(self) -> None:
        """Forget what is buffered and what is being read (a read elsewhere, the partition
        closed or fenced, its stored rows replaced); from any thread."""
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        self._generation += 1
        window, self._window = self._window, None
        if window is not None:
            size = window.size
            if window.future.cancel():
                self._pool.release(size)
            else:  # being read: counted until it is done
                window.future.add_done_callback(lambda _: self._pool.release(size))
        self._rows.clear()
        self._rows_bytes = 0
        self._at = -1
        self._release()
