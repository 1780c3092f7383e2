"""``PartitionLog``: the managed ledger of one partition.

A partition is an ordered list of ledgers; the last one is open for appends, the others
are sealed. Offsets are continuous: the base offset of each appended batch is the
partition's next offset, which then advances by the batch's lastOffsetDelta + 1.

The files, durability, offline handling and locking are ``PartitionFiles``'
(``partition_files``, whose docstring describes them); this adds appending, reading,
trimming (deletion and retention) and the cleaner's swap of sealed ledgers.

What was trusted at open is scanned on its first read (``verify_at``, from a worker
thread). Damage (``damage``) never shortens the log: a ledger keeps the offsets the
metadata records, the ledgers after it are kept, a damaged range is never served (reads
stop before it, a read inside it raises DamagedRecords) and internal readers skip it.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator, Sequence

from broker_core.codec.batch_header import (
    BASE_OFFSET_END,
    BatchHeader,
    base_offset_bytes,
    check_append,
)
from broker_core.codec.varints import Buffer

from .damage import batch_problem, scan_ledger
from .entry import ENTRY_HEADER_SIZE, encode_entry_header
from .errors import DamagedRecords, OffsetOutOfRange
from .fsutil import fsync_dir
from .ledger import SWAP_SUFFIX, Ledger
from .ledger_reader import LedgerReader
from .model import BatchInfo
from .partition_files import PartitionFiles
from .region import FileRegion
from .retention import RetainsSegments, RetentionCut, retention_cut
from .segments import SealedSegment, check_cover
from .timestamps import first_at_or_after

logger = logging.getLogger(__name__)

_ITER_WINDOW = 256 * 1024
_SPACE_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT})
"""Write errors after which the log stays online (a failed append is cut back)."""


class PartitionLog(PartitionFiles, RetainsSegments):
    """The managed ledger of one partition; see the module docstring."""

    # -- appending ---------------------------------------------------------------------

    def append(self, batch: Buffer, header: BatchHeader) -> int:
        """Store one record batch and return the base offset assigned to it.

        Writes the entry with the next offset as the batch's baseOffset (bytes 0..8, in a
        copy of their own: ``batch`` is not copied nor changed; it may be the request's
        bytes), rolling to a new ledger first if the open one is too big or too old, and
        advances the next offset by the header's ``last_offset_delta + 1``. The caller
        has validated the batch (CRC, record count) and read its ``header``; this checks
        only that the header fits the bytes given (ValueError otherwise).
        """
        check_append(batch, header)
        entry_size = ENTRY_HEADER_SIZE + len(batch)
        with self._lock:
            self._check_open()
            now = self._clock()
            facts = self._ledgers[-1].facts
            config = self._config
            if facts.size > 0 and (
                facts.size + entry_size > config.segment_bytes
                or now - facts.min_broker_timestamp >= config.segment_ms
            ):
                self._roll_locked(now)
            ledger = self._ledgers[-1]
            base = ledger.facts.next_offset
            entry = encode_entry_header(base, now, len(batch))
            try:
                ledger.append((entry, base_offset_bytes(base), memoryview(batch)[BASE_OFFSET_END:]),
                              base, base + header.last_offset_delta, header.max_timestamp, now)
            except OSError as exc:
                if exc.errno in _SPACE_ERRORS:
                    raise
                raise self._go_offline("a write", exc) from exc
            return base


    # -- reading -----------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int) -> list[memoryview | FileRegion]:
        """Record batches from the one containing ``offset``, up to ``max_bytes`` in total.

        The first batch is returned whole even if it alone is larger than ``max_bytes``
        (KIP-74); later batches only while the total stays within ``max_bytes``. Crosses
        ledger boundaries. Batches of ``REGION_MIN_BYTES`` or more stay in the file as
        :class:`FileRegion` (release them), smaller ones are memoryviews of one read.
        Empty if ``offset == next_offset``; OffsetOutOfRange if ``offset`` is below the
        log start or above the next offset.
        """
        with self._lock:
            self._check_open()
            self._check_offset(offset)
            if offset == self.next_offset:
                return []
            i = self._ledger_index(offset)
            ledger = self._use(self._ledgers[i])
            if not ledger.verified:  # a caller that did not call verify_at first
                self._damage.verify(ledger, self._log_start)
            self._damage.check(ledger, offset)
            start = ledger.locate(offset).position
            stop = ledger.stop_after(start)
            out, taken, reached_end = ledger.read_regions(start, max_bytes, True, stop)
            while reached_end and stop == ledger.facts.size and i + 1 < len(self._ledgers):
                i += 1
                following = self._ledgers[i]
                if following.facts.first_offset != ledger.facts.next_offset \
                        or not following.verified:
                    break  # a hole, or a ledger to verify first: the next fetch starts there
                ledger = self._use(following)
                stop = ledger.stop_after(0)
                more, size, reached_end = ledger.read_regions(0, max_bytes - taken, False, stop)
                out.extend(more)
                taken += size
            return out

    # -- damage ------------------------------------------------------------------------

    def needs_verification(self, offset: int) -> bool:
        """Whether a read at ``offset`` would first scan its ledger (see verify_at)."""
        if not self._damage.unverified or self._closed:
            return False
        last = self._ledgers[-1]
        if offset >= last.facts.first_offset:  # the usual case: a consumer at the tail
            return not last.verified and offset < last.facts.next_offset
        with self._lock:
            if self._closed or not self._log_start <= offset < self.next_offset:
                return False
            return not self._ledgers[self._ledger_index(offset)].verified

    def verify_at(self, offset: int) -> None:
        """Scan the ledger holding ``offset`` if it was not since start-up (CRC32C
        of every batch); reads run meanwhile, only the result is recorded under the lock.
        Meant for a worker thread: it reads the whole ledger file."""
        with self._lock:
            if self._closed or not self._log_start <= offset < self.next_offset:
                return
            ledger = self._ledgers[self._ledger_index(offset)]
            if ledger.unverified is None:
                return
            facts = ledger.unverified.copy()
        found = scan_ledger(ledger.path, facts)
        with self._lock:
            if not self._closed and not ledger.verified \
                    and any(item is ledger for item in self._ledgers):
                self._damage.verified(ledger, found, self._log_start)

    def _check_damage(self, offset: int) -> None:
        """DamagedRecords if ``offset`` lies in a damaged range."""
        self._damage.check(self._ledgers[self._ledger_index(offset)], offset)

    def headers_from(self, offset: int) -> Iterator[BatchInfo]:
        return self.batches_from(offset)  # whole batches: reading a file costs no more

    def batches_from(self, offset: int) -> Iterator[BatchInfo]:
        """Iterate the stored batches from the one containing ``offset`` to the end.

        The range check happens at call time (OffsetOutOfRange). The iterator follows
        the log as it is when each batch is fetched: it continues into ledgers rolled
        meanwhile, and stops early if retention removes the ledger being iterated.
        """
        with self._lock:
            self._check_open()
            self._check_offset(offset)
            offset = self._past_damage(offset)
            if offset >= self.next_offset:
                return iter(())
            ledger = self._use(self._ledgers[self._ledger_index(offset)])
            position = ledger.locate(offset).position
        return self._iterate(ledger, position, offset)

    def _past_damage(self, offset: int) -> int:
        """``offset``, or the end of the damaged ranges it falls in (internal readers skip
        damage; fetch answers it)."""
        while True:
            try:
                self._check_damage(offset)
            except DamagedRecords as damaged:
                offset = damaged.end_offset
                if offset < self.next_offset:
                    continue
            return offset

    def _iterate(self, ledger: Ledger, position: int, resume: int) -> Iterator[BatchInfo]:
        """Batches from ``position`` of ``ledger`` (where offset ``resume`` is) on; a ledger
        the cleaner swapped meanwhile is followed into its successor at the next offset."""
        reader = LedgerReader(ledger, _ITER_WINDOW)
        while True:
            with self._lock:
                if self._closed:
                    return
                if not any(item is ledger for item in self._ledgers):
                    successor = next((item for item in self._ledgers  # cleaned (merged)
                                      if item.ledger_id <= ledger.ledger_id
                                      and item.facts.first_offset <= ledger.facts.first_offset
                                      < item.facts.next_offset), None)
                    if successor is None:
                        return
                    ledger, reader = successor, LedgerReader(successor, _ITER_WINDOW)
                    position = ledger.walk_end if resume >= ledger.facts.next_offset \
                        else ledger.locate(resume).position
                    continue
                if position >= ledger.walk_end:
                    if ledger is self._ledgers[-1]:
                        return
                    ledger = self._ledgers[self._ledgers.index(ledger) + 1]
                    reader = LedgerReader(ledger, _ITER_WINDOW)
                    position = 0
                    continue
                skip = ledger.skip_to(position)
                if skip is not None:
                    position = skip
                    continue
                self._use(ledger)
                meta = reader.entry_at(position)
                batch = reader.batch(meta)
                # a ledger not scanned yet: check each batch instead (damage is skipped)
                intact = ledger.verified or not batch_problem(batch, meta.index)
            if intact:
                yield BatchInfo(
                    meta.index, meta.last_offset, meta.max_timestamp, meta.broker_timestamp,
                    batch
                )
            position, resume = meta.end, meta.last_offset + 1

    def find_first_batch_with_timestamp_at_least(self, timestamp: int,
                                                 from_offset: int = 0) -> BatchInfo | None:
        """The first batch at or after the log start and ``from_offset`` whose
        maxTimestamp >= ``timestamp`` (ledgers whose recorded max timestamp is lower are
        skipped without reading them)."""
        with self._lock:
            self._check_open()
            return first_at_or_after(self._ledgers, max(self._log_start, from_offset),
                                     timestamp, self._use)

    def batch_with_max_timestamp(self, from_offset: int = 0) -> BatchInfo | None:
        """The batch with the largest maxTimestamp (the earliest one on ties) at or after
        the log start and ``from_offset``, or None."""
        with self._lock:
            self._check_open()
            return self._max_timestamps.batch(self._ledgers, max(self._log_start, from_offset),
                                              self._use)

    # -- trimming ----------------------------------------------------------------------

    def delete_records_before(self, offset: int) -> int:
        """Move the log start up to ``offset`` (DeleteRecords) and drop ledgers below it.

        ``offset`` must not exceed the next offset (OffsetOutOfRange); the log start
        never moves backwards. Returns the new log start offset.
        """
        with self._lock:
            self._check_open()
            if offset < 0 or offset > self.next_offset:
                raise OffsetOutOfRange(
                    f"offset {offset} is outside [0, {self.next_offset}] of {self.directory}"
                )
            if offset <= self._log_start:
                return self._log_start
            self._roll_if_below_locked(offset)
            self._drop_prefix_locked(self._sealed_below(offset), offset)
            return self._log_start

    def retention_due(self) -> RetentionCut | None:
        """Whole ledgers past retention (``retention.retention_drops``): by time those
        whose newest broker timestamp is more than ``retention_ms`` old, by size the
        oldest while the partition would still hold ``retention_bytes`` without them; the
        open one too when every sealed one goes and it is due as well."""
        with self._lock:
            self._check_open()
            segments = [(ledger.facts.first_offset, ledger.facts.size,
                         ledger.facts.max_broker_timestamp) for ledger in self._ledgers]
            return retention_cut(segments, self.next_offset, self._clock(), self._config)

    def drop_retained(self, cut: RetentionCut) -> int:
        with self._lock:
            self._check_open()
            self._roll_if_below_locked(cut.keep_from)
            count = self._sealed_below(cut.keep_from)
            if count:
                self._drop_prefix_locked(count)
            return count

    def _roll_if_below_locked(self, offset: int) -> None:
        """Roll when the open ledger holds something and ends at or before ``offset``, so
        that a drop below ``offset`` takes it too (the new ledger's metadata is stored by
        that drop: lock held)."""
        open_facts = self._ledgers[-1].facts
        if open_facts.size > 0 and open_facts.next_offset <= offset:
            self._roll_locked(self._clock(), store=False)

    def _sealed_below(self, offset: int) -> int:
        """How many of the first sealed ledgers end at or before ``offset`` (lock held)."""
        count = 0
        while count < len(self._ledgers) - 1 and self._ledgers[count].facts.next_offset <= offset:
            count += 1
        return count

    def _drop_prefix_locked(self, count: int, log_start: int = 0) -> None:
        """Drop the first ``count`` ledgers and move the log start up to ``log_start`` (at
        least to the first kept ledger); if the metadata cannot be written (a full disk),
        nothing changes and the error is raised."""
        dropped = self._ledgers[:count]
        previous = self._log_start
        del self._ledgers[:count]
        self._log_start = max(previous, log_start, self._ledgers[0].facts.first_offset)
        try:
            self._store_metadata_locked()
        except BaseException:
            self._ledgers[:0] = dropped
            self._log_start = previous
            raise
        self._damage.dropped(dropped)
        for ledger in dropped:
            self._open_sealed.pop(ledger.ledger_id, None)
            ledger.delete()
        if dropped:
            logger.info(
                "%s: dropped %d ledger(s); log start offset is %d",
                self.directory,
                len(dropped),
                self._log_start,
            )

    # -- cleaning ----------------------------------------------------------------------

    def sealed_segments(self) -> list[SealedSegment]:
        """The sealed ledgers holding offsets at or above the log start, in offset order."""
        with self._lock:
            self._check_open()
            return [SealedSegment(ledger.ledger_id, ledger.facts.first_offset,
                                  ledger.facts.next_offset, ledger.facts.size,
                                  ledger.facts.min_broker_timestamp,
                                  ledger.facts.max_broker_timestamp,
                                  ledger.facts.max_timestamp)
                    for ledger in self._ledgers[:-1]
                    if ledger.facts.next_offset > self._log_start]

    def _replaceable(self, segments: Sequence[SealedSegment]) -> int | None:
        """Where in the ledger list the ledgers ``segments`` name start, if they are still
        as given, one after another: sealed, scanned and undamaged (lock held). The ledger
        after them is fsynced before the swap, so whether they were does not matter."""
        sealed = self._ledgers[:-1]
        at = next((i for i, ledger in enumerate(sealed)
                   if ledger.ledger_id == segments[0].ident), None)
        if at is None or at + len(segments) > len(sealed):
            return None
        for ledger, segment in zip(sealed[at:], segments, strict=False):
            facts = ledger.facts
            same = (ledger.ledger_id, facts.first_offset, facts.next_offset, facts.size) == \
                (segment.ident, segment.first_offset, segment.next_offset, segment.size_bytes)
            if not (same and facts.sealed and ledger.verified and not ledger.damage):
                return None
        return at

    def replace_segments(self, segments: Sequence[SealedSegment],
                         batches: Sequence[BatchInfo]) -> bool:
        """Swap sealed ledgers (one, or several adjacent ones merged into the first) for
        their cleaned successor (see the Protocol).

        The successor is written to ``<first ledger>.cleaned`` and fsynced outside the
        lock; then, under it, renamed to ``<first ledger>.swap`` (the commit point:
        recovery finishes a swap it finds, and removes the ledgers after it that the
        successor covers), the metadata written with the successor's facts in place of the
        ledgers', the swap file renamed over the first ledger and the others deleted.
        Readers holding an old ledger's file keep reading it.
        """
        check_cover(segments, batches)
        with self._lock:
            self._check_open()
            at = self._replaceable(segments)
            if at is None:
                return False
            old_facts = self._ledgers[at].facts.copy()
        old_facts.next_offset = segments[-1].next_offset
        temp, facts = Ledger.write_cleaned(self.directory, old_facts, batches,
                                           self._config.index_interval_bytes)
        with self._lock:
            at = self._replaceable(segments) if not self._closed else None
            if at is None:
                temp.unlink(missing_ok=True)
                return False
            old = self._ledgers[at:at + len(segments)]
            swap = old[0].path.with_name(old[0].path.name + SWAP_SUFFIX)
            os.replace(temp, swap)
            fsync_dir(self.directory)
            self._ledgers[at:at + len(old)] = [
                Ledger(self.directory, facts, self._config.index_interval_bytes)]
            try:
                self._store_metadata_locked()
            except BaseException:
                self._ledgers[at:at + 1] = old
                swap.unlink(missing_ok=True)
                raise
            os.replace(swap, old[0].path)
            for ledger in old:
                self._open_sealed.pop(ledger.ledger_id, None)
                if ledger is old[0]:
                    ledger.close()
                else:
                    ledger.delete()
            fsync_dir(self.directory)
        return True
