"""PartitionLog recovery: restarts, crashes (kill -9), torn tails, lost metadata."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from kafka.record import MemoryRecords

from broker_core.storage import LogConfig, PartitionLog
from broker_core.storage.entry import ENTRY_HEADER_SIZE
from broker_core.storage.errors import DamagedRecords
from broker_core.storage.ledger import ledger_file_name
from broker_core.storage.metadata import METADATA_FILE
from tests.batches import numbered_batch
from tests.broker_process import REPO
from tests.storage_helpers import batch_bytes, headed, stored_entries

CONFIG = LogConfig(segment_bytes=600)


def fill(log: PartitionLog, batches: int, size: int = 3) -> int:
    """Append batches of ``size`` records whose values are their offsets; returns next."""
    for _ in range(batches):
        first = log.next_offset
        assert log.append(*headed(numbered_batch(first, size))) == first
    return log.next_offset


def all_records(log: PartitionLog) -> list[int]:
    """Every record's value, checking that it equals the record's offset (a read stops
    before a ledger not scanned since start-up, so this reads on as a consumer does)."""
    values: list[int] = []
    offset = log.log_start_offset
    while offset < log.next_offset:
        chunks = log.read(offset, 1 << 30)
        assert chunks, f"nothing read at {offset}"
        for view in chunks:
            records = MemoryRecords(batch_bytes(view))
            while records.has_next():
                for record in records.next_batch():
                    assert int(record.value) == record.offset
                    values.append(record.offset)
                    offset = record.offset + 1
    return values


def ledger_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.ledger"))


def test_close_and_reopen_continues(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, CONFIG)
    total = fill(log, 40)
    ledgers = log.ledger_count
    log.close()
    log = PartitionLog(tmp_path, CONFIG)
    assert (log.next_offset, log.ledger_count, log.log_start_offset) == (total, ledgers, 0)
    assert fill(log, 5) == total + 15
    assert all_records(log) == list(range(total + 15))
    log.close()


def test_reopen_without_close_keeps_everything(tmp_path: Path) -> None:
    crashed = PartitionLog(tmp_path, CONFIG)
    total = fill(crashed, 40)  # several rolls; the last metadata write was at a roll
    log = PartitionLog(tmp_path, CONFIG)  # the first instance is simply abandoned
    assert log.next_offset == total
    assert all_records(log) == list(range(total))
    assert fill(log, 2) == total + 6
    log.close()


def test_kill_9_right_after_append(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(REPO)!r})
        from pathlib import Path
        from kafka.record.default_records import DefaultRecordBatchBuilder
        from broker_core.codec.batch_header import read_header
        from broker_core.storage import LogConfig, PartitionLog

        log = PartitionLog(Path({str(tmp_path)!r}), LogConfig(segment_bytes=600))
        for n in range(50):
            b = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
            for i in range(2):
                b.append(i, 1000 + i, None, str(2 * n + i).encode(), [])
            batch = b.build()
            log.append(batch, read_header(batch))
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    log = PartitionLog(tmp_path, CONFIG)
    assert log.next_offset == 100
    assert all_records(log) == list(range(100))
    log.close()


@pytest.mark.parametrize("cut", ["mid-header", "mid-batch", "one-byte-short"])
def test_torn_last_entry_is_truncated(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, cut: str
) -> None:
    log = PartitionLog(tmp_path, CONFIG)
    fill(log, 13)
    before = log.next_offset - 3
    path = log._ledgers[-1].path
    full = log._ledgers[-1].facts.size
    size_before = full - ENTRY_HEADER_SIZE - len(numbered_batch(before, 3))
    assert size_before > 0  # the torn entry is not the ledger's only one
    del log
    new_size = {
        "mid-header": size_before + ENTRY_HEADER_SIZE // 2,
        "mid-batch": size_before + ENTRY_HEADER_SIZE + 30,
        "one-byte-short": full - 1,
    }[cut]
    os.truncate(path, new_size)
    with caplog.at_level(logging.WARNING, logger="broker_core.storage"):
        log = PartitionLog(tmp_path, CONFIG)
    assert "truncating" in caplog.text
    assert log.next_offset == before
    assert path.stat().st_size == size_before
    assert fill(log, 2) == before + 6
    assert all_records(log) == list(range(before + 6))
    log.close()


def test_garbled_last_batch_fails_crc_and_is_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = PartitionLog(tmp_path, CONFIG)
    fill(log, 9)
    before = log.next_offset
    fill(log, 1)
    path = log._ledgers[-1].path
    del log
    with open(path, "r+b") as f:
        f.seek(-3, os.SEEK_END)
        byte = f.read(1)
        f.seek(-3, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
    with caplog.at_level(logging.WARNING, logger="broker_core.storage"):
        log = PartitionLog(tmp_path, CONFIG)
    assert "CRC32C" in caplog.text
    assert log.next_offset == before
    assert fill(log, 1) == before + 3
    assert all_records(log) == list(range(before + 3))
    log.close()


def test_zero_filled_tail_is_dropped(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, CONFIG)
    total = fill(log, 5)
    path = log._ledgers[-1].path
    log.close()
    with open(path, "ab") as f:
        f.write(bytes(4096))
    log = PartitionLog(tmp_path, CONFIG)
    assert log.next_offset == total
    assert fill(log, 1) == total + 3
    log.close()


def test_missing_metadata_is_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = PartitionLog(tmp_path, CONFIG)
    total = fill(log, 40)
    ledgers = log.ledger_count
    log.close()
    (tmp_path / METADATA_FILE).unlink()
    with caplog.at_level(logging.WARNING, logger="broker_core.storage"):
        log = PartitionLog(tmp_path, CONFIG)
    assert "rebuilding" in caplog.text
    assert (log.next_offset, log.ledger_count, log.log_start_offset) == (total, ledgers, 0)
    assert all_records(log) == list(range(total))
    best = log.batch_with_max_timestamp()
    assert best is not None and best.base_offset == 0
    log.close()
    assert (tmp_path / METADATA_FILE).exists()


def test_missing_metadata_after_delete_records(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, CONFIG)
    total = fill(log, 40)
    log.delete_records_before(50)
    first_kept = log._ledgers[0].facts.first_offset
    log.close()
    (tmp_path / METADATA_FILE).unlink()
    log = PartitionLog(tmp_path, CONFIG)
    assert log.log_start_offset == first_kept
    assert log.next_offset == total
    log.close()


def test_crash_between_new_ledger_and_metadata(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, CONFIG)
    fill(log, 4)
    log.close()
    log = PartitionLog(tmp_path, CONFIG)
    old_metadata = (tmp_path / METADATA_FILE).read_bytes()
    log.roll()
    total = fill(log, 3)  # goes into the new ledger
    del log
    # as if the process died after creating the ledger file but before the metadata
    (tmp_path / METADATA_FILE).write_bytes(old_metadata)
    log = PartitionLog(tmp_path, CONFIG)
    assert log.next_offset == total
    assert log.ledger_count == 2
    assert all_records(log) == list(range(total))
    log.close()


def test_crash_right_after_creating_an_empty_ledger(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, CONFIG)
    total = fill(log, 4)
    log.close()
    (tmp_path / "0000000000000007.ledger").touch()
    log = PartitionLog(tmp_path, CONFIG)
    assert log.next_offset == total
    assert fill(log, 1) == total + 3
    assert all_records(log) == list(range(total + 3))
    log.close()
    log = PartitionLog(tmp_path, CONFIG)
    assert log.next_offset == total + 3
    log.close()


def test_unlisted_old_ledger_is_removed(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, CONFIG)
    fill(log, 40)
    first = ledger_files(tmp_path)[0]
    saved = first.read_bytes()
    log.delete_records_before(log._ledgers[1].facts.first_offset)
    log.close()
    first.write_bytes(saved)  # as if the crash came between metadata write and unlink
    log = PartitionLog(tmp_path, CONFIG)
    assert not first.exists()
    log.close()


def readable(log: PartitionLog) -> list[int]:
    """Every record served, reading on past damaged ranges as an operator's seek would."""
    values: list[int] = []
    offset = log.log_start_offset
    while offset < log.next_offset:
        try:
            chunks = log.read(offset, 1 << 30)
        except DamagedRecords as damaged:
            offset = damaged.end_offset
            continue
        assert chunks, f"nothing read at {offset}"
        for view in chunks:
            for record in MemoryRecords(batch_bytes(view)).next_batch():
                assert int(record.value) == record.offset
                values.append(record.offset)
                offset = record.offset + 1
    return values


