"""``PartitionFiles``: the files of one partition, the base of ``PartitionLog``.

It owns the ledger list, the metadata (``checkpoints``) and the partition's locks and
state: opening (``recovery``) or creating the partition, rolling to a new ledger,
keeping few sealed ledger files open, durability and closing. ``PartitionLog``
(``partition``) adds appending, reading, trimming and the cleaner's swap on top.

Durability: ``append`` writes straight to the file (no userspace buffer), so a process
crash right after it returns loses nothing; ``flush`` fsyncs. The metadata file records
the ledger list; for the open ledger it records the facts as of its last fsync (its
*recovery point*), and each sealed ledger is marked ``synced`` once fsynced. At open,
``recovery`` scans what is not known to be synced and cuts the open ledger's torn tail.

A failed fsync, or a write failing otherwise than for space (ENOSPC, EDQUOT: the ledger
is cut back, so those are retried safely), takes the log offline until restart: after a
failed fsync the kernel may have dropped the pages it could not write, so neither the
files nor the in-memory facts can be trusted. Every read and write of an offline log
raises LogOffline; it is logged once, and close leaves it unsealed for recovery.

Thread safety: every method takes one lock; ``flush`` holds it only to collect
duplicated file descriptors and runs the fsyncs outside it, so appends proceed while
an executor thread flushes.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .checkpoints import Checkpoints
from .config import LogConfig
from .damage import Damage, report
from .damage_book import DamageBook
from .errors import LogClosed, LogOffline, OffsetOutOfRange
from .file_kv import FileKeyValues
from .fsutil import fsync_dir, start_writeback
from .ledger import Ledger
from .metadata import LedgerFacts, PartitionMetadata
from .model import wall_clock_ms
from .recovery import recover
from .timestamps import MaxTimestamps

logger = logging.getLogger(__name__)

_CHECKPOINT_BYTES = 64 << 20
"""A flush rewrites the metadata when the open ledger grew this much since it was recorded."""
_MAX_PENDING_SYNC = 8
"""Sealed ledgers awaiting fsync beyond this are fsynced at roll time."""
_MAX_OPEN_SEALED = 8
"""Sealed ledgers whose file stays open for reads (least recently used are closed)."""


@dataclass
class _PendingSync:
    fd: int
    ledger: Ledger
    size: int


@dataclass
class FlushPoint:
    """What one flush of a partition makes durable (see ``PartitionLog.flush_begin``)."""

    pending: list[_PendingSync]
    """Sealed ledgers rolled since the last flush."""
    current: _PendingSync
    """The open ledger, up to ``facts.size``."""
    facts: LedgerFacts
    """The open ledger's facts when the flush began: its recovery point once synced."""

    @property
    def files(self) -> list[_PendingSync]:
        return [*self.pending, self.current]

    def release(self) -> None:
        """Close the duplicated descriptors."""
        for item in self.files:
            os.close(item.fd)


@dataclass
class ClosePoint:
    """What a partition closed together with others still has to do (see
    ``PartitionFiles.close_begin``): its files made durable, then its metadata installed."""

    log: PartitionFiles
    files: list[_PendingSync]
    """The ledgers to make durable (descriptors duplicated: the ledgers are closed)."""
    temp: Path
    """The metadata's temp file, written, not fsynced."""
    metadata: PartitionMetadata

    def finish(self, synced: bool) -> None:
        """Install the metadata once the files are durable: ``synced`` when their file
        system was synced (``syncfs``) after :meth:`PartitionFiles.close_begin`, else each
        file and the temp file are fsynced here. The rename is durable once the directory
        is fsynced or its file system synced; a failed fsync leaves the partition unsealed
        (the next start recovers it) and raises."""
        log = self.log
        try:
            if not synced:
                for item in self.files:
                    log._fsync(item.fd)
                fd = os.open(self.temp, os.O_RDONLY)
                try:
                    log._fsync(fd)
                finally:
                    os.close(fd)
        except BaseException:
            self.temp.unlink(missing_ok=True)
            raise
        log._checkpoints.install(self.temp, self.metadata)

    def release(self) -> None:
        """Close the duplicated descriptors."""
        for item in self.files:
            os.close(item.fd)


