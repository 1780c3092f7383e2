"""Read-ahead of the PostgreSQL engine: while a consumer works through the page a fetch
gave it, the next page of that partition is read in a worker thread, so its next fetch is
answered from memory instead of waiting for the database on the event loop.

A partition keeps at most one page ahead (``PgPartition``): the one after the last page
read, of the same size, when the log held more than that page. It is used only by a read
of exactly that offset and size, and only when it is not empty (a consumer at the end of
the log reads afresh, so appends committed meanwhile are seen). Committed entries never
change, and retention and DeleteRecords only remove offsets below the log start (which a
read checks first), so a page read ahead stays true. All pages ahead of one storage hold
at most ``budget`` bytes (each counted at its size limit): beyond that, reads simply do
not read ahead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

_BUDGET = 64 << 20
"""Bytes the pages ahead of one storage may hold together."""
_THREADS = 2

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

    def release(self, size: int, page: Future[T]) -> None:
        """The page of ``size`` bytes is used or dropped."""
        page.cancel()
        with self._lock:
            self._held -= size

    def close(self) -> None:
        """Stop reading ahead; pages being read are finished first."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
