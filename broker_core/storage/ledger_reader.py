"""Reading one ledger's entries: ``LedgerReader`` reads through a cached window of the
file, ``EntryMeta`` is an entry's header fields plus the batch header fields storage
looks at. Bytes below a ledger's recorded size never change, so a window stays valid."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker_core.codec.batch_header import BATCH_HEADER_SIZE, last_offset_delta, max_timestamp

from .entry import ENTRY_HEADER_SIZE, decode_entry_header
from .errors import CorruptLedger

if TYPE_CHECKING:
    from .ledger import Ledger


@dataclass(frozen=True, slots=True)
class EntryMeta:
    """An entry's header fields plus the batch header fields storage looks at."""

    position: int
    index: int
    broker_timestamp: int
    batch_length: int
    last_offset_delta: int
    max_timestamp: int

    @property
    def last_offset(self) -> int:
        return self.index + self.last_offset_delta

    @property
    def end(self) -> int:
        """File position just after this entry."""
        return self.position + ENTRY_HEADER_SIZE + self.batch_length


class LedgerReader:
    """Reads one ledger through a cached window of its file."""

    def __init__(self, ledger: Ledger, window: int, limit: int | None = None) -> None:
        self._ledger = ledger
        self._window = window
        self._limit = limit
        self._buf = memoryview(b"")
        self._start = 0

    def view(self, start: int, length: int, hint: int = 0) -> memoryview:
        """Bytes ``[start, start+length)``; shorter only if the ledger ends first.

        On a cache miss, reads ``max(length, hint or window)`` bytes from ``start``.
        """
        buf_start = self._start
        if buf_start <= start and start + length <= buf_start + len(self._buf):
            return self._buf[start - buf_start : start + length - buf_start]
        limit = self._ledger.facts.size if self._limit is None else self._limit
        size = min(max(length, hint or self._window), limit - start)
        data = os.pread(self._ledger.fd(), size, start) if size > 0 else b""
        self._buf = memoryview(data)
        self._start = start
        return self._buf[:length]

    def entry_at(self, position: int) -> EntryMeta:
        """The entry starting at ``position``; CorruptLedger if there is none."""
        view = self.view(position, ENTRY_HEADER_SIZE + BATCH_HEADER_SIZE)
        header = decode_entry_header(view)
        if header is None or len(view) < ENTRY_HEADER_SIZE + BATCH_HEADER_SIZE:
            raise CorruptLedger(f"{self._ledger.path}: no valid entry at position {position}")
        return EntryMeta(
            position,
            header.index,
            header.broker_timestamp,
            header.batch_length,
            last_offset_delta(view, ENTRY_HEADER_SIZE),
            max_timestamp(view, ENTRY_HEADER_SIZE),
        )

    def batch(self, meta: EntryMeta, hint: int = 0) -> memoryview:
        """The record batch bytes of an entry."""
        view = self.view(meta.position + ENTRY_HEADER_SIZE, meta.batch_length, hint)
        if len(view) != meta.batch_length:
            raise CorruptLedger(f"{self._ledger.path}: short batch at position {meta.position}")
        return view