class PartitionFiles:
    """The files of one partition; see the module docstring."""

    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        *,
        clock: Callable[[], int] = wall_clock_ms,
        fresh: bool = False,
        listed: bool = False,
    ) -> None:
        """Open the partition stored in ``directory``, creating or recovering it. With
        ``fresh`` the directory must not exist: the partition is created empty and nothing
        is fsynced (the caller makes it durable: ``fsutil.sync_filesystem``). ``listed``:
        the caller saw the directory (loading 10,000 partitions skips asking for it)."""
        self.directory = Path(directory)
        self._config = config
        self._clock = clock
        self._lock = threading.RLock()
        self._checkpoints = Checkpoints(self.directory)
        self._ledgers: list[Ledger] = []
        self._log_start = 0
        self._next_ledger_id = 1
        self._pending_sync: list[_PendingSync] = []
        self._written_back = (-1, 0)  # (ledger id, position) start_writeback reached
        self._open_sealed: OrderedDict[int, Ledger] = OrderedDict()
        self._max_timestamps = MaxTimestamps()
        self._damage = DamageBook(self.directory)
        self._closed = False
        self._offline: str | None = None  # why the log went offline
        if not listed:
            self.directory.mkdir(parents=True, exist_ok=not fresh)
        with self._lock:
            if fresh:
                self._start_empty()
            else:
                self._recover()
        self.opened_next_offset = self.next_offset
        """The next offset when the log was opened: offsets below it were written before."""

    # -- properties --------------------------------------------------------------------

    @property
    def location(self) -> str:
        """The partition's directory, for log lines."""
        return str(self.directory)

    @property
    def state(self) -> FileKeyValues:
        """Files in the partition's directory, refused once the log is closed."""
        return FileKeyValues(self.directory, self._check_open)

    @property
    def log_start_offset(self) -> int:
        """The first offset still readable."""
        return self._log_start

    @property
    def offline(self) -> bool:
        """Whether the log is offline until restart (see the module docstring)."""
        return self._offline is not None

    @property
    def next_offset(self) -> int:
        """The offset the next appended batch gets (the end of what is written)."""
        return self._ledgers[-1].facts.next_offset

    @property
    def size_bytes(self) -> int:
        """Total bytes of all ledger files (entry headers included)."""
        with self._lock:
            return sum(ledger.facts.size for ledger in self._ledgers)

    @property
    def config(self) -> LogConfig:
        return self._config

    @config.setter
    def config(self, config: LogConfig) -> None:
        self.update_config(config)

    def update_config(self, config: LogConfig) -> None:
        """Use ``config`` from now on (rolling, retention and index granularity)."""
        with self._lock:
            self._config = config
            for ledger in self._ledgers:
                ledger.index_interval_bytes = config.index_interval_bytes

    @property
    def ledger_count(self) -> int:
        """Number of ledgers (sealed ones plus the open one)."""
        return len(self._ledgers)

    def damaged_ranges(self) -> list[Damage]:
        """The damaged offset ranges at or above the log start, in offset order."""
        with self._lock:
            return self._damage.ranges(self._ledgers, self._log_start)


    # -- rolling -----------------------------------------------------------------------

    def roll(self) -> None:
        """Seal the open ledger and start a new one (no-op if the open ledger is empty)."""
        with self._lock:
            self._check_open()
            self._roll_locked(self._clock())

    def _roll_locked(self, now: int, *, store: bool = True) -> None:
        old = self._ledgers[-1]
        if old.facts.size == 0:
            return
        new = Ledger.create(
            self.directory,
            self._next_ledger_id,
            old.facts.next_offset,
            now,
            self._config.index_interval_bytes,
        )
        self._next_ledger_id += 1
        old.facts.sealed = True
        old.facts.synced = False
        self._pending_sync.append(_PendingSync(os.dup(old.fd()), old, old.facts.size))
        self._ledgers.append(new)
        self._use(old)
        self._checkpoints.recovery_point = new.facts.copy()
        if len(self._pending_sync) > _MAX_PENDING_SYNC:
            self._sync_pending_locked()
        if store:
            self._store_metadata_locked()
    # -- durability --------------------------------------------------------------------

    def start_writeback(self) -> None:
        """Start writing out what was appended to the open ledger since the last call,
        without waiting for it (safe to call from another thread). The next :meth:`flush`
        then has little left to write, so appends running beside it are barely slowed.
        """
        with self._lock:
            if self._closed:
                return
            ledger = self._ledgers[-1]
            ledger_id, begin = self._written_back
            if ledger_id != ledger.ledger_id:
                begin = 0
            end = ledger.facts.size
            if end <= begin:
                return
            fd = os.dup(ledger.fd())
            self._written_back = (ledger.ledger_id, end)
        try:
            start_writeback(fd, begin, end - begin)
        finally:
            os.close(fd)

    def flush(self) -> bool:
        """fsync what was appended so far (safe to call from another thread); return
        whether the metadata was rewritten too (a checkpoint)."""
        point = self.flush_begin()
        if point is None:
            return False
        try:
            for item in point.files:
                self._fsync(item.fd)
        finally:
            point.release()
        return self.flush_end(point)

    def flush_begin(self) -> FlushPoint | None:
        """The first half of :meth:`flush`: what is to be made durable now (duplicated
        descriptors of the files with unsynced appends, and the open ledger's facts).
        Once those files are synced (each fsynced, or their whole file system at once:
        :func:`flush_together`), :meth:`flush_end` records it. None if closed."""
        with self._lock:
            if self._closed:
                return None
            self._check_online()
            pending, self._pending_sync = self._pending_sync, []
            ledger = self._ledgers[-1]
            current = _PendingSync(os.dup(ledger.fd()), ledger, ledger.facts.size)
            return FlushPoint(pending, current, ledger.facts.copy())

    def flush_end(self, point: FlushPoint) -> bool:
        """Record that the files of ``point`` are synced; whether the metadata was
        rewritten (a checkpoint)."""
        ledger, pending, current = point.current.ledger, point.pending, point.current
        with self._lock:
            if self._closed:
                return False
            for item in pending:
                if item.ledger.facts.size == item.size:
                    item.ledger.facts.synced = True
            if ledger is self._ledgers[-1] \
                    and point.facts.size > self._checkpoints.recovery_point.size:
                self._checkpoints.recovery_point = point.facts
            elif ledger.facts.sealed and ledger.facts.size == current.size:
                ledger.facts.synced = True
            if not pending and self._checkpoints.unrecorded < _CHECKPOINT_BYTES:
                return False
            seq, metadata = self._checkpoints.snapshot(self._ledgers, self._log_start)
        self._checkpoints.write(seq, metadata)
        return True

    def close(self) -> None:
        """Flush, seal the open ledger, write the metadata and release file descriptors."""
        point = self.close_begin()
        if point is None:
            return
        try:
            point.finish(synced=False)
        finally:
            point.release()
        fsync_dir(self.directory)

    def close_begin(self) -> ClosePoint | None:
        """The first half of :meth:`close`: seal the open ledger, write the metadata to its
        temp file (nothing fsynced) and close the ledgers; what is left to make the stop
        durable, or None if nothing is (closed already, or nothing changed since the
        metadata was written, which records only what was fsynced: 10,000 idle partitions
        stop at once). Many partitions closed together (``close_together``) sync their file
        system once, then each :meth:`ClosePoint.finish`, then sync once more for the
        renames: a temp file and the ledgers are durable before it is renamed into place,
        as :func:`fsutil.write_atomically` orders it."""
        with self._lock:
            if self._closed:
                return None
            pending: list[_PendingSync] = []
            try:
                self._check_online()  # an offline log stays unsealed: the next start recovers it
                pending, self._pending_sync = self._pending_sync, []
                for item in pending:  # recorded so once they are synced with the others
                    if item.ledger.facts.size == item.size:
                        item.ledger.facts.synced = True
                ledger = self._ledgers[-1]
                ledger.facts.sealed = True
                self._checkpoints.recovery_point = ledger.facts.copy()
                seq, metadata = self._checkpoints.snapshot(self._ledgers, self._log_start)
                if not pending and self._checkpoints.stored_already(metadata):
                    return None
                files = [*pending, _PendingSync(os.dup(ledger.fd()), ledger, ledger.facts.size)]
                pending = []
                try:
                    temp = self._checkpoints.stage(seq, metadata)
                except BaseException:
                    for item in files:
                        os.close(item.fd)
                    raise
                return ClosePoint(self, files, temp, metadata)
            finally:  # even unsealed (say, on a full disk): the next start recovers it
                for unsynced in pending:
                    os.close(unsynced.fd)
                for opened in self._ledgers:
                    opened.close()
                self._open_sealed.clear()
                self._closed = True

    def _sync_pending_locked(self) -> None:
        pending, self._pending_sync = self._pending_sync, []
        try:
            for item in pending:
                self._fsync(item.fd)
                if item.ledger.facts.size == item.size:
                    item.ledger.facts.synced = True
        finally:
            for item in pending:
                os.close(item.fd)

    def _store_metadata_locked(self) -> None:
        seq, metadata = self._checkpoints.snapshot(self._ledgers, self._log_start)
        self._checkpoints.write(seq, metadata)

    # -- helpers -----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosed(f"partition log {self.directory} is closed")
        self._check_online()

    def _check_online(self) -> None:
        if self._offline is not None:
            raise LogOffline(errno.EIO, f"partition log {self.directory} is offline "
                             f"until restart ({self._offline})")

    def _fsync(self, fd: int) -> None:
        """fsync a ledger's file; a failure takes the log offline."""
        try:
            os.fsync(fd)
        except OSError as exc:
            raise self._go_offline("an fsync", exc) from exc

    def _go_offline(self, what: str, exc: OSError) -> LogOffline:
        """Take the log offline after ``what`` failed with ``exc`` (logged once); return
        the error to raise."""
        reason = f"{what} failed: {exc.strerror or exc}"
        with self._lock:
            first = self._offline is None
            if first:
                self._offline = reason
        if first:
            logger.error("storage: partition log %s is offline until restart: %s; its "
                         "reads and writes fail until then", self.directory, reason)
        return LogOffline(errno.EIO, f"partition log {self.directory} is offline until "
                          f"restart ({self._offline})")

    def _check_offset(self, offset: int) -> None:
        if offset < self._log_start or offset > self.next_offset:
            raise OffsetOutOfRange(
                f"offset {offset} is outside [{self._log_start}, {self.next_offset}] "
                f"of {self.directory}"
            )

    def _ledger_index(self, offset: int) -> int:
        """Index in the ledger list of the ledger holding ``offset`` (< next offset)."""
        return bisect_right(self._ledgers, offset, key=lambda item: item.facts.first_offset) - 1

    def _use(self, ledger: Ledger) -> Ledger:
        """Note a use of ``ledger``'s file; keeps few sealed ledger files open."""
        if ledger is self._ledgers[-1]:
            return ledger
        self._open_sealed[ledger.ledger_id] = ledger
        self._open_sealed.move_to_end(ledger.ledger_id)
        while len(self._open_sealed) > _MAX_OPEN_SEALED:
            _, oldest = self._open_sealed.popitem(last=False)
            oldest.close()
        return ledger

    # -- recovery ----------------------------------------------------------------------

    def _recover(self) -> None:
        """Open the ledgers (``recovery``), report damage, and record what was found (the
        metadata is not written again when it says so already: a clean stop's)."""
        found = recover(self.directory, self._config, self._clock)
        self._ledgers = found.ledgers
        self._log_start, self._next_ledger_id = found.log_start, found.next_ledger_id
        self._checkpoints.recovery_point = self._ledgers[-1].facts.copy()
        self._checkpoints.stored = found.metadata
        self._damage.recovered(self._ledgers, found.gaps)
        for damage in self.damaged_ranges():
            report(self.directory, damage)
        seq, metadata = self._checkpoints.snapshot(self._ledgers, self._log_start)
        if found.swap_markers or not self._checkpoints.stored_already(metadata):
            self._checkpoints.write(seq, metadata)
        for marker in found.swap_markers:  # the metadata describes the cleaned ledgers now
            marker.unlink(missing_ok=True)
        if found.swap_markers:
            fsync_dir(self.directory)

    def _start_empty(self) -> None:
        """A new partition: one empty ledger and its metadata, nothing fsynced."""
        ledger = Ledger.create(self.directory, 1, 0, self._clock(),
                               self._config.index_interval_bytes)
        ledger.facts.synced = True  # as far as the caller's sync goes: it is empty
        self._ledgers = [ledger]
        self._next_ledger_id = 2
        self._checkpoints.recovery_point = ledger.facts.copy()
        self._damage.recovered(self._ledgers, [])
        seq, metadata = self._checkpoints.snapshot(self._ledgers, self._log_start)
        self._checkpoints.write(seq, metadata, durable=False)
