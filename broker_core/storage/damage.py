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

from .batch_header import base_offset, crc_matches, last_offset_delta, shape_problem
from .entry import ENTRY_HEADER_SIZE, decode_entry_header
from .metadata import LedgerFacts

logger = logging.getLogger(__name__)

_SCAN_WINDOW = 1 << 20


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
    end = facts.size
    found: list[Damage] = []
    window = b""
    window_at = 0
    position = 0
    expected = facts.first_offset
    bad: tuple[int, int, str] | None = None  # (position, index, reason) awaiting its end

    def view(at: int, length: int) -> memoryview:
        nonlocal window, window_at
        if not (window_at <= at and at + length <= window_at + len(window)):
            window = os.pread(fd, min(max(length, _SCAN_WINDOW), end - at), at)
            window_at = at
        return memoryview(window)[at - window_at : at - window_at + length]

    def close_bad(end_offset: int, end_position: int) -> None:
        nonlocal bad
        if bad is not None:
            found.append(Damage(name, bad[1], end_offset, bad[0], end_position,
                                bad[2]))
            bad = None

    while position < end:
        header = decode_entry_header(view(position, ENTRY_HEADER_SIZE))
        problem = ""
        if header is None:
            problem = "invalid or missing entry header"
        elif bad is None and header.index != expected:
            problem = f"entry index {header.index} where {expected} was expected"
        elif bad is not None and header.index <= bad[1]:
            problem = f"entry index {header.index} does not follow {bad[1]}"
        elif position + ENTRY_HEADER_SIZE + header.batch_length > end:
            problem = "entry runs past the ledger's recorded end"
        if problem or header is None:
            first = bad[1] if bad is not None else expected
            found.append(Damage(name, first, facts.next_offset,
                                bad[0] if bad is not None else position, end,
                                bad[2] if bad is not None else problem))
            return found
        close_bad(header.index, position)
        size = ENTRY_HEADER_SIZE + header.batch_length
        batch = view(position + ENTRY_HEADER_SIZE, header.batch_length)
        if len(batch) < header.batch_length:
            found.append(Damage(name, header.index, facts.next_offset, position, end,
                                "the file ends inside the batch"))
            return found
        problem = batch_problem(batch, header.index)
        if problem:
            bad = (position, header.index, problem)
        else:
            expected = header.index + last_offset_delta(batch) + 1
        position += size
    close_bad(facts.next_offset, end)
    if bad is None and expected != facts.next_offset and not found:
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
