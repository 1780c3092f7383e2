"""One ledger: an append-only file of entries, its recorded facts and its sparse index.

A ledger file is a sequence of entries (see ``entry``). Bytes below the ledger's
recorded size never change, so readers may cache windows of the file. The sparse
index maps the base offset of every entry that starts at least
``index_interval_bytes`` after the previously indexed one to its file position; it is
built lazily, by walking entry headers (never whole batches), as far as a lookup needs,
and kept current by appends once it covers the whole ledger.

Reading entries through a cached window is ``ledger_reader``'s; verifying a ledger's
unsynced tail at open (``recover_tail``) is ``recovery``'s.
"""

from __future__ import annotations

import logging
import os
from array import array
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from pathlib import Path

from broker_core.codec.batch_header import BATCH_HEADER_SIZE

from .damage import Damage
from .entry import (
    ENTRY_HEADER_SIZE,
    ENTRY_HEADER_STRUCT,
    ENTRY_MAGIC,
    encode_entry_header,
)
from .errors import CorruptLedger
from .ledger_reader import EntryMeta, LedgerReader
from .metadata import LedgerFacts
from .model import BatchInfo
from .region import FileRegion

logger = logging.getLogger(__name__)

LEDGER_SUFFIX = ".ledger"
CLEANED_SUFFIX = ".cleaned"
"""A cleaned ledger being written (``<ledger file>.cleaned``): removed at recovery."""
SWAPPED_SUFFIX = ".swapped"
"""An empty marker (``<ledger file>.swapped``) that recovery leaves while it completes a
swap, until the partition's metadata describes the cleaned ledger: a crash in between
finds it and takes the ledger's facts from its file again."""
SWAP_SUFFIX = ".swap"
"""A cleaned ledger complete and fsynced (``<ledger file>.swap``), about to replace its
ledger: recovery completes the swap."""
_WRITE_CHUNK = 1 << 20
_HEADER_WINDOW = 16 * 1024
_INDEX_WINDOW = 32 * 1024
_READ_SLACK = 4096
# batches at least this large are sent from the file (sendfile) instead of read
REGION_MIN_BYTES = 64 * 1024
_HEAD_READ = ENTRY_HEADER_SIZE + BATCH_HEADER_SIZE  # an entry header and a v2 batch header


def ledger_file_name(ledger_id: int) -> str:
    """The file name of ledger ``ledger_id`` (zero-padded so names sort by id)."""
    return f"{ledger_id:016d}{LEDGER_SUFFIX}"


def parse_ledger_file_name(name: str) -> int | None:
    """The ledger id encoded in a file name, or None if it is not a ledger file."""
    stem = name.removesuffix(LEDGER_SUFFIX)
    if stem == name or not stem.isdigit() or not stem.isascii():
        return None
    return int(stem)


def _iov_max() -> int:
    """The most buffers one ``pwritev`` takes (Linux: 1024; more is EINVAL)."""
    try:
        limit = os.sysconf("SC_IOV_MAX")
    except (ValueError, OSError):
        return _IOV_MAX_FALLBACK
    return limit if limit > 0 else _IOV_MAX_FALLBACK


_IOV_MAX_FALLBACK = 16  # POSIX's least IOV_MAX (_XOPEN_IOV_MAX)
IOV_MAX = _iov_max()


def _pwrite_all(fd: int, parts: Sequence[bytes | bytearray | memoryview],
                position: int) -> None:
    """Write ``parts`` one after another at ``position``, whole: in calls of at most
    :data:`IOV_MAX` buffers (a cleaned ledger's chunk holds two per batch: thousands)."""
    views = [memoryview(part) for part in parts if len(part)]
    first = 0  # the first view not wholly written
    while first < len(views):
        written = os.pwritev(fd, views[first:first + IOV_MAX], position)
        if written <= 0:
            raise OSError(f"pwritev wrote {written} bytes")
        position += written
        while first < len(views) and written >= len(views[first]):
            written -= len(views[first])
            first += 1
        if written:
            views[first] = views[first][written:]


