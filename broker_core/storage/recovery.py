"""Opening a partition's ledgers after a clean stop or a crash (the file engine).

The metadata file lists the ledgers; for the open ledger it records the facts as of its
last fsync (its *recovery point*), and each sealed ledger is marked ``synced`` once
fsynced. At open, sealed ledgers that are not known to be synced, or are shorter than
recorded, are scanned in full, and the open ledger from its recovery point; its torn tail
is truncated. A ledger the metadata lists keeps the offsets it records whatever is left of
its file (what is gone or garbled becomes damage, never served, never reused); offsets no
ledger holds are a hole; a ledger overlapping the one before it is set aside
(``*.dropped``). Ledger files the metadata does not know are adopted after the last listed
one and removed before it. With no readable metadata the log is rebuilt from its files.

A cleaned ledger left half-written by the log cleaner (``*.ledger.cleaned``) is removed; a
complete one (``*.ledger.swap``, renamed so once fsynced) replaces its ledger, whose facts
are then taken from a scan of the new file (the metadata may still describe the old one).
A cleaned ledger may have merged the ledgers after its own: the listed ledgers whose
offsets it covers are then removed. While it completes a swap, recovery leaves a marker
(``*.ledger.swapped``) that the partition removes once its metadata describes the cleaned
ledger, so a crash during recovery itself finds the swap again.

``recover_tail`` verifies one ledger's entries past what is trusted and truncates its
torn tail.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from broker_core.codec.batch_header import last_offset_delta, max_timestamp

from .config import LogConfig
from .damage import Damage, batch_problem, hole, scan_ledger
from .entry import ENTRY_HEADER_SIZE, decode_entry_header
from .fsutil import TEMP_SUFFIX, fsync_dir
from .ledger import (
    CLEANED_SUFFIX,
    SWAP_SUFFIX,
    SWAPPED_SUFFIX,
    Ledger,
    ledger_file_name,
    parse_ledger_file_name,
)
from .ledger_reader import LedgerReader
from .metadata import METADATA_FILE, LedgerFacts, PartitionMetadata, load_metadata

logger = logging.getLogger(__name__)

_RECOVERY_WINDOW = 1 << 20


@dataclass
class Recovered:
    """What a partition opens with: its ledgers in offset order (the last one open, the
    others sealed, closed and listed), the holes between them, the log start offset and
    the id the next new ledger takes."""

    ledgers: list[Ledger]
    gaps: list[Damage]
    log_start: int
    next_ledger_id: int
    swap_markers: list[Path]
    """The ``*.swapped`` markers to remove once the metadata is stored."""
    metadata: PartitionMetadata | None
    """What the metadata file held (None: absent or unreadable)."""


def recover(directory: Path, config: LogConfig, clock: Callable[[], int]) -> Recovered:
    """Recover the partition stored in ``directory`` (see the module docstring)."""
    return _Recovery(directory, config, clock).run()


class _Recovery:
    """The state of one recovery while it walks the ledgers."""

    def __init__(self, directory: Path, config: LogConfig, clock: Callable[[], int]) -> None:
        self.directory = directory
        self._config = config
        self._clock = clock
        self._ledgers: list[Ledger] = []
        self._gaps: list[Damage] = []
        self._next_ledger_id = 1
        self._swapped: set[int] = set()
        self._markers: list[Path] = []
        self._synced_open: tuple[int, int] | None = None
        """(ledger id, size) of the last listed ledger when it was recorded fsynced and the
        file held nothing beyond: it needs no fsync now."""

    def _finish_swaps(self, names: list[str]) -> bool:
        """Remove half-written cleaned ledgers; complete the swaps that were committed
        (``names``: the directory's files); whether it changed any file."""
        changed = False
        for name in sorted(names):
            for suffix in (CLEANED_SUFFIX, SWAP_SUFFIX, SWAPPED_SUFFIX):
                ledger_id = parse_ledger_file_name(name.removesuffix(suffix))
                if not name.endswith(suffix) or ledger_id is None:
                    continue
                path, changed = self.directory / name, True
                if suffix == CLEANED_SUFFIX:
                    logger.info("%s: removing %s (a cleaning cut short)", self.directory, name)
                    path.unlink(missing_ok=True)
                    continue
                marker = self._ledger_path(ledger_id).with_name(
                    ledger_file_name(ledger_id) + SWAPPED_SUFFIX)
                if suffix == SWAP_SUFFIX:
                    logger.info("%s: completing the swap of cleaned ledger %d", self.directory,
                                ledger_id)
                    marker.touch()
                    fsync_dir(self.directory)
                    path.replace(self._ledger_path(ledger_id))
                self._swapped.add(ledger_id)
                self._markers.append(marker)
        if changed:
            fsync_dir(self.directory)
        return changed

    def run(self) -> Recovered:
        """Recover the ledgers; see the module docstring."""
        directory = self.directory
        names = os.listdir(directory)  # once: 10,000 partitions open one after another
        if METADATA_FILE + TEMP_SUFFIX in names:
            (directory / (METADATA_FILE + TEMP_SUFFIX)).unlink(missing_ok=True)
        if self._finish_swaps(names):
            names = os.listdir(directory)
        on_disk: set[int] = set()
        for name in names:
            ledger_id = parse_ledger_file_name(name)
            if ledger_id is not None:
                on_disk.add(ledger_id)
        try:
            metadata = load_metadata(directory)
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("%s: unreadable %s (%s); rebuilding", directory, METADATA_FILE, exc)
            metadata = None
        # as read: the ledgers recovered below change their facts in place
        loaded = None if metadata is None else PartitionMetadata(
            metadata.next_offset, metadata.log_start_offset,
            [facts.copy() for facts in metadata.ledgers])
        plan: list[tuple[int, LedgerFacts | None]]
        if metadata is None:
            if on_disk:
                logger.warning(
                    "%s: no %s; rebuilding from %d ledger file(s)",
                    directory,
                    METADATA_FILE,
                    len(on_disk),
                )
            plan = [(ledger_id, None) for ledger_id in sorted(on_disk)]
            log_start: int | None = None
            recorded_next = 0
        else:
            known = [facts.ledger_id for facts in metadata.ledgers]
            last_known = known[-1] if known else 0
            for ledger_id in sorted(on_disk - set(known)):
                if ledger_id < last_known:
                    logger.info("%s: removing unlisted ledger %d", directory, ledger_id)
                    self._ledger_path(ledger_id).unlink(missing_ok=True)
                    on_disk.discard(ledger_id)
            plan = [(facts.ledger_id, facts) for facts in metadata.ledgers]
            plan += [(i, None) for i in sorted(on_disk) if i > last_known]
            log_start = metadata.log_start_offset
            recorded_next = metadata.next_offset
            self._next_ledger_id = last_known + 1
        if on_disk:
            self._next_ledger_id = max(self._next_ledger_id, max(on_disk) + 1)
        last_listed = metadata.ledgers[-1].ledger_id if metadata and metadata.ledgers else None

        rescanned: list[Ledger] = []
        assigned = 0  # offsets below this were recorded as stored: they are never reused
        for step, (ledger_id, facts) in enumerate(plan):
            if facts is not None:
                assigned = max(assigned, facts.next_offset)
            ledger = self._recover_ledger(
                ledger_id, facts, ledger_id == last_listed, ledger_id in on_disk, rescanned
            )
            if ledger is not None:
                if ledger.facts.empty and step < len(plan) - 1:
                    ledger.delete()
                else:
                    self._keep_recovered(ledger)

        last = self._ledgers[-1] if self._ledgers else None
        if last is None or last.walk_end < last.facts.size or last.facts.next_offset < assigned:
            # nothing to append to, or the last ledger lost entries it had recorded
            first = max(recorded_next, log_start or 0, assigned)
            if last is not None:
                first = max(first, last.facts.next_offset)
            created = Ledger.create(directory, self._next_ledger_id, first, self._clock(),
                                    self._config.index_interval_bytes)
            self._next_ledger_id += 1
            if last is not None:
                self._keep_recovered(created)
            else:
                self._ledgers.append(created)
        next_offset = self._ledgers[-1].facts.next_offset
        first_offset = self._ledgers[0].facts.first_offset
        start = first_offset if log_start is None else max(log_start, first_offset)
        if recorded_next > next_offset:
            logger.warning(
                "%s: metadata recorded next offset %d but only offsets below %d were found",
                directory,
                recorded_next,
                next_offset,
            )
        for ledger in self._ledgers[:-1]:
            ledger.facts.sealed = True
        open_ledger = self._ledgers[-1]
        open_ledger.facts.sealed = False
        for ledger in (*rescanned, open_ledger):
            if any(ledger is item for item in self._ledgers):
                if (ledger.ledger_id, ledger.facts.size) != self._synced_open \
                        or ledger in rescanned:
                    os.fsync(ledger.fd())  # a clean stop left nothing to fsync: skipped
                ledger.facts.synced = True
        for ledger in self._ledgers[:-1]:
            ledger.close()
        return Recovered(self._ledgers, self._gaps, min(start, next_offset),
                         self._next_ledger_id, sorted(set(self._markers)), loaded)

    def _recover_ledger(
        self,
        ledger_id: int,
        facts: LedgerFacts | None,
        is_last_listed: bool,
        exists: bool,
        rescanned: list[Ledger],
    ) -> Ledger | None:
        """Recover one ledger; None if its file is missing.

        A ledger the metadata lists keeps the offsets it records, whatever is left of its
        file: entries that are gone or garbled become damage (never served, never reused).
        Sealed ledgers that were fsynced are trusted now and scanned on first read; the tail
        of the open ledger beyond its recovery point is cut at the first bad entry, as a crash
        leaves it.
        """
        directory = self.directory
        interval = self._config.index_interval_bytes
        if not exists:
            if facts is not None:
                logger.warning("%s: ledger %d is missing (offsets [%d, %d))", directory,
                               ledger_id, facts.first_offset, facts.next_offset)
            return None
        if facts is None:
            first = self._ledgers[-1].facts.next_offset if self._ledgers else 0
            ledger = Ledger(directory, LedgerFacts(ledger_id, first, first), interval)
            recover_tail(ledger, 0, any_first_index=True)
            ledger.facts.created_ms = (
                ledger.facts.min_broker_timestamp if not ledger.facts.empty else self._clock()
            )
            rescanned.append(ledger)
            return ledger
        if ledger_id in self._swapped:  # a cleaned ledger: its facts come from its file
            ledger = Ledger(directory, LedgerFacts(ledger_id, facts.first_offset,
                                                   facts.first_offset,
                                                   created_ms=facts.created_ms), interval)
            recover_tail(ledger, 0)
            ledger.facts.sealed = True
            rescanned.append(ledger)
            return ledger
        ledger = Ledger(directory, facts, interval)
        file_size = ledger.file_size()
        if file_size > facts.size and not is_last_listed:
            logger.warning(
                "%s: sealed ledger %d has %d bytes beyond its recorded size; truncating",
                directory,
                ledger_id,
                file_size - facts.size,
            )
            os.ftruncate(ledger.fd(), facts.size)
        if facts.synced and file_size >= facts.size:
            # trusted now, scanned on first read (up to here: recover_tail checks the rest)
            ledger.unverified = facts.copy() if facts.size else None
            if is_last_listed:
                recover_tail(ledger, facts.size)
                if file_size == facts.size:
                    self._synced_open = (ledger_id, facts.size)
            return ledger
        if file_size < facts.size:
            logger.warning("%s: ledger %d is %d bytes but %d were recorded; scanning it",
                           directory, ledger_id, file_size, facts.size)
        ledger.facts.sealed = True  # what it lost ends it; a torn last one gets a successor
        ledger.note_damage(scan_ledger(ledger.path, facts))
        rescanned.append(ledger)
        return ledger

    def _keep_recovered(self, ledger: Ledger) -> None:
        """Append a recovered ledger to the list; offsets between it and the previous one
        are a hole, and a ledger overlapping the previous one is set aside."""
        if self._ledgers:
            expected = self._ledgers[-1].facts.next_offset
            first = ledger.facts.first_offset
            if self._ledgers[-1].ledger_id in self._swapped \
                    and ledger.facts.next_offset <= expected and ledger.facts.sealed:
                logger.info("%s: removing ledger %d, merged into cleaned ledger %d",
                            self.directory, ledger.ledger_id, self._ledgers[-1].ledger_id)
                ledger.delete()
                return
            if first < expected:
                logger.warning("%s: ledger %d starts at offset %d, below %d where the previous "
                               "one ends", self.directory, ledger.ledger_id, first, expected)
                ledger.close()
                self._set_aside(ledger.ledger_id)
                return
            if first > expected:
                self._gaps.append(hole(ledger.path.name, expected, first,
                                       "no ledger file holds them"))
        self._ledgers.append(ledger)

    def _ledger_path(self, ledger_id: int) -> Path:
        return self.directory / ledger_file_name(ledger_id)

    def _set_aside(self, ledger_id: int) -> None:
        """Rename a ledger file that cannot be part of the log to ``*.dropped``."""
        path = self._ledger_path(ledger_id)
        with contextlib.suppress(FileNotFoundError):
            path.replace(path.with_name(path.name + ".dropped"))
            logger.warning("%s: set aside %s", self.directory, path.name)


def recover_tail(ledger: Ledger, start: int, *, any_first_index: bool = False) -> None:
    """Verify ``ledger``'s entries from ``start`` (where the facts end) to the end of the file.

    Each entry must have a valid header, the expected index (the facts' next
    offset; with ``any_first_index`` the first entry of an empty ledger may have any
    index), a complete, well-formed batch whose base offset equals the index and
    whose CRC32C matches. The first entry that fails, and everything after it, is
    truncated away with a warning; the facts are updated for the good entries.
    """
    facts = ledger.facts
    if facts.size != start:
        raise ValueError(f"facts end at {facts.size}, recovery asked to start at {start}")
    fd = ledger.fd()
    file_size = os.fstat(fd).st_size
    reader = LedgerReader(ledger, _RECOVERY_WINDOW, limit=file_size)
    position = start
    problem = ""
    while position < file_size:
        if file_size - position < ENTRY_HEADER_SIZE:
            problem = "incomplete entry header"
            break
        header = decode_entry_header(reader.view(position, ENTRY_HEADER_SIZE))
        if header is None:
            problem = "invalid entry header"
            break
        if position + ENTRY_HEADER_SIZE + header.batch_length > file_size:
            problem = "incomplete batch"
            break
        if facts.empty and facts.size == 0 and any_first_index:
            facts.first_offset = facts.next_offset = header.index
        if header.index != facts.next_offset:
            problem = f"entry index {header.index} where {facts.next_offset} was expected"
            break
        batch = reader.view(position + ENTRY_HEADER_SIZE, header.batch_length)
        problem = batch_problem(batch, header.index)
        if problem:
            break
        last = header.index + last_offset_delta(batch)
        entry_size = ENTRY_HEADER_SIZE + header.batch_length
        facts.note_entry(
            header.index, last, max_timestamp(batch), header.broker_timestamp, entry_size
        )
        position += entry_size
    if position < file_size:
        logger.warning(
            "%s: %s at position %d; truncating %d bytes (entries from offset %d on)",
            ledger.path,
            problem,
            position,
            file_size - position,
            facts.next_offset,
        )
        os.ftruncate(fd, position)
        os.fsync(fd)
