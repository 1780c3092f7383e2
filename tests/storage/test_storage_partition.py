"""PartitionLog behaviour while running: offsets, reads, rolling, timestamps, trimming."""

from __future__ import annotations

import itertools
import json
import shutil
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from kafka.record import MemoryRecords

from broker_core.codec.batch_header import crc_matches, read_header, shape_problem
from broker_core.storage import FileRegion, LogConfig, OffsetOutOfRange, PartitionLog
from broker_core.storage.entry import (
    ENTRY_HEADER_SIZE,
    decode_entry_header,
    encode_entry_header,
)
from broker_core.storage.fsutil import json_bytes
from broker_core.storage.metadata import PartitionMetadata, load_metadata
from tests.batches import numbered_batch
from tests.storage_helpers import batch_bytes, headed, region_bytes


def add(log: PartitionLog, first: int, count: int, *, ts: int = 1_000, pad: int = 0) -> int:
    batch = numbered_batch(first, count, ts=ts, pad=pad)
    return log.append(*headed(batch))


def decode(views: list[memoryview | FileRegion]) -> list[tuple[int, int]]:
    """(offset, number in the value) for every record in the batches."""
    out: list[tuple[int, int]] = []
    for view in views:
        records = MemoryRecords(batch_bytes(view))
        while records.has_next():
            batch = records.next_batch()
            for record in batch:
                out.append((record.offset, int(record.value.rstrip(b"."))))
    return out


def fill(log: PartitionLog, batches: int, *, size: int = 3, pad: int = 0) -> int:
    """Append ``batches`` batches of ``size`` records numbered by offset; returns the total."""
    total = 0
    for _ in range(batches):
        assert add(log, total, size, pad=pad) == total
        total += size
    return total


def test_entry_header_round_trip_and_corruption() -> None:
    header = encode_entry_header(123456789, 1_700_000_000_000, 4242)
    assert len(header) == ENTRY_HEADER_SIZE
    decoded = decode_entry_header(header)
    assert decoded is not None
    assert (decoded.index, decoded.broker_timestamp, decoded.batch_length) == (
        123456789,
        1_700_000_000_000,
        4242,
    )
    garbled = bytearray(header)
    garbled[5] ^= 0x40
    assert decode_entry_header(garbled) is None
    assert decode_entry_header(header[:-1]) is None
    assert decode_entry_header(bytes(ENTRY_HEADER_SIZE)) is None


def test_batch_checks_on_real_batches() -> None:
    batch = numbered_batch(0, 4)
    assert shape_problem(batch) is None
    assert crc_matches(batch)
    batch[-1] ^= 1
    assert not crc_matches(batch)
    assert shape_problem(batch[:-1]) is not None


def test_continuous_offsets_over_many_rolls(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "p", LogConfig(segment_bytes=700))
    total = 0
    for i in range(120):
        count = 1 + i % 5
        assert add(log, total, count) == total
        total += count
        assert log.next_offset == total
    assert log.ledger_count > 10
    got = decode(log.read(0, 1 << 30))
    assert got == [(o, o) for o in range(total)]
    # each ledger's first offset is the previous one's next offset
    facts = [ledger.facts for ledger in log._ledgers]
    for before, after in itertools.pairwise(facts):
        assert after.first_offset == before.next_offset
        assert before.size <= 700
    log.close()


def test_read_starts_at_batch_containing_offset(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "p", LogConfig(segment_bytes=400))
    fill(log, 30, size=4)
    for offset in (0, 1, 3, 4, 57, 118, 119):
        views = log.read(offset, 1)
        assert len(views) == 1
        records = decode(views)
        base = offset - offset % 4
        assert [o for o, _ in records] == list(range(base, base + 4))
    assert log.read(120, 1000) == []
    with pytest.raises(OffsetOutOfRange):
        log.read(121, 1000)
    with pytest.raises(OffsetOutOfRange):
        log.read(-1, 1000)
    log.close()


def test_read_max_bytes_and_first_batch_rule(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "p", LogConfig(segment_bytes=1000))
    fill(log, 40, size=2)
    sizes = [len(v) for v in log.read(0, 1 << 30)]
    assert len(sizes) == 40
    # the first batch comes whole even when max_bytes is smaller than it
    assert [len(v) for v in log.read(0, 0)] == sizes[:1]
    assert [len(v) for v in log.read(0, sizes[0] - 1)] == sizes[:1]
    # then batches are added while the total stays <= max_bytes, across ledgers
    for n in (2, 5, 17, 39):
        limit = sum(sizes[:n])
        assert len(log.read(0, limit)) == n
        assert len(log.read(0, limit + sizes[n] - 1)) == n
    views = log.read(11, sum(sizes[5:25]))
    assert [o for o, _ in decode(views)] == list(range(10, 50))
    log.close()


