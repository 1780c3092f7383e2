"""The log cleaner's rewrite on raw logs, on every storage engine, against a model.

Random keys, values, tombstones, idempotent and transactional producers (committed and
aborted transactions) are appended to a partition with small segments; the cleaner runs
(twice: the second one removes the tombstones and commit markers whose delete horizon
the first one stamped). Reading the whole partition as a read_committed consumer does
must then give exactly the latest non-deleted value of each key, each at the offset it
was written at; the batches still cover every offset; the producer state rebuilt from
the cleaned log knows every producer's last sequence and no open transaction. A crash
of the file engine in the middle of a swap (a ``.cleaned`` or a ``.swap`` file left
behind) loses nothing and duplicates nothing.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from broker_core.batches import read_header
from broker_core.compaction.cleaning import Checkpoint, CompactionSettings, clean, dirt
from broker_core.markers import COMMIT, marker_batch, marker_type
from broker_core.partition_producers import PartitionProducers
from broker_core.storage import (
    ENGINES,
    BatchInfo,
    LogConfig,
    PartitionLog,
    PartitionStore,
    SealedSegment,
    Storage,
    open_storage,
)
from broker_core.storage.batch_header import last_offset_delta
from broker_core.storage.ledger import SWAP_SUFFIX, Ledger
from tests.postgres_server import shared_server

TOPIC = "public/default/compacted"
SEGMENT_MS = 10_000
SETTINGS = CompactionSettings(min_dirty_ratio=0.0, min_lag_ms=0, max_lag_ms=2**62,
                              delete_retention_ms=0)


class Clock:
    """A settable clock, in ms."""

    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture(params=sorted(set(ENGINES) - {"postgresql"}))
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def open_engine(engine: str, tmp_path: Path, clock: Clock) -> Storage:
    if engine == "postgres":
        url = shared_server().new_database_url()
    else:
        url = (tmp_path / "data").as_uri() if engine == "file" else "memory://"
    return open_storage(url, LogConfig(segment_bytes=2048, segment_ms=SEGMENT_MS),
                        clock=clock)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def storage(engine: str, tmp_path: Path, clock: Clock) -> Iterator[Storage]:
    opened = open_engine(engine, tmp_path, clock)
    opened.create_topic(TOPIC, 1, {"cleanup.policy": "compact"})
    yield opened
    opened.close()


def partition(storage: Storage) -> PartitionStore:
    log = storage.partition(TOPIC, 0)
    assert log is not None
    return log


@dataclass
class Model:
    """What was written and what a read_committed reader must see after cleaning."""

    latest: dict[bytes, tuple[int, bytes | None]] = field(default_factory=dict)
    sequences: dict[int, int] = field(default_factory=dict)  # producer -> last sequence

    def commit(self, records: list[tuple[bytes, bytes | None, int]]) -> None:
        """A committed transaction's records: the latest of a key is the one at the
        highest offset (what a reader below the last stable offset reads last)."""
        for key, value, offset in records:
            if offset > self.latest.get(key, (-1, None))[0]:
                self.latest[key] = (offset, value)

    def visible(self) -> dict[bytes, tuple[int, bytes]]:
        return {k: (o, v) for k, (o, v) in self.latest.items() if v is not None}


def batch(records: list[tuple[bytes, bytes | None]], timestamp: int, producer_id: int = -1,
          sequence: int = -1, transactional: bool = False) -> bytearray:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=random.choice((0, 1)), is_transactional=transactional,
        producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=sequence, batch_size=1 << 20)
    for i, (key, value) in enumerate(records):
        builder.append(i, timestamp + i, key, value, [])
    built: bytearray = builder.build()
    return built


def append(log: PartitionStore, data: bytearray, clock: Clock) -> int:
    clock.now += 7
    return log.append(data, last_offset_delta(data), read_header(data).max_timestamp)


def write_random(log: PartitionStore, clock: Clock, seed: int, rounds: int = 400) -> Model:
    rng = random.Random(seed)
    model = Model()
    keys = [f"key-{i}".encode() for i in range(25)]
    txns: dict[int, list[tuple[bytes, bytes | None, int]]] = {}
    for step in range(rounds):
        count = rng.randint(1, 4)
        records = [(rng.choice(keys), None if rng.random() < 0.15 else
                    f"v{step}-{i}".encode() * rng.randint(1, 3)) for i in range(count)]
        kind = rng.random()
        if kind < 0.5:  # plain
            base = append(log, batch(records, clock.now), clock)
            for i, (key, value) in enumerate(records):
                model.latest[key] = (base + i, value)
        elif kind < 0.65:  # idempotent
            pid = 10
            sequence = model.sequences.get(pid, -1) + 1
            base = append(log, batch(records, clock.now, pid, sequence), clock)
            model.sequences[pid] = sequence + count - 1
            for i, (key, value) in enumerate(records):
                model.latest[key] = (base + i, value)
        else:  # transactional: producers 1..3
            pid = rng.randint(1, 3)
            if pid in txns and rng.random() < 0.4:
                commit = rng.random() < 0.6
                append(log, marker_batch(pid, 0, commit, clock.now), clock)
                if commit:
                    model.commit(txns[pid])
                del txns[pid]
                continue
            sequence = model.sequences.get(pid, -1) + 1
            base = append(log, batch(records, clock.now, pid, sequence, True), clock)
            model.sequences[pid] = sequence + count - 1
            txns.setdefault(pid, []).extend(
                (key, value, base + i) for i, (key, value) in enumerate(records))
    for pid in list(txns):  # end them all: a commit or an abort each
        commit = rng.random() < 0.5
        append(log, marker_batch(pid, 0, commit, clock.now), clock)
        written = txns.pop(pid)
        if commit:
            model.commit(written)
    clock.now += SEGMENT_MS  # what follows starts a new segment: the rest is sealed
    base = append(log, batch([(b"end", b"end")], clock.now), clock)
    model.latest[b"end"] = (base, b"end")
    return model


def run_cleaner(log: PartitionStore, clock: Clock) -> bool:
    checkpoint = Checkpoint.load(log)
    found = dirt(log, SETTINGS, clock.now, checkpoint)
    if not found.due:
        return False
    return clean(log, found.cleanable, SETTINGS, clock.now, lambda size: None,
                 checkpoint) is not None


def read_committed(log: PartitionStore) -> tuple[dict[bytes, tuple[int, bytes | None]], int]:
    """What a read_committed reader of the whole partition sees: the records of plain
    batches and committed transactions, in offset order, reduced to the last of each key
    (so a duplicate or a stale value shows), and how many records it read in all."""
    committed: list[tuple[int, bytes, bytes | None]] = []
    pending: dict[int, list[tuple[int, bytes, bytes | None]]] = {}
    expected = log.log_start_offset
    for info in log.batches_from(log.log_start_offset):
        assert info.base_offset == expected  # the batches cover every offset
        expected = info.last_offset + 1
        header = read_header(info.batch)
        if header.is_control:
            txn = pending.pop(header.producer_id, [])
            if marker_type(info.batch) == COMMIT:
                committed += txn
            continue
        for record in DefaultRecordBatch(bytes(info.batch)):
            assert info.base_offset <= record.offset <= info.last_offset
            assert record.key is not None
            entry = (record.offset, record.key, record.value)
            if header.is_transactional:
                pending.setdefault(header.producer_id, []).append(entry)
            else:
                committed.append(entry)
    assert expected == log.next_offset
    seen: dict[bytes, tuple[int, bytes | None]] = {}
    for offset, key, value in sorted(committed):
        seen[key] = (offset, value)
    return seen, len(committed)


def test_cleaning_keeps_the_latest_value_of_each_key_at_its_offset(
        storage: Storage, clock: Clock) -> None:
    log = partition(storage)
    model = write_random(log, clock, seed=18)
    before, read_before = read_committed(log)
    assert before == model.latest
    size_before = log.size_bytes

    clock.now += 1
    assert run_cleaner(log, clock)
    after, _ = read_committed(log)
    assert after == model.latest  # tombstones stay until their horizon has passed
    clock.now += 1
    assert run_cleaner(log, clock)  # the horizon passed: due again
    after, read_after = read_committed(log)
    assert after == model.visible()
    assert read_after == len(model.visible())  # exactly one record per live key
    assert read_after < read_before and log.size_bytes < size_before

    state = PartitionProducers()
    for info in log.batches_from(log.log_start_offset):
        state.apply(info)
    assert state.last_stable_offset(log.next_offset) == log.next_offset
    for pid, sequence in model.sequences.items():
        assert state.producers[pid].last_sequence == sequence
    clock.now += 1
    assert not run_cleaner(log, clock)  # nothing dirty any more


def test_a_consumer_in_a_removed_range_continues_at_the_next_kept_offset(
        storage: Storage, clock: Clock) -> None:
    log = partition(storage)
    model = write_random(log, clock, seed=7, rounds=150)
    for _ in range(2):
        clock.now += 1
        assert run_cleaner(log, clock)
    kept = sorted(offset for offset, _ in model.visible().values())
    for offset in range(log.log_start_offset, log.next_offset):
        served = (record.offset for info in log.batches_from(offset)
                  if not read_header(info.batch).is_control
                  for record in DefaultRecordBatch(bytes(info.batch)) if record.offset >= offset)
        assert next(served) == next(o for o in kept if o >= offset)


@pytest.mark.parametrize("leftover", [".cleaned", ".swap"])
def test_a_swap_cut_short_by_a_crash_loses_and_duplicates_nothing(
        tmp_path: Path, clock: Clock, leftover: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The process dies after writing a cleaned ledger (``.cleaned``: not yet committed,
    removed at the next start) or after committing it (``.swap``: the next start swaps it
    in, its facts taken from the file), before the metadata was written."""
    storage = open_engine("file", tmp_path, clock)
    storage.create_topic(TOPIC, 1, {"cleanup.policy": "compact"})
    log = partition(storage)
    assert isinstance(log, PartitionLog)
    model = write_random(log, clock, seed=3, rounds=200)
    log.flush()
    directory = log.directory
    left: list[Path] = []

    def dies_midway(segment: SealedSegment, batches: Sequence[BatchInfo]) -> bool:
        facts = next(ledger.facts for ledger in log._ledgers if ledger.ledger_id == segment.ident)
        temp, _ = Ledger.write_cleaned(directory, facts.copy(), batches, 4096)
        if leftover == ".swap":
            temp = temp.replace(temp.with_suffix(SWAP_SUFFIX))
        left.append(temp)
        raise Died

    monkeypatch.setattr(log, "replace_segment", dies_midway)
    clock.now += 1
    with pytest.raises(Died):
        run_cleaner(log, clock)
    assert left and left[0].exists()
    # nothing is closed: the next start opens what the disk holds
    again = PartitionLog(directory, LogConfig(segment_bytes=2048, segment_ms=SEGMENT_MS),
                         clock=clock)
    try:
        assert not any(p.name.endswith((".cleaned", ".swap")) for p in directory.iterdir())
        seen, _ = read_committed(again)
        assert seen == model.latest
        for segment in again.sealed_segments():
            again.verify_at(max(segment.first_offset, again.log_start_offset))
        assert not again.damaged_ranges()
        if leftover == ".swap":  # the cleaned ledger is in: smaller than the original
            assert again.size_bytes < log.size_bytes
        else:
            assert again.size_bytes == log.size_bytes
    finally:
        again.close()


class Died(Exception):
    """The process dies here."""
