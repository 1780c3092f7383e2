"""Where the newest record of each key of a system topic's partition lies, as this broker
has read it from a shared storage (:class:`KeyIndex`), so that the newest record of any key,
or that there is none, costs one statement nearly always and never reads a batch twice.

A partition leader asks this of another broker's transaction coordinator state for the
first batch of every transaction on a partition; read back from the newest batch each time,
a transactional id with no record (or a very old one) cost a read of the whole partition
per request, and a client naming such ids could repeat that as often as it sends requests.

The index covers one range of base offsets, [low, high): every batch there was read, and
for each key of those batches it keeps the base offset of the batch with its newest record
there. A lookup reads, in one snapshot of the storage, the batches written since (from
``high``) and the key's batch (one statement, unless many were written since); a key found
in neither is sought further back from ``low``, down to the one batch with its newest record
or to the log start, and what that read found is kept as well. So after its first lookups
(together one read of the partition at most) a broker reads each new batch once, and a
lookup costs one statement and about one batch, whatever key it asks for.

It stays right because of how a shared system topic changes (``SystemTopic``,
``storage.pg_commits``): a partition's batches are committed in offset order (no batch can
appear below one already seen, so none below ``high``); a stored batch is never rewritten;
and a compaction writes the live state again after the newest batch, then deletes a prefix
of the log. So when a key's batch is gone, every older batch went with it and the newer
ones below ``high`` hold none of its records: what it has now is among the batches written
since, read in the same snapshot, or nothing. Keys whose batch lies below the log start are
dropped as the start moves on, so the index holds about the keys that the partition holds.
"""

from __future__ import annotations

import threading

from broker_core import metrics
from broker_core.codec.records import key_values
from broker_core.storage import BatchInfo, RowReader

Record = tuple[bytes, bytes | None]
"""A system topic's record: its key and value (None: a tombstone)."""
PAGE = 64
"""Batches per statement."""


class KeyIndex:
    """One partition's keys and the batch of each one's newest record, as far as read;
    thread-safe (a lookup holds the index while it reads: one reader of a partition at a
    time, so a second lookup waits for, then reuses, what the first one read)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._where: dict[bytes, int] = {}
        """By key, the base offset of the batch holding its newest record in the range."""
        self._high: int | None = None
        """Batches from this base offset on are not read yet (None: nothing is)."""
        self._low = 0
        """Batches below this base offset are not read yet, unless ``_bottom``."""
        self._bottom = False
        """Every batch below ``_low`` was read (none was stored)."""
        self._pruned = 0
        """The log start up to which keys were dropped."""

    def newest(self, key: bytes, read: RowReader, log_start: int) -> Record | None:
        """The newest record of ``key`` (None: it has none), read through ``read`` (see
        :meth:`SharedLog.search <broker_core.storage.SharedLog.search>`: it may stop this
        lookup at its second statement and run it again); ``log_start``: the partition's
        log start as known here (no later than its true one)."""
        with self._lock:
            self._prune(log_start)
            if self._high is None:
                return self._back(key, read)
            return self._ahead(key, read)

    def _ahead(self, key: bytes, read: RowReader) -> Record | None:
        """Read what was written since ``high`` (and the key's batch, in the same
        statement), then what the range or, for a key it does not hold, the batches
        below ``low`` say."""
        high = self._high
        assert high is not None
        fresh: dict[bytes, int] = {}
        found: Record | None = None
        also = self._where.get(key)
        kept: BatchInfo | None = None
        top, before = high, None
        while True:
            page = read(high, before, also, PAGE)
            if page and page[-1].base_offset < high:
                kept = page.pop()
            also = None  # asked once: a second page runs in a snapshot, from the start
            _count(page, kept)
            for info in page:
                hit = _fold(info, fresh, key)
                found = found or hit  # newest first: the first batch holding the key
            if page:
                top = max(top, page[0].last_offset + 1)
            if len(page) < PAGE:
                break
            before = page[-1].base_offset
        self._where.update(fresh)  # all read: the range grows up to ``top``
        self._high = top
        if key in fresh:
            return found
        if key in self._where:
            hit = None if kept is None else _last_of(kept, key)
            if hit is None:  # its batch is gone (compacted): so is every record of it
                del self._where[key]
            return hit
        return self._back(key, read)

    def _back(self, key: bytes, read: RowReader) -> Record | None:
        """Read below ``low`` (from the newest batch when nothing is read yet) until the
        key's newest record or the log start, keeping the keys of every batch read."""
        found: Record | None = None
        while found is None and not self._bottom:
            page = read(0, None if self._high is None else self._low, None, PAGE)
            _count(page, None)
            if self._high is None:
                if not page:
                    return None  # nothing stored yet: nothing to keep
                self._high = self._low = page[0].last_offset + 1
            for info in page:
                hit = _fold(info, self._where, key)
                found = found or hit
                self._low = info.base_offset
            self._bottom = len(page) < PAGE
        return found

    def _prune(self, log_start: int) -> None:
        """Drop the keys whose batch lies below the log start (compacted away: they have
        no record below ``high`` any more)."""
        if log_start > self._pruned:
            self._where = {k: at for k, at in self._where.items() if at >= log_start}
            self._pruned = log_start


def _fold(info: BatchInfo, into: dict[bytes, int], key: bytes) -> Record | None:
    """Note the batch for each of its keys that ``into`` lacks (it holds newer batches
    only); ``key``'s last record in the batch, if any."""
    found: Record | None = None
    base = info.base_offset
    for record in key_values(info.batch):
        into.setdefault(record[0], base)
        if record[0] == key:
            found = record
    return found


def _last_of(info: BatchInfo, key: bytes) -> Record | None:
    """``key``'s last record in the batch, if any."""
    return _fold(info, {}, key)


def _count(page: list[BatchInfo], kept: BatchInfo | None) -> None:
    metrics.STATE_LOOKUP_STATEMENTS.inc()
    metrics.STATE_LOOKUP_BATCHES.inc(len(page) + (kept is not None))