def test_large_batch_and_batches_from(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "p", LogConfig(segment_bytes=50_000, index_interval_bytes=1))
    total = 0
    for i in range(20):
        pad = 30_000 if i % 7 == 3 else 0
        add(log, total, 3, pad=pad)
        total += 3
    assert decode(log.read(0, 1 << 30)) == [(o, o) for o in range(total)]
    infos = list(log.batches_from(10))
    assert [i.base_offset for i in infos] == list(range(9, total, 3))
    assert all(i.last_offset == i.base_offset + 2 for i in infos)
    assert decode([memoryview(i.batch) for i in infos]) == [(o, o) for o in range(9, total)]
    assert list(log.batches_from(total)) == []
    with pytest.raises(OffsetOutOfRange):
        log.batches_from(total + 1)
    log.close()


def test_batches_from_follows_appends_and_rolls(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "p", LogConfig())
    fill(log, 2, size=1)
    iterator = log.batches_from(0)
    assert next(iterator).base_offset == 0
    log.roll()
    add(log, 2, 1)
    assert [i.base_offset for i in iterator] == [1, 2]
    log.close()


def test_sparse_index_granularity(tmp_path: Path) -> None:
    for interval in (0, 100, 1 << 20):
        log = PartitionLog(tmp_path / f"p{interval}", LogConfig(index_interval_bytes=interval))
        total = fill(log, 50, size=2)
        for offset in range(total):
            assert decode(log.read(offset, 0))[0][0] == offset - offset % 2
        log.close()


def test_append_validates_batch(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "p", LogConfig())
    batch = numbered_batch(0, 3)
    header = read_header(batch)
    with pytest.raises(ValueError, match="last_offset_delta"):
        log.append(bytearray(batch), replace(header, last_offset_delta=-1))
    with pytest.raises(ValueError, match="batchLength"):
        log.append(batch[:-1], header)
    with pytest.raises(ValueError, match="shorter"):
        log.append(batch[:60], header)
    bad_magic = bytearray(batch)
    bad_magic[16] = 1
    with pytest.raises(ValueError, match="magic"):
        log.append(bad_magic, read_header(bad_magic))
    assert log.next_offset == 0
    assert log.append(batch, header) == 0
    assert log.next_offset == 3
    log.close()


def test_roll_by_age(tmp_path: Path) -> None:
    now = [1_000_000]
    log = PartitionLog(tmp_path / "p", LogConfig(segment_ms=1000), clock=lambda: now[0])
    add(log, 0, 1)
    now[0] += 999
    add(log, 1, 1)
    assert log.ledger_count == 1
    now[0] += 1
    add(log, 2, 1)
    assert log.ledger_count == 2
    log.roll()
    log.roll()  # the open ledger is empty: no-op
    assert log.ledger_count == 3
    log.close()


def test_timestamp_lookups(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "p", LogConfig(segment_bytes=300))
    stamps = [100, 300, 200, 900, 500, 900, 400, 50, 800, 700]
    for i, ts in enumerate(stamps):
        add(log, 2 * i, 2, ts=ts - 1)  # records at ts-1 and ts: batch maxTimestamp = ts
    assert log.ledger_count > 3

    def first_at_least(ts: int) -> int | None:
        info = log.find_first_batch_with_timestamp_at_least(ts)
        return None if info is None else info.base_offset

    assert first_at_least(0) == 0
    assert first_at_least(100) == 0
    assert first_at_least(101) == 2
    assert first_at_least(301) == 6
    assert first_at_least(901) is None
    info = log.find_first_batch_with_timestamp_at_least(850)
    assert info is not None
    assert (info.base_offset, info.last_offset, info.max_timestamp) == (6, 7, 900)
    assert decode([memoryview(info.batch)]) == [(6, 6), (7, 7)]

    best = log.batch_with_max_timestamp()
    assert best is not None
    assert (best.base_offset, best.max_timestamp) == (6, 900)  # earliest of the tie
    log.delete_records_before(8)
    best = log.batch_with_max_timestamp()
    assert best is not None
    assert (best.base_offset, best.max_timestamp) == (10, 900)
    log.delete_records_before(11)  # inside the batch 10..11: it is still visible
    best = log.batch_with_max_timestamp()
    assert best is not None and best.base_offset == 10
    assert first_at_least(0) == 10
    log.delete_records_before(12)
    best = log.batch_with_max_timestamp()
    assert best is not None
    assert (best.base_offset, best.max_timestamp) == (16, 800)
    assert first_at_least(801) is None
    log.close()


def test_timestamp_lookups_on_empty_log(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "p", LogConfig())
    assert log.batch_with_max_timestamp() is None
    assert log.find_first_batch_with_timestamp_at_least(0) is None
    log.close()


def test_delete_records_before(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "p", LogConfig(segment_bytes=400))
    total = fill(log, 30, size=3)
    ledgers = log.ledger_count
    assert log.delete_records_before(0) == 0
    assert log.delete_records_before(31) == 31
    assert log.ledger_count < ledgers
    assert log._ledgers[0].facts.first_offset <= 31 < log._ledgers[0].facts.next_offset
    with pytest.raises(OffsetOutOfRange):
        log.read(30, 100)
    # reading at the new start returns the batch holding it
    assert decode(log.read(31, 0))[0] == (30, 30)
    assert log.delete_records_before(10) == 31  # never backwards
    with pytest.raises(OffsetOutOfRange):
        log.delete_records_before(total + 1)
    assert log.delete_records_before(total) == total
    assert log.ledger_count == 1
    assert log.read(total, 100) == []
    assert add(log, total, 2) == total
    assert decode(log.read(total, 100)) == [(total, total), (total + 1, total + 1)]
    log.close()
    reopened = PartitionLog(tmp_path / "p", LogConfig(segment_bytes=400))
    assert reopened.log_start_offset == total
    assert reopened.next_offset == total + 2
    reopened.close()


