"""What is known damaged in one file-engine partition, and which of its sealed ledgers
are still to be scanned since start-up (they were trusted at open: ``recovery``).

Damage never shortens the log: a damaged range is never served (a read inside it raises
DamagedRecords, reads stop before it) and internal readers skip it. Every method is
called with the partition's lock held.
"""

from __future__ import annotations

from pathlib import Path

from .damage import Damage, report, scan_ledger
from .errors import DamagedRecords
from .ledger import Ledger


class DamageBook:
    """The holes between ledgers, each ledger's damage (kept on the ledger) and the count
    of ledgers not yet scanned."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._gaps: list[Damage] = []
        self.unverified = 0
        """Sealed ledgers not yet scanned since start-up."""

    def recovered(self, ledgers: list[Ledger], gaps: list[Damage]) -> None:
        """Start from what recovery found."""
        self._gaps = gaps
        self.unverified = sum(not ledger.verified for ledger in ledgers)

    def ranges(self, ledgers: list[Ledger], log_start: int) -> list[Damage]:
        """The damaged offset ranges at or above ``log_start``, in offset order."""
        found = [*self._gaps, *(d for ledger in ledgers for d in ledger.damage)]
        return sorted((d for d in found if d.end_offset > log_start),
                      key=lambda d: d.first_offset)

    def verify(self, ledger: Ledger, log_start: int) -> None:
        """Scan ``ledger`` now if it was not since start-up."""
        if ledger.unverified is not None:
            self.verified(ledger, scan_ledger(ledger.path, ledger.unverified.copy()),
                          log_start)

    def verified(self, ledger: Ledger, found: list[Damage], log_start: int) -> None:
        """``ledger`` was scanned and ``found`` damaged: note and report what is new."""
        ledger.unverified = None
        self.unverified -= 1
        new = [d for d in found if all(known.position != d.position for known in ledger.damage)]
        ledger.note_damage(new)
        for item in new:
            if item.end_offset > log_start:
                report(self._directory, item)

    def dropped(self, ledgers: list[Ledger]) -> None:
        """``ledgers`` left the log (retention, DeleteRecords)."""
        self.unverified -= sum(not ledger.verified for ledger in ledgers)

    def check(self, ledger: Ledger, offset: int) -> None:
        """DamagedRecords if ``offset`` (held by ``ledger``) lies in a damaged range."""
        if not self._gaps and not ledger.damage:
            return
        for item in (*self._gaps, *ledger.damage):
            if item.first_offset <= offset < item.end_offset:
                raise DamagedRecords(
                    f"offset {offset} of {self._directory} is in damaged range "
                    f"[{item.first_offset}, {item.end_offset}) ({item.reason})",
                    item.first_offset, item.end_offset)
