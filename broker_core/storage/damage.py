"""Damaged records: what a ledger file lost or garbled, found by a scan of its entries.

A sealed ledger is trusted at start-up (its facts say how far it goes) and checked in full
the first time it is read afterwards: every entry header, the continuity of the offsets,
and every batch's shape and CRC32C. What fails becomes a :class:`Damage`, an offset range
that stays in the log (offsets are never reused) but is never served. A batch that fails
its CRC while its entry header is intact spans offsets up to the next entry's index; an
entry that cannot even be framed (a torn or garbled header, a file cut short) damages
everything from there to the ledger's recorded end.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import crc32c

from broker_core.codec.batch_header import (
    ATTRIBUTES_AT,
    BATCH_HEADER_SIZE,
    BATCH_LENGTH_OVERHEAD,
    HEAD_FIELDS,
    RECORD_BATCH_MAGIC,
    base_offset,
    crc_matches,
    last_offset_delta,
    shape_problem,
)

from .entry import ENTRY_HEADER_SIZE, ENTRY_HEADER_STRUCT, ENTRY_MAGIC, decode_entry_header
from .metadata import LedgerFacts

logger = logging.getLogger(__name__)

_SCAN_WINDOW = 1 << 20
_HEAD = ENTRY_HEADER_SIZE + BATCH_HEADER_SIZE
_PREFIX = ENTRY_HEADER_SIZE - 4  # the header bytes its CRC covers


@dataclass(frozen=True, slots=True)
class Damage:
    """Offsets ``[first_offset, end_offset)`` whose bytes ``[position, end_position)`` of
    the ledger ``file`` are unusable, and why. ``end_position`` is the ledger's recorded
    size when the rest of the ledger cannot be framed; positions are -1 for offsets that no
    ledger holds (a hole before ``file``)."""

    file: str
    first_offset: int
    end_offset: int
    position: int
    end_position: int
    reason: str

    @property
    def offsets(self) -> int:
        return self.end_offset - self.first_offset


def batch_problem(batch: memoryview, index: int) -> str:
    """Why a stored batch cannot be served as the entry at ``index`` ('' if it can)."""
    problem = shape_problem(batch)
    if problem:
        return problem
    if base_offset(batch) != index:
        return f"batch base offset {base_offset(batch)} differs from entry index {index}"
    if last_offset_delta(batch) < 0:
        return "negative lastOffsetDelta"
    if not crc_matches(batch):
        return "batch CRC32C mismatch"
    return ""


def scan_ledger(path: Path, facts: LedgerFacts) -> list[Damage]:
    """Check every entry of the ledger file at ``path`` against its recorded ``facts``.

    Reads the file through its own descriptor, so it may run in a thread beside readers
    and appenders of other ledgers. A file that is gone (retention) has no damage.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    try:
        return _scan(fd, path.name, facts)
    finally:
        os.close(fd)


def _scan(fd: int, name: str, facts: LedgerFacts) -> list[Damage]:
    """The scan loop: a fast path that only unpacks and checksums intact entries, and the
    exact checks (for the reason) where one fails."""
    end = facts.size
    found: list[Damage] = []
    window = memoryview(b"")
    at = 0  # file position of window[0]
    position = 0
    expected = facts.first_offset
    bad: tuple[int, int, str] | None = None  # (position, index, reason) awaiting its end
    unpack_entry = ENTRY_HEADER_STRUCT.unpack_from
    unpack_batch = HEAD_FIELDS.unpack_from
    crc = crc32c.crc32c
    while position < end:
        rel = position - at
        if rel + _HEAD > len(window):
            window = memoryview(os.pread(fd, min(_SCAN_WINDOW, end - position), position))
            at, rel = position, 0
        head_ok = rel + _HEAD <= len(window)
        if head_ok:
            magic, index, _stamp, length, header_crc = unpack_entry(window, rel)
            sound = (magic == ENTRY_MAGIC and length >= BATCH_HEADER_SIZE
                     and position + ENTRY_HEADER_SIZE + length <= end
                     and header_crc == crc(window[rel:rel + _PREFIX]))
            if sound and rel + ENTRY_HEADER_SIZE + length > len(window):  # a large batch
                window = memoryview(os.pread(fd, max(_SCAN_WINDOW, ENTRY_HEADER_SIZE + length),
                                             position))
                at, rel = position, 0
            body = rel + ENTRY_HEADER_SIZE
            if sound and bad is None and index == expected and body + length <= len(window):
                base, batch_length, batch_magic, batch_crc, _attrs, delta = \
                    unpack_batch(window, body)
                if (base == index and batch_length + BATCH_LENGTH_OVERHEAD == length
                        and batch_magic == RECORD_BATCH_MAGIC and delta >= 0
                        and batch_crc == crc(window[body + ATTRIBUTES_AT:body + length])):
                    expected = index + delta + 1
                    position += ENTRY_HEADER_SIZE + length
                    continue
        # something failed: find out what, with the exact checks
        header = decode_entry_header(window, rel)
        problem = ""
        if header is None:
            problem = "invalid or missing entry header"
        elif bad is None and header.index != expected:
            problem = f"entry index {header.index} where {expected} was expected"
        elif bad is not None and header.index <= bad[1]:
            problem = f"entry index {header.index} does not follow {bad[1]}"
        elif position + ENTRY_HEADER_SIZE + header.batch_length > end:
            problem = "entry runs past the ledger's recorded end"
        elif rel + ENTRY_HEADER_SIZE + header.batch_length > len(window):
            problem = "the file ends inside the batch"
        if problem or header is None:
            first, start, reason = bad if bad is not None else (position, expected, problem)
            found.append(Damage(name, start, facts.next_offset, first, end, reason))
            return found
        if bad is not None:
            found.append(Damage(name, bad[1], header.index, bad[0], position, bad[2]))
            bad = None
        batch = window[rel + ENTRY_HEADER_SIZE:rel + ENTRY_HEADER_SIZE + header.batch_length]
        problem = batch_problem(batch, header.index)
        if problem:
            bad = (position, header.index, problem)
        else:
            expected = header.index + last_offset_delta(batch) + 1
        position += ENTRY_HEADER_SIZE + header.batch_length
    if bad is not None:
        found.append(Damage(name, bad[1], facts.next_offset, bad[0], end, bad[2]))
    elif expected != facts.next_offset:
        found.append(Damage(name, expected, facts.next_offset, end, end,
                            f"entries end at offset {expected}, not {facts.next_offset}"))
    return found


def hole(before: str, first_offset: int, end_offset: int, reason: str) -> Damage:
    """Offsets no ledger holds, just before the ledger file ``before``."""
    return Damage(before, first_offset, end_offset, -1, -1, reason)


def report(directory: Path, damage: Damage) -> None:
    """The one ERROR line for a damaged range: partition directory, file, offsets, cause."""
    where = (f"before ledger file {damage.file}" if damage.position < 0 else
             f"in ledger file {damage.file} (bytes {damage.position}..{damage.end_position})")
    logger.error(
        "%s: offsets [%d, %d) %s are damaged (%s); they are not served: fetches there "
        "answer CORRUPT_MESSAGE until the file is restored or DeleteRecords moves the log "
        "start to %d", directory, damage.first_offset, damage.end_offset, where,
        damage.reason, damage.end_offset)
