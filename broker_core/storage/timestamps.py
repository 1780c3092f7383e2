"""Lookups by timestamp over a partition's ledgers (ListOffsets by time and
``MAX_TIMESTAMP``), reading as little as the ledgers' recorded facts allow.

Each function is called with the partition's lock held, its ledgers in offset order, its
log start, and ``use`` (which notes a ledger file's use, keeping few sealed files open).
"""

from __future__ import annotations

from collections.abc import Callable

from .ledger import Ledger
from .model import BatchInfo

Use = Callable[[Ledger], Ledger]


def first_at_or_after(ledgers: list[Ledger], log_start: int, timestamp: int,
                      use: Use) -> BatchInfo | None:
    """The first batch at or after ``log_start`` whose maxTimestamp >= ``timestamp``;
    ledgers whose recorded max timestamp is lower are skipped without reading them."""
    for ledger in ledgers:
        facts = ledger.facts
        if facts.max_timestamp_offset < 0 or facts.max_timestamp < timestamp:
            continue
        if facts.next_offset <= log_start:
            continue
        use(ledger)
        start = 0
        if facts.first_offset < log_start:
            start = ledger.locate(log_start).position
        reader = ledger.reader()
        for meta in ledger.iter_entries(start, reader):
            if meta.max_timestamp >= timestamp:
                return BatchInfo(meta.index, meta.last_offset, meta.max_timestamp,
                                 meta.broker_timestamp, reader.batch(meta))
    return None


class MaxTimestamps:
    """The batch with the largest maxTimestamp; remembers the last ledger it had to scan
    (one cut by the log start, or with damage) until that ledger or the log start changes."""

    def __init__(self) -> None:
        self._cache: tuple[tuple[int, int, int, int], tuple[int, int] | None] | None = None

    def batch(self, ledgers: list[Ledger], log_start: int, use: Use) -> BatchInfo | None:
        """The batch with the largest maxTimestamp (the earliest one on ties), or None."""
        best: tuple[int, Ledger, int] | None = None
        for ledger in ledgers:
            facts = ledger.facts
            if facts.max_timestamp_offset < 0 or facts.next_offset <= log_start:
                continue
            if facts.max_timestamp_offset >= log_start and not ledger.damage:
                found: tuple[int, int] | None = (facts.max_timestamp,
                                                 facts.max_timestamp_offset)
            else:
                found = self._visible(ledger, log_start, use)
            if found is not None and (best is None or found[0] > best[0]):
                best = (found[0], ledger, found[1])
        if best is None:
            return None
        ledger = use(best[1])
        meta = ledger.locate(best[2])
        return BatchInfo(meta.index, meta.last_offset, meta.max_timestamp,
                         meta.broker_timestamp, ledger.reader().batch(meta))

    def _visible(self, ledger: Ledger, log_start: int, use: Use) -> tuple[int, int] | None:
        """(max timestamp, base offset) over the batches of ``ledger`` not below log start."""
        key = (ledger.ledger_id, log_start, ledger.facts.size, len(ledger.damage))
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        use(ledger)
        result: tuple[int, int] | None = None
        start = 0
        if ledger.facts.first_offset < log_start:
            start = ledger.locate(log_start).position
        for meta in ledger.iter_entries(start):
            if result is None or meta.max_timestamp > result[0]:
                result = (meta.max_timestamp, meta.index)
        self._cache = (key, result)
        return result
