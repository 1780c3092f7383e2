"""The metadata checkpoints of a file-engine partition: what its metadata file records.

The metadata lists the ledgers; for the open ledger it records the facts as of its last
fsync (the *recovery point*), so a restart scans only what came after. A snapshot is taken
under the partition's lock and written outside it; snapshots are numbered, and one older
than the last written is never written over it (two flushing threads may race).
"""

from __future__ import annotations

import threading
from pathlib import Path

from .fsutil import install_temp
from .ledger import Ledger
from .metadata import (
    METADATA_FILE,
    LedgerFacts,
    PartitionMetadata,
    stage_metadata,
    store_metadata,
)


class Checkpoints:
    """The recovery point of one partition and the writing of its metadata file."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._lock = threading.Lock()
        self._seq = 0
        self._written_seq = 0
        self._recorded_size = 0
        self.recovery_point = LedgerFacts(0, 0, 0)
        """The open ledger's facts as of its last fsync."""
        self.stored: PartitionMetadata | None = None
        """What the metadata file holds (as last written or read), None if unknown."""

    @property
    def unrecorded(self) -> int:
        """Bytes of the open ledger fsynced since its recovery point was last recorded."""
        return self.recovery_point.size - self._recorded_size

    def snapshot(self, ledgers: list[Ledger], log_start: int) -> tuple[int, PartitionMetadata]:
        """The metadata to record now, and its number (called with the partition's lock
        held: ``ledgers`` in offset order, the last one open)."""
        self._seq += 1
        facts = [ledger.facts.copy() for ledger in ledgers[:-1]]
        open_ledger = ledgers[-1]
        point = self.recovery_point
        if point.ledger_id != open_ledger.ledger_id:
            point = LedgerFacts(open_ledger.ledger_id, open_ledger.facts.first_offset,
                                open_ledger.facts.first_offset,
                                created_ms=open_ledger.facts.created_ms)
        open_facts = point.copy()
        open_facts.sealed = open_ledger.facts.sealed
        open_facts.synced = True
        facts.append(open_facts)
        self._recorded_size = point.size
        return self._seq, PartitionMetadata(open_ledger.facts.next_offset, log_start, facts)

    def write(self, seq: int, metadata: PartitionMetadata, *, durable: bool = True) -> None:
        """Write snapshot ``seq`` unless a later one is written already (``durable``: see
        ``write_atomically``)."""
        with self._lock:
            if seq <= self._written_seq:
                return
            store_metadata(self._directory, metadata, durable=durable)
            self.stored = metadata
            self._written_seq = seq

    def stage(self, seq: int, metadata: PartitionMetadata) -> Path:
        """Write snapshot ``seq`` to the metadata file's temp file, not fsynced (a
        partition closed together with many others: ``partition_flush.close_together``);
        the caller makes it and the ledgers durable, then :meth:`install` renames it into
        place. No older snapshot is written from now on."""
        with self._lock:
            self._written_seq = max(self._written_seq, seq)
            return stage_metadata(self._directory, metadata)

    def install(self, temp: Path, metadata: PartitionMetadata) -> None:
        """Rename the temp file of :meth:`stage` into place (durable once the directory
        is fsynced or its file system synced)."""
        with self._lock:
            install_temp(temp, self._directory / METADATA_FILE)
            self.stored = metadata

    def stored_already(self, metadata: PartitionMetadata) -> bool:
        """Whether the metadata file holds ``metadata`` already, but for whether its open
        ledger is marked sealed (a clean stop marks it; recovery reads no more into it)."""
        stored = self.stored
        if stored is None or len(stored.ledgers) != len(metadata.ledgers) or \
                (stored.next_offset, stored.log_start_offset) != \
                (metadata.next_offset, metadata.log_start_offset):
            return False
        if stored.ledgers[:-1] != metadata.ledgers[:-1]:
            return False
        last = stored.ledgers[-1].copy()
        last.sealed = metadata.ledgers[-1].sealed
        return last == metadata.ledgers[-1]
