"""Read-ahead of the PostgreSQL engine: while a consumer is behind, the batches after the
page a fetch gave it are read in a worker thread, a window of ``WINDOW_PAGES`` pages at a
time, so its next fetches are answered from memory instead of waiting for the database
on the event loop.

Each partition has a :class:`Buffer`: the batches read ahead from the offset where the
last read ended, and at most one window being read after them, started whenever fewer
than two pages are left. A read at exactly that offset takes its page from the buffer (by
the same rule as a fresh read: the first batch whole, then those that fit); a read
elsewhere drops the buffer and reads afresh, and so does a read at the end of the log (so
appends committed meanwhile are seen). Committed entries never change, and retention and
DeleteRecords only remove offsets below the log start (which a read checks first), so
what is buffered stays true. All buffers and windows of one storage hold at most
``budget`` bytes (each window counted at its size limit): beyond that, reads simply do not
read ahead.
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
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="edge-pg-read")

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


class Buffer:
    """One partition's batches read ahead of its consumer (used by one reader at a time:
    the event loop's fetches)."""

    def __init__(self, pool: ReadAhead, read: Callable[[int, int], list[BatchInfo]]) -> None:
        self._pool = pool
        self._read = read
        self._rows: deque[BatchInfo] = deque()
        self._rows_bytes = 0
        self._at = -1  # the offset the buffer answers a read at; -1: none
        self._held = 0  # bytes counted against the budget for what was read
        self._window: tuple[int, int, Future[list[BatchInfo]]] | None = None

    def take(self, offset: int, max_bytes: int) -> list[BatchInfo] | None:
        """The page at ``offset`` from memory, waiting for the window being read when the
        page runs into it; None when nothing is buffered there."""
        if offset != self._at:
            self.drop()
            return None
        page: list[BatchInfo] = []
        taken = 0
        while True:
            if not self._rows:
                if self._window is None or self._window[0] != offset:
                    break
                self._absorb()
                if not self._rows:
                    break
            info = self._rows[0]
            if page and taken + len(info.batch) > max_bytes:
                break
            self._rows.popleft()
            self._rows_bytes -= len(info.batch)
            page.append(info)
            taken += len(info.batch)
            offset = info.last_offset + 1
        if not page:
            return None
        self._at = offset
        if not self._rows and self._window is None:
            self._release()
        return page

    def follow(self, after: int, end: int, max_bytes: int) -> None:
        """A read ended at ``after`` (the committed end is ``end``): read the next window
        ahead when fewer than two pages are buffered after it."""
        if after >= end:
            return
        if after != self._at:
            self.drop()
            self._at = after
        if self._window is not None or self._rows_bytes >= 2 * max_bytes:
            return
        start = self._rows[-1].last_offset + 1 if self._rows else after
        if start >= end:
            return
        size = WINDOW_PAGES * max_bytes
        future = self._pool.start(size, lambda: self._read(start, size))
        if future is not None:
            self._window = (start, size, future)

    def _absorb(self) -> None:
        """Wait for the window being read and buffer what it read."""
        assert self._window is not None
        _, size, future = self._window
        self._window = None
        self._held += size
        try:
            rows = future.result()
        except (OSError, StorageError, CancelledError):
            rows = []  # read afresh
        self._rows.extend(rows)
        self._rows_bytes += sum(len(info.batch) for info in rows)

    def _release(self) -> None:
        if self._held:
            self._pool.release(self._held)
            self._held = 0

    def drop(self) -> None:
        """Forget what is buffered (a read elsewhere, or the partition closed)."""
        if self._window is not None:
            _, size, future = self._window
            self._window = None
            if future.cancel():
                self._pool.release(size)
            else:  # being read: counted until it is done
                future.add_done_callback(lambda _: self._pool.release(size))
        self._rows.clear()
        self._rows_bytes = 0
        self._at = -1
        self._release()
