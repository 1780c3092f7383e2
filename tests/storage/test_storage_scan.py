"""``scan_ledger``: which offset ranges of a ledger file it finds damaged, for each kind of
damage a disk or an operator can do (flipped bytes in a batch or in an entry header, a
file cut short), and that an intact ledger has none."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from broker_core.storage import LogConfig, PartitionLog
from broker_core.storage.damage import scan_ledger
from broker_core.storage.metadata import LedgerFacts
from tests.storage.test_storage_recovery import fill
from tests.storage_helpers import StoredEntry, flip_byte, stored_entries

Damager = Callable[[Path, list[StoredEntry]], None]


def _flip_batches(*which: int) -> Damager:
    def damage(path: Path, entries: list[StoredEntry]) -> None:
        for i in which:
            flip_byte(path, entries[i].position + entries[i].size - 2)
    return damage


def _garble_header(path: Path, entries: list[StoredEntry]) -> None:
    flip_byte(path, entries[2].position + 5)  # inside the index, under the header CRC


def _cut(path: Path, entries: list[StoredEntry]) -> None:
    os.truncate(path, entries[-1].position + 30)


# (damage, expected (first, end) offset ranges, reason fragment); 8 batches of 3 records
CASES: dict[str, tuple[Damager | None, list[tuple[int, int]], str]] = {
    "intact": (None, [], ""),
    "one batch": (_flip_batches(2), [(6, 9)], "CRC32C"),
    "two adjacent batches": (_flip_batches(2, 3), [(6, 9), (9, 12)], "CRC32C"),
    "the last batch": (_flip_batches(7), [(21, 24)], "CRC32C"),
    "an entry header": (_garble_header, [(6, 24)], "entry header"),
    "a file cut short": (_cut, [(21, 24)], "ends inside the batch"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_scan_finds_the_damaged_ranges(tmp_path: Path, case: str) -> None:
    damage, expected, reason = CASES[case]
    log = PartitionLog(tmp_path, LogConfig(segment_bytes=1 << 20))
    assert fill(log, 8) == 24
    ledger = log._ledgers[-1]
    path, facts = ledger.path, LedgerFacts(**vars(ledger.facts))
    log.close()
    if damage is not None:
        damage(path, stored_entries(path))
    found = scan_ledger(path, facts)
    assert [(d.first_offset, d.end_offset) for d in found] == expected
    assert all(reason in d.reason and d.file == path.name for d in found)


def test_scan_of_a_deleted_ledger_finds_nothing(tmp_path: Path) -> None:
    facts = LedgerFacts(1, 0, 3, size=100)
    assert scan_ledger(tmp_path / "0000000000000001.ledger", facts) == []