def test_short_sealed_ledger_keeps_the_ledgers_after_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = PartitionLog(tmp_path, CONFIG)
    total = fill(log, 40)
    first = log._ledgers[0]
    first_end = first.facts.next_offset
    path = first.path
    ledgers = log.ledger_count
    log.close()
    os.truncate(path, path.stat().st_size - 10)  # the last batch of ledger 1 is cut short
    with caplog.at_level(logging.WARNING, logger="broker_core.storage"):
        log = PartitionLog(tmp_path, CONFIG)
    lost = range(first_end - 3, first_end)
    assert f"offsets [{lost[0]}, {first_end}) in ledger file {path.name}" in caplog.text
    assert (log.next_offset, log.ledger_count) == (total, ledgers)
    assert [(d.first_offset, d.end_offset) for d in log.damaged_ranges()] == [
        (lost[0], first_end)]
    assert readable(log) == [o for o in range(total) if o not in lost]
    with pytest.raises(DamagedRecords):
        log.read(lost[1], 1000)
    # timestamp lookups walk around the damage (every batch here has the same timestamps)
    best = log.batch_with_max_timestamp()
    assert best is not None and best.base_offset == 0
    found = log.find_first_batch_with_timestamp_at_least(1_002)
    assert found is not None and found.base_offset == 0
    assert not list(tmp_path.glob("*.dropped"))
    assert fill(log, 1) == total + 3  # fresh offsets after the old end
    log.close()
    log = PartitionLog(tmp_path, CONFIG)  # the damage is found (and reported) again
    assert [(d.first_offset, d.end_offset) for d in log.damaged_ranges()] == [
        (lost[0], first_end)]
    assert log.next_offset == total + 3
    log.delete_records_before(first_end)  # the operator gives the damaged range up
    assert log.damaged_ranges() == []
    assert readable(log) == list(range(first_end, total + 3))
    log.close()