def test_retention_by_size_keeps_at_least_the_limit(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "p", LogConfig(segment_bytes=500))
    fill(log, 40, size=2)
    sizes = [ledger.facts.size for ledger in log._ledgers]
    limit = sum(sizes[-3:])  # the last three ledgers (the open one included)
    log.update_config(LogConfig(segment_bytes=500, retention_bytes=limit))
    removed = log.enforce_retention()
    assert removed == len(sizes) - 3
    assert log.size_bytes == limit
    assert log.log_start_offset == log._ledgers[0].facts.first_offset
    assert log.enforce_retention() == 0
    log.update_config(LogConfig(segment_bytes=500, retention_bytes=0))
    assert log.enforce_retention() == 3  # at 0 the open ledger too (Kafka's size rule)
    assert log.ledger_count == 1
    assert (log.log_start_offset, log.next_offset, log.size_bytes) == (80, 80, 0)
    assert log.read(80, 1 << 20) == []
    log.close()


def test_retention_by_time(tmp_path: Path) -> None:
    now = [10_000]
    config = LogConfig(segment_bytes=300, retention_ms=1000)
    log = PartitionLog(tmp_path / "p", config, clock=lambda: now[0])
    for step in range(12):
        now[0] += 100
        add(log, 2 * step, 2)
    ledgers = log._ledgers
    assert log.ledger_count >= 4
    assert log.enforce_retention() == 0
    newest_of_first = ledgers[0].facts.max_broker_timestamp
    newest_of_second = ledgers[1].facts.max_broker_timestamp
    now[0] = newest_of_first + 1001
    assert log.enforce_retention() == 1
    assert log.log_start_offset == log._ledgers[0].facts.first_offset > 0
    now[0] = newest_of_second + 1000
    assert log.enforce_retention() == 0  # exactly retention_ms old is kept
    now[0] = 10**9
    count = log.ledger_count
    assert log.enforce_retention() == count  # the open one too: rolled, then dropped
    assert log.ledger_count == 1
    assert log.log_start_offset == log.next_offset == 24
    log.update_config(LogConfig(segment_bytes=300, retention_ms=-1))
    log.close()


def test_flush_from_another_thread_while_appending(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "p", LogConfig(segment_bytes=2000))
    stop = threading.Event()
    errors: list[BaseException] = []

    def flusher() -> None:
        try:
            while not stop.is_set():
                log.flush()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=flusher)
    thread.start()
    try:
        total = fill(log, 300, size=2)
    finally:
        stop.set()
        thread.join()
    assert not errors
    log.flush()
    assert decode(log.read(0, 1 << 30)) == [(o, o) for o in range(total)]
    log.close()
    log.flush()  # after close: nothing to do


def test_large_batches_come_back_as_file_regions(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "p", LogConfig(segment_bytes=10_000_000))
    add(log, 0, 3, pad=40_000)  # about 120 KB: a region
    add(log, 3, 3, pad=40_000)
    add(log, 6, 3)  # small: read from the file
    add(log, 9, 3, pad=40_000)  # after a small one: read as well
    chunks = log.read(0, 1 << 30)
    kinds = [type(c).__name__ for c in chunks]
    assert kinds == ["FileRegion", "FileRegion", "memoryview", "memoryview"]
    region = chunks[0]
    assert isinstance(region, FileRegion)
    whole = region_bytes(region)
    assert len(whole) == len(region) and region.head == whole[:61]
    # a region keeps its own descriptor: closing the log and deleting its files (as
    # retention does) leaves the bytes readable until the region is released
    log.close()
    shutil.rmtree(tmp_path / "p")
    assert decode(chunks) == [(o, o) for o in range(12)]
    for chunk in chunks:
        if isinstance(chunk, FileRegion):
            chunk.release()
            chunk.release()  # twice is harmless
            assert chunk.fd == -1


def test_partition_json_holds_one_ledger_per_line(tmp_path: Path) -> None:
    """partition.json (rewritten at every roll and every swap of a cleaned ledger) is
    written by json's C encoder a ledger per line, and reads back as written."""
    log = PartitionLog(tmp_path / "p", LogConfig(segment_bytes=400))
    for first in range(0, 60, 3):
        add(log, first, 3, pad=100)
    log.close()
    path = tmp_path / "p" / "partition.json"
    stored = load_metadata(tmp_path / "p")
    assert stored is not None and len(stored.ledgers) > 5
    lines = path.read_text().splitlines()
    ledger_lines = [line for line in lines if line.startswith('  {"createdMs": ')]
    assert len(ledger_lines) == len(stored.ledgers)
    assert json_bytes(stored.to_json()) == path.read_bytes()
    assert PartitionMetadata.from_json(json.loads(path.read_bytes())) == stored