class Ledger:
    """One ledger file with its facts and sparse index. Not thread-safe by itself."""

    def __init__(self, directory: Path, facts: LedgerFacts, index_interval_bytes: int) -> None:
        self.path = directory / ledger_file_name(facts.ledger_id)
        self.facts = facts
        self.index_interval_bytes = index_interval_bytes
        self._fd: int | None = None
        self._index_offsets = array("q")
        self._index_positions = array("q")
        self._indexed_to = 0
        self._since_index = 0
        self.unverified: LedgerFacts | None = None
        """The facts of the part not checked since start-up (trusted, to be scanned on first
        read); None once every entry was written by this process or scanned."""
        self.damage: list[Damage] = []
        self._skip: dict[int, int] = {}  # position of a damaged entry -> position after it
        self._walk_end: int | None = None  # where entries can no longer be framed

    @classmethod
    def create(
        cls,
        directory: Path,
        ledger_id: int,
        first_offset: int,
        created_ms: int,
        index_interval_bytes: int,
    ) -> Ledger:
        """Create a new, empty ledger file (which must not exist yet)."""
        facts = LedgerFacts(ledger_id, first_offset, first_offset, created_ms=created_ms)
        ledger = cls(directory, facts, index_interval_bytes)
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        ledger._fd = os.open(ledger.path, flags, 0o644)
        return ledger

    @classmethod
    def write_cleaned(cls, directory: Path, old: LedgerFacts, batches: Sequence[BatchInfo],
                      index_interval_bytes: int) -> tuple[Path, LedgerFacts]:
        """Write ``batches`` (offsets ``[old.first_offset, old.next_offset)``) as the cleaned
        successor of the ledger ``old`` describes, to ``<its file>.cleaned``, fsynced; return
        that path and the facts of its content (sealed, synced)."""
        facts = LedgerFacts(old.ledger_id, old.first_offset, old.first_offset,
                            created_ms=old.created_ms, sealed=True, synced=True)
        path = directory / (ledger_file_name(old.ledger_id) + CLEANED_SUFFIX)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            parts: list[bytes | memoryview] = []
            pending = 0
            for info in batches:
                batch = memoryview(info.batch)
                parts += [encode_entry_header(info.base_offset, info.broker_timestamp,
                                              len(batch)), batch]
                pending += ENTRY_HEADER_SIZE + len(batch)
                facts.note_entry(info.base_offset, info.last_offset, info.max_timestamp,
                                 info.broker_timestamp, ENTRY_HEADER_SIZE + len(batch))
                if pending >= _WRITE_CHUNK:
                    _pwrite_all(fd, parts, facts.size - pending)
                    parts, pending = [], 0
            _pwrite_all(fd, parts, facts.size - pending)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        os.close(fd)
        return path, facts

    @property
    def ledger_id(self) -> int:
        return self.facts.ledger_id

    def fd(self) -> int:
        """The ledger's file descriptor, opened on first use."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        return self._fd

    def file_size(self) -> int:
        return os.fstat(self.fd()).st_size

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def delete(self) -> None:
        """Close and unlink the file."""
        self.close()
        self.path.unlink(missing_ok=True)

    def reader(self, window: int = _HEADER_WINDOW) -> LedgerReader:
        return LedgerReader(self, window)

    # -- damage ----------------------------------------------------------------------

    def note_damage(self, found: Sequence[Damage]) -> None:
        """Remember damaged ranges (found by a scan) so that walks and reads avoid them."""
        for item in found:
            if any(known.position == item.position for known in self.damage):
                continue
            self.damage.append(item)
            if item.end_position >= self.facts.size and self.facts.sealed:
                self._walk_end = min(item.position, self._walk_end or item.position)
            elif item.end_position > item.position:  # appends may follow in an open ledger
                self._skip[item.position] = item.end_position
        self.damage.sort(key=lambda item: item.position)

    @property
    def verified(self) -> bool:
        return self.unverified is None

    def skip_to(self, position: int) -> int | None:
        """Where the entry after a damaged one at ``position`` starts (None if not damaged)."""
        return self._skip.get(position) if self._skip else None

    @property
    def walk_end(self) -> int:
        """Where walks over entries stop: the recorded size, or an unframeable entry."""
        return self.facts.size if self._walk_end is None else self._walk_end

    def stop_after(self, position: int) -> int:
        """Where a read starting at ``position`` must stop: the next damage or the end."""
        for item in self.damage:
            if item.position >= position:
                return item.position
        return self.facts.size

    # -- appending -------------------------------------------------------------------

    def append(
        self, parts: Sequence[bytes | bytearray | memoryview], base: int, last: int,
        max_ts: int, broker_ts: int
    ) -> None:
        """Write one entry (its header and its batch, in ``parts``) at the end; on failure
        the file is cut back to its old size."""
        position = self.facts.size
        entry_size = sum(len(part) for part in parts)
        fd = self.fd()
        try:
            _pwrite_all(fd, parts, position)
        except BaseException:
            try:
                os.ftruncate(fd, position)
            except OSError:
                logger.exception("%s: could not cut back a failed append", self.path)
            raise
        if self._indexed_to == position:
            self._note_index(base, position, entry_size)
            self._indexed_to = position + entry_size
        self.facts.note_entry(base, last, max_ts, broker_ts, entry_size)

    # -- index -----------------------------------------------------------------------

    def _note_index(self, offset: int, position: int, entry_size: int) -> None:
        if not self._index_offsets or self._since_index >= self.index_interval_bytes:
            self._index_offsets.append(offset)
            self._index_positions.append(position)
            self._since_index = 0
        self._since_index += entry_size

    def ensure_index(self, upto: int | None = None) -> None:
        """Extend the sparse index over entries not yet indexed.

        Walks entry headers only (a tight loop over windows of the file, trusting the
        bytes below the recorded size). With ``upto``, stops once an entry whose index
        is beyond ``upto`` has been indexed, so the entry holding ``upto`` is covered.
        """
        end = self.walk_end
        position = self._indexed_to
        if position >= end:
            return
        fd = self.fd()
        unpack = ENTRY_HEADER_STRUCT.unpack_from
        offsets, positions = self._index_offsets, self._index_positions
        interval = self.index_interval_bytes
        since = self._since_index
        skip = self._skip
        buf = b""
        buf_start = position
        try:
            while position < end:
                if skip and position in skip:
                    position = skip[position]
                    continue
                rel = position - buf_start
                if rel + ENTRY_HEADER_SIZE > len(buf):
                    buf = os.pread(fd, min(_INDEX_WINDOW, end - position), position)
                    buf_start, rel = position, 0
                    if len(buf) < ENTRY_HEADER_SIZE:
                        raise CorruptLedger(f"{self.path}: short entry header at {position}")
                magic, index, _, length, _ = unpack(buf, rel)
                if magic != ENTRY_MAGIC or length < BATCH_HEADER_SIZE:
                    raise CorruptLedger(f"{self.path}: no valid entry at position {position}")
                if not offsets or since >= interval:
                    offsets.append(index)
                    positions.append(position)
                    since = 0
                entry_size = ENTRY_HEADER_SIZE + length
                since += entry_size
                position += entry_size
                if upto is not None and index > upto:
                    break
        finally:
            self._indexed_to = position
            self._since_index = since

    def iter_entries(self, start: int, reader: LedgerReader | None = None) -> Iterator[EntryMeta]:
        """Entry headers from file position ``start`` to the ledger's current end."""
        reader = reader or self.reader()
        position = start
        while position < self.walk_end:
            if position in self._skip:
                position = self._skip[position]
                continue
            meta = reader.entry_at(position)
            yield meta
            position = meta.end

    def locate(self, offset: int) -> EntryMeta:
        """The entry whose batch contains ``offset`` (which must lie in this ledger)."""
        self.ensure_index(offset)
        i = bisect_right(self._index_offsets, offset) - 1
        start = self._index_positions[i] if i >= 0 else 0
        for meta in self.iter_entries(start):
            if meta.last_offset >= offset:
                return meta
        raise CorruptLedger(f"{self.path}: offset {offset} not found")

    # -- reading ---------------------------------------------------------------------

    def read_regions(
        self, start: int, budget: int, take_first: bool, end: int | None = None
    ) -> tuple[list[memoryview | FileRegion], int, bool]:
        """As :meth:`read_batches`, but large batches are left in the file as regions.

        Entry headers are read one by one while batches are at least
        ``REGION_MIN_BYTES``; from the first smaller one on, the rest is read as a window.
        """
        end = self.facts.size if end is None else end
        out: list[memoryview | FileRegion] = []
        taken = 0
        while start < end:
            head = os.pread(self.fd(), _HEAD_READ, start)
            if len(head) < _HEAD_READ:
                raise CorruptLedger(f"{self.path}: short entry at position {start}")
            magic, _index, _stamp, length, _crc = ENTRY_HEADER_STRUCT.unpack_from(head)
            if magic != ENTRY_MAGIC or length < BATCH_HEADER_SIZE:
                raise CorruptLedger(f"{self.path}: no valid entry at position {start}")
            if length < REGION_MIN_BYTES:
                break
            if taken + length > budget and (out or not take_first):
                return out, taken, False
            out.append(FileRegion(self.fd(), start + ENTRY_HEADER_SIZE, length,
                                  head[ENTRY_HEADER_SIZE:]))
            taken += length
            start += ENTRY_HEADER_SIZE + length
        else:
            return out, taken, True
        more, size, reached_end = self.read_batches(start, budget - taken,
                                                    take_first and not out, end)
        out.extend(more)
        return out, taken + size, reached_end

    def read_batches(
        self, start: int, budget: int, take_first: bool, end: int | None = None
    ) -> tuple[list[memoryview], int, bool]:
        """Batches from the entry at ``start`` while their total size stays within ``budget``.

        With ``take_first`` the first batch is returned even if it alone exceeds the
        budget. Returns the batches, their total size, and whether ``end`` (by default
        the ledger's end) was reached (as opposed to the budget).
        """
        # One read covers the budget; headers were verified when written or recovered, so
        # here they are only unpacked (this loop is the fetch hot path).
        end = self.facts.size if end is None else end
        window = memoryview(os.pread(self.fd(), min(end - start, max(budget, 0) + _READ_SLACK),
                                     start)) if end > start else memoryview(b"")
        unpack = ENTRY_HEADER_STRUCT.unpack_from
        out: list[memoryview] = []
        taken = 0
        at = 0  # position in the window
        while start + at < end:
            if at + ENTRY_HEADER_SIZE > len(window):  # the window ran out: read on
                start, at = start + at, 0
                window = memoryview(os.pread(
                    self.fd(), min(end - start, max(budget - taken, 0) + _HEADER_WINDOW), start))
                if len(window) < ENTRY_HEADER_SIZE:
                    raise CorruptLedger(f"{self.path}: short entry header at {start}")
            magic, _index, _stamp, length, _crc = unpack(window, at)
            if magic != ENTRY_MAGIC or length < 0:
                raise CorruptLedger(f"{self.path}: no valid entry at position {start + at}")
            if taken + length > budget and (out or not take_first):
                return out, taken, False
            body = at + ENTRY_HEADER_SIZE
            if body + length > len(window):  # the batch goes past the window: read on
                start, at, body = start + at, 0, ENTRY_HEADER_SIZE
                window = memoryview(os.pread(
                    self.fd(), ENTRY_HEADER_SIZE + max(length, budget - taken) + _READ_SLACK,
                    start))
                if len(window) < ENTRY_HEADER_SIZE + length:
                    raise CorruptLedger(f"{self.path}: short batch at position {start}")
            out.append(window[body:body + length])
            taken += length
            at = body + length
        return out, taken, True