def test_missing_middle_ledger_is_a_hole(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, CONFIG)
    total = fill(log, 40)
    second = log._ledgers[1].facts
    log.close()
    (tmp_path / ledger_file_name(second.ledger_id)).unlink()
    log = PartitionLog(tmp_path, CONFIG)
    assert log.next_offset == total
    assert [(d.first_offset, d.end_offset) for d in log.damaged_ranges()] == [
        (second.first_offset, second.next_offset)]
    assert readable(log) == [o for o in range(total)
                             if not second.first_offset <= o < second.next_offset]
    log.close()


def test_flipped_byte_in_sealed_ledger_is_found_on_first_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = PartitionLog(tmp_path, CONFIG)
    total = fill(log, 40)
    path = log._ledgers[0].path
    log.close()
    entry = ENTRY_HEADER_SIZE + len(numbered_batch(0, 3))
    with open(path, "r+b") as f:  # the last byte of the second batch (offsets 3..5)
        f.seek(2 * entry - 1)
        byte = f.read(1)
        f.seek(2 * entry - 1)
        f.write(bytes([byte[0] ^ 0x55]))
    log = PartitionLog(tmp_path, CONFIG)
    assert log.damaged_ranges() == []  # trusted at start-up: nothing is scanned yet
    assert log.needs_verification(0)
    with caplog.at_level(logging.ERROR, logger="broker_core.storage"):
        log.verify_at(0)
    assert "batch CRC32C mismatch" in caplog.text
    assert not log.needs_verification(0)
    assert [(d.first_offset, d.end_offset) for d in log.damaged_ranges()] == [(3, 6)]
    first = [MemoryRecords(batch_bytes(v)).next_batch().base_offset for v in log.read(0, 1 << 20)]
    assert first == [0]  # the read stops before the damaged batch
    for offset in (3, 4, 5):
        with pytest.raises(DamagedRecords):
            log.read(offset, 1 << 20)
    assert readable(log) == [o for o in range(total) if o not in (3, 4, 5)]
    assert sum(1 for _ in log.batches_from(0)) == total // 3 - 1  # internal readers skip it
    log.close()


def test_unsynced_sealed_ledger_is_verified(tmp_path: Path) -> None:
    crashed = PartitionLog(tmp_path, LogConfig(segment_bytes=10_000))
    fill(crashed, 5)
    crashed.roll()  # metadata now lists ledger 1 as sealed but not yet fsynced
    fill(crashed, 2)
    path = crashed._ledgers[0].path
    size = path.stat().st_size
    with open(path, "r+b") as f:  # the unsynced tail of the sealed ledger is damaged
        f.seek(size - 5)
        f.write(b"\0\0\0\0\0")
    log = PartitionLog(tmp_path, LogConfig(segment_bytes=10_000))
    assert log.next_offset == 21  # the ledger after it keeps its offsets
    assert [(d.first_offset, d.end_offset) for d in log.damaged_ranges()] == [(12, 15)]
    assert readable(log) == [*range(12), *range(15, 21)]
    log.close()


def test_flush_records_sealed_ledgers_as_synced(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, CONFIG)
    fill(log, 40)
    log.flush()
    metadata = (tmp_path / METADATA_FILE).read_text()
    assert '"synced": false' not in metadata
    del log
    log = PartitionLog(tmp_path, CONFIG)
    assert all_records(log) == list(range(120))
    log.close()


def test_all_ledgers_missing_keeps_offsets_moving_forward(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, CONFIG)
    total = fill(log, 10)
    log.close()
    for path in ledger_files(tmp_path):
        path.unlink()
    log = PartitionLog(tmp_path, CONFIG)
    assert log.next_offset == total
    assert log.log_start_offset == total
    log.close()


def test_copy_of_closed_partition_opens_elsewhere(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "a", CONFIG)
    total = fill(log, 12)
    log.close()
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    copy = PartitionLog(tmp_path / "b", CONFIG)
    assert all_records(copy) == list(range(total))
    copy.close()


@pytest.mark.parametrize("interval", [0, 300, 1 << 20])
def test_lazy_index_after_reopen(tmp_path: Path, interval: int) -> None:
    config = LogConfig(segment_bytes=3000, index_interval_bytes=interval)
    log = PartitionLog(tmp_path, config)
    total = fill(log, 80)
    log.close()
    log = PartitionLog(tmp_path, config)
    open_first = log._ledgers[-1].facts.first_offset
    # lookups in a scattered order extend each ledger's index part by part
    order = [total - 1, 1, open_first + 1, 100, 0, 57, open_first, total // 2, 2, total - 3]
    for offset in order:
        records = MemoryRecords(batch_bytes(log.read(offset, 0)[0]))
        batch = records.next_batch()
        assert batch.base_offset == offset - offset % 3
    # appends after a partial walk of the open ledger stay reachable
    grown = fill(log, 5)
    for offset in range(open_first, grown):
        assert log.read(offset, 0)
    assert all_records(log) == list(range(grown))
    log.close()


def test_short_last_ledger_keeps_its_offsets_and_gets_a_successor(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, CONFIG)
    total = fill(log, 40)
    last = log._ledgers[-1]
    ledgers, path, last_first = log.ledger_count, last.path, last.facts.first_offset
    log.close()  # everything is fsynced: a shorter file now is damage, not a crash
    os.truncate(path, path.stat().st_size - 10)
    log = PartitionLog(tmp_path, CONFIG)
    assert (log.next_offset, log.ledger_count) == (total, ledgers + 1)
    assert [(d.first_offset, d.end_offset) for d in log.damaged_ranges()] == [
        (total - 3, total)]
    assert fill(log, 2) == total + 6
    assert readable(log) == [*range(total - 3), *range(total, total + 6)]
    assert last_first < total - 3
    log.close()


def test_damage_in_the_open_ledger_leaves_appends_readable(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, LogConfig(segment_bytes=1 << 20))
    total = fill(log, 10)
    path = log._ledgers[-1].path
    log.close()
    entries = stored_entries(path)
    with open(path, "r+b") as f:  # garble the entry header of the fifth batch
        f.seek(entries[4].position + 3)
        f.write(b"\xff\xff")
    log = PartitionLog(tmp_path, LogConfig(segment_bytes=1 << 20))
    assert log.ledger_count == 1 and log.needs_verification(0)
    grown = fill(log, 2)  # appended to the open ledger, after the damage
    log.verify_at(0)
    assert [(d.first_offset, d.end_offset) for d in log.damaged_ranges()] == [(12, total)]
    assert readable(log) == [*range(12), *range(total, grown)]
    assert fill(log, 1) == grown + 3
    assert readable(log)[-3:] == list(range(grown, grown + 3))
    log.close()


def test_timestamp_lookups_pass_over_a_damaged_batch(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, LogConfig(segment_bytes=1 << 20))
    fill(log, 3)
    assert log.append(*headed(numbered_batch(9, 3, ts=9_000))) == 9  # the newest timestamps
    log.roll()
    fill(log, 3)
    path = log._ledgers[0].path
    log.close()
    os.truncate(path, path.stat().st_size - 10)  # the batch with them is cut short
    log = PartitionLog(tmp_path, LogConfig(segment_bytes=1 << 20))
    assert [(d.first_offset, d.end_offset) for d in log.damaged_ranges()] == [(9, 12)]
    best = log.batch_with_max_timestamp()
    assert best is not None and best.base_offset == 0 and best.max_timestamp == 1_002
    assert log.find_first_batch_with_timestamp_at_least(5_000) is None
    assert [info.base_offset for info in log.batches_from(0)] == [0, 3, 6, 12, 15, 18]
    log.close()
