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

import dataclasses
import logging
import random
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from prometheus_client import REGISTRY

from broker_core.codec.batch_header import read_header, seal
from broker_core.codec.compression import deflate
from broker_core.codec.markers import ABORT, COMMIT, marker_batch, marker_type
from broker_core.compaction.cleaner import GIL_TURN_SECONDS, LogCleaner, short_gil_turns
from broker_core.compaction.cleaning import (
    DEFAULT_MAP_BYTES,
    Checkpoint,
    Cleaned,
    CompactionSettings,
    clean,
    dirt,
    first_batch_timestamp,
)
from broker_core.compaction.records import rebuilt
from broker_core.partition_producers import PartitionProducers
from broker_core.producer_states import SNAPSHOT_KEY, ProducerStates
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
from broker_core.storage.ledger import SWAP_SUFFIX, SWAPPED_SUFFIX, Ledger, ledger_file_name
from broker_core.topic_configs import LONG_MAX
from tests.postgres_server import shared_server
from tests.storage.pg_summaries import check_summaries

TOPIC = "public/default/compacted"
SEGMENT_MS = 10_000
SETTINGS = CompactionSettings(min_dirty_ratio=0.0, min_lag_ms=0, max_lag_ms=2**62,
                              delete_retention_ms=0, segment_bytes=2048)


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
    if engine == "postgres":
        check_summaries(opened.location)


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
          sequence: int = -1, transactional: bool = False,
          compression: int | None = None) -> bytearray:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=random.choice((0, 1)) if compression is None else compression,
        is_transactional=transactional,
        producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=sequence, batch_size=1 << 20)
    for i, (key, value) in enumerate(records):
        builder.append(i, timestamp + i, key, value, [])
    built: bytearray = builder.build()
    return built


def append(log: PartitionStore, data: bytearray, clock: Clock) -> int:
    clock.now += 7
    return log.append(data, read_header(data))


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


def run_cleaner(log: PartitionStore, clock: Clock, states: ProducerStates | None = None,
                map_bytes: int = DEFAULT_MAP_BYTES, settings: CompactionSettings = SETTINGS
                ) -> bool:
    """One cleaning if due; ``states`` is told the checkpoint, as the broker's cleaner
    tells it."""
    checkpoint = Checkpoint.load(log)
    found = dirt(log, settings, clock.now, checkpoint)
    if not found.due:
        return False
    done = clean(log, found.cleanable, settings, clock.now, lambda size: None, checkpoint,
                 map_bytes)
    if isinstance(done, Cleaned) and states is not None:
        states.cleaned(TOPIC, 0, log, done.checkpoint)
    return isinstance(done, Cleaned)


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
    segments_before = len(log.sealed_segments())

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
    assert len(log.sealed_segments()) < segments_before / 2  # small cleaned ones merged

    state = PartitionProducers()
    for info in log.batches_from(log.log_start_offset):
        state.apply(info)
    assert state.last_stable_offset(log.next_offset, log.log_start_offset) == log.next_offset
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


def fetch_committed(log: PartitionStore, state: PartitionProducers,
                    batches: list[BatchInfo] | None = None, cleaned_below: int | None = None,
                    ) -> dict[bytes, tuple[int, bytes | None]]:
    """What a read_committed Java client makes of one fetch of the whole partition (or of
    ``batches`` read from it): the aborted transactions the broker lists (from ``state``,
    judged by ``cleaned_below``) make it skip a producer's transactional batches from
    their first offset until that producer's next abort marker; the latest record of each
    key it keeps."""
    listed = sorted(state.aborted_between(log.log_start_offset, log.next_offset,
                                          cleaned_below), key=lambda entry: entry[1])
    skipping: set[int] = set()
    seen: dict[bytes, tuple[int, bytes | None]] = {}
    for info in batches if batches is not None else log.batches_from(log.log_start_offset):
        header = read_header(info.batch)
        pid = header.producer_id
        if pid >= 0:
            while listed and listed[0][1] <= info.last_offset:
                skipping.add(listed.pop(0)[0])
        if header.is_control:
            if marker_type(info.batch) == ABORT:
                skipping.discard(pid)
            continue
        if header.is_transactional and pid in skipping:
            continue
        for record in DefaultRecordBatch(bytes(info.batch)):
            assert record.key is not None
            seen[record.key] = (record.offset, record.value)
    return seen


def markers(log: PartitionStore) -> list[tuple[int, int]]:
    """(offset, type) of every transaction marker; each must follow a batch of its
    transaction still in the log (a marker goes once its transaction has nothing left)."""
    found: list[tuple[int, int]] = []
    pending: set[int] = set()
    for info in log.batches_from(log.log_start_offset):
        header = read_header(info.batch)
        if header.is_control:
            assert header.producer_id in pending, f"a marker left alone at {info.base_offset}"
            pending.discard(header.producer_id)
            found.append((info.base_offset, marker_type(info.batch)))
        elif header.is_transactional:
            pending.add(header.producer_id)
    return found


def test_markers_go_once_their_transaction_is_empty_and_read_committed_stays_right(
        storage: Storage, clock: Clock) -> None:
    log = partition(storage)
    model = write_random(log, clock, seed=98)
    states = ProducerStates()
    assert fetch_committed(log, states.get(TOPIC, 0, log)) == model.latest
    assert states.save() is None  # the snapshot a restart finds: taken before cleaning
    written_aborts = sum(1 for info in log.batches_from(log.log_start_offset)
                         if read_header(info.batch).is_control
                         and marker_type(info.batch) == ABORT)
    state = states.get(TOPIC, 0, log)
    floor = state.cleaned_below
    before = [BatchInfo(info.base_offset, info.last_offset, info.max_timestamp,
                        info.broker_timestamp, bytes(info.batch))
              for info in log.batches_from(log.log_start_offset)]
    for _ in range(3):  # removes aborted data and stamps markers, then removes them
        clock.now += 1
        run_cleaner(log, clock, states)
    # a fetch that read the batches before the cleaning swapped them judges them by the
    # checkpoint it read before them: the aborted transactions it got are listed
    assert fetch_committed(log, state, before, floor) == model.latest
    assert fetch_committed(log, state, before) != model.latest  # not by the new one
    aborts_left = sum(1 for _, kind in markers(log) if kind == ABORT)
    assert aborts_left < written_aborts
    assert aborts_left <= 3  # one per producer at most: its last batch's, kept empty

    # the broker's state, told by the cleaner
    assert fetch_committed(log, states.get(TOPIC, 0, log)) == model.visible()
    # after a restart: the snapshot taken before cleaning, with the cleaner's checkpoint
    restarted = ProducerStates().get(TOPIC, 0, log)
    assert restarted.aborted_between(log.log_start_offset, log.next_offset) == []
    assert fetch_committed(log, restarted) == model.visible()
    # rebuilt from the cleaned log alone
    log.state.put(SNAPSHOT_KEY, b"{}")
    assert fetch_committed(log, ProducerStates().get(TOPIC, 0, log)) == model.visible()


def test_a_reader_follows_segments_merged_under_it(storage: Storage, clock: Clock) -> None:
    """An iteration under way when the cleaner merges the segments it reads goes on at the
    next offset in the merged segment, to the end of the log."""
    log = partition(storage)
    write_random(log, clock, seed=5, rounds=300)
    clock.now += 1
    assert run_cleaner(log, clock)  # small cleaned segments, for the next one to merge
    reader = log.batches_from(log.sealed_segments()[1].first_offset)  # merged into the 1st
    offsets = [next(reader).last_offset]
    segments = len(log.sealed_segments())
    clock.now += 1
    assert run_cleaner(log, clock)
    assert len(log.sealed_segments()) < segments
    offsets += [info.last_offset for info in reader]
    assert offsets == sorted(set(offsets))
    assert offsets[-1] == log.next_offset - 1


def written_at(storage: Storage, clock: Clock, name: str, skew_ms: int,
               ) -> tuple[PartitionStore, int]:
    """A compacted partition of a few sealed segments whose records carry the broker's
    time plus ``skew_ms`` (a producer's clock, CreateTime), and its first timestamp."""
    storage.create_topic(name, 1, {"cleanup.policy": "compact"})
    log = storage.partition(name, 0)
    assert log is not None
    first = clock.now + skew_ms
    while len(log.sealed_segments()) < 3:
        append(log, batch([(b"k", b"v" * 200)], clock.now + skew_ms), clock)
    return log, first


@pytest.mark.parametrize("skew_ms", [-60_000, 0, 60_000])
def test_compaction_lags_are_judged_by_the_records_timestamps(
        storage: Storage, clock: Clock, skew_ms: int) -> None:
    """As Kafka: a dirty segment is cleanable once its largest record timestamp is
    ``min.compaction.lag.ms`` old; a partition is due once the first batch of its oldest
    dirty segment is more than ``max.compaction.lag.ms`` old, and its compaction delay is
    how far beyond."""
    log, first = written_at(storage, clock, f"{TOPIC}-lag", skew_ms)
    lag = CompactionSettings(min_dirty_ratio=1.0, min_lag_ms=30_000, max_lag_ms=30_000,
                             delete_retention_ms=0, segment_bytes=2048)
    found = dirt(log, lag, clock.now, Checkpoint())
    assert first_batch_timestamp(log, log.sealed_segments()[0]) == first
    if skew_ms < 0:  # old records: cleanable at once, and late by 30 s
        assert found.cleanable == log.sealed_segments()
        assert found.due and found.delay_ms == clock.now - 30_000 - first > 0
    else:  # new ones, or from a clock ahead: not yet
        assert found.cleanable == [] and not found.due and found.delay_ms == 0


def contents(log: PartitionStore) -> list[tuple[int, bytes | None, bytes | None]]:
    """Every record and marker left, in offset order: (offset, key, value) for a record,
    (offset, None, b"commit" or b"abort") for a marker."""
    out: list[tuple[int, bytes | None, bytes | None]] = []
    for info in log.batches_from(log.log_start_offset):
        if read_header(info.batch).is_control:
            out.append((info.base_offset, None,
                        b"commit" if marker_type(info.batch) == COMMIT else b"abort"))
            continue
        out += [(r.offset, r.key, r.value) for r in DefaultRecordBatch(bytes(info.batch))]
    return out


def clean_until_done(log: PartitionStore, clock: Clock, map_bytes: int) -> int:
    """Clean while a cleaning is due; return how many cleanings ran."""
    for rounds in range(1000):
        clock.now += 1
        if not run_cleaner(log, clock, map_bytes=map_bytes):
            return rounds
    raise AssertionError("the cleaner never ran out of work")


def test_a_small_key_map_cleans_over_several_rounds_to_the_same_result(
        storage: Storage, clock: Clock) -> None:
    """``logCleanerDedupeBufferSize`` bounds one cleaning's map: with room for a few keys
    a partition takes many cleanings, which end where one unbounded cleaning ends."""
    storage.create_topic(f"{TOPIC}-small-map", 1, {"cleanup.policy": "compact"})
    small = storage.partition(f"{TOPIC}-small-map", 0)
    assert small is not None
    log = partition(storage)
    model = write_random(log, clock, seed=34, rounds=300)
    assert write_random(small, clock, seed=34, rounds=300) == model

    unbounded = clean_until_done(log, clock, DEFAULT_MAP_BYTES)
    bounded = clean_until_done(small, clock, 2000)  # about 18 keys a cleaning
    assert bounded > unbounded + 5
    assert contents(small) == contents(log)
    assert read_committed(small)[0] == model.visible()
    assert Checkpoint.load(small).offset == Checkpoint.load(log).offset


@pytest.mark.parametrize("merged", [False, True], ids=["one", "merged"])
@pytest.mark.parametrize("leftover", [".cleaned", ".swap", ".swapped"])
def test_a_swap_cut_short_by_a_crash_loses_and_duplicates_nothing(
        tmp_path: Path, clock: Clock, leftover: str, merged: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The process dies after writing a cleaned ledger (``.cleaned``: not yet committed,
    removed at the next start) or after committing it (``.swap``: the next start swaps it
    in, its facts taken from the file), before the metadata was written; or the next
    start itself dies while completing that swap (``.swapped``: the cleaned ledger is in
    place, the metadata still the old one). ``merged``: the cleaning that dies merges
    several small cleaned ledgers into one; the next start removes the ones it covers."""
    storage = open_engine("file", tmp_path, clock)
    storage.create_topic(TOPIC, 1, {"cleanup.policy": "compact"})
    log = partition(storage)
    assert isinstance(log, PartitionLog)
    model = write_random(log, clock, seed=3, rounds=200)
    if merged:  # a first cleaning leaves small ledgers, which the next one merges
        clock.now += 1
        assert run_cleaner(log, clock)
    log.flush()
    directory = log.directory
    left: list[Path] = []
    groups: list[int] = []

    def dies_midway(segments: Sequence[SealedSegment], batches: Sequence[BatchInfo]) -> bool:
        facts = next(ledger.facts for ledger in log._ledgers
                     if ledger.ledger_id == segments[0].ident).copy()
        facts.next_offset = segments[-1].next_offset
        temp, _ = Ledger.write_cleaned(directory, facts, batches, 4096)
        if leftover == ".swap":
            temp = temp.replace(temp.with_suffix(SWAP_SUFFIX))
        elif leftover == ".swapped":  # as the next start leaves it if it dies midway
            (directory / (ledger_file_name(facts.ledger_id) + SWAPPED_SUFFIX)).touch()
            temp = temp.replace(directory / ledger_file_name(facts.ledger_id))
        left.append(temp)
        groups.append(len(segments))
        raise Died

    monkeypatch.setattr(log, "replace_segments", dies_midway)
    clock.now += 1
    with pytest.raises(Died):
        run_cleaner(log, clock)
    assert left and left[0].exists()
    assert (groups[0] > 1) == merged
    # nothing is closed: the next start opens what the disk holds
    again = PartitionLog(directory, LogConfig(segment_bytes=2048, segment_ms=SEGMENT_MS),
                         clock=clock)
    try:
        assert not any(p.name.endswith((".cleaned", ".swap", ".swapped", ".dropped"))
                       for p in directory.iterdir())
        seen, _ = read_committed(again)
        assert {k: v for k, v in seen.items() if v[1] is not None} == model.visible()
        assert all(model.latest[key] == value for key, value in seen.items())
        for segment in again.sealed_segments():
            again.verify_at(max(segment.first_offset, again.log_start_offset))
        assert not again.damaged_ranges()
        if leftover == ".cleaned":
            assert again.size_bytes == log.size_bytes
        else:  # the cleaned ledger is in
            assert again.size_bytes < log.size_bytes
            assert len(again.sealed_segments()) == len(log.sealed_segments()) - groups[0] + 1
    finally:
        again.close()


class Died(Exception):
    """The process dies here."""


@pytest.mark.parametrize("end", ["commit", "abort", "open"])
def test_a_transaction_whose_marker_is_in_the_open_segment(
        storage: Storage, clock: Clock, end: str) -> None:
    """A long transaction (faust's exactly_once changelog writes) fills sealed segments
    while its marker lands in the open one: once the marker is written the transaction
    is decided and cleaned as Kafka does below the last stable offset; without a marker
    nothing from its start is cleaned."""
    log = partition(storage)
    pid = 5
    for i in range(60):
        append(log, batch([(f"k{i % 3}".encode(), f"v{i}".encode() * 20)], clock.now, pid,
                          i, transactional=True), clock)
    clock.now += SEGMENT_MS  # the marker opens a new segment
    if end != "open":
        append(log, marker_batch(pid, 0, end == "commit", clock.now), clock)
    else:
        append(log, batch([(b"other", b"other")], clock.now), clock)
    assert len(log.sealed_segments()) > 2
    before, _ = read_committed(log)
    size_before = log.size_bytes

    clock.now += 1
    cleaned = run_cleaner(log, clock)
    seen, read = read_committed(log)
    if end == "open":
        assert not cleaned and log.size_bytes == size_before and seen == before
        return
    assert cleaned and log.size_bytes < size_before
    if end == "commit":
        assert seen == {f"k{i % 3}".encode(): (i, f"v{i}".encode() * 20)
                        for i in range(57, 60)} and read == 3
    else:
        assert seen == {} and read == 0
    state = PartitionProducers()
    for info in log.batches_from(log.log_start_offset):
        state.apply(info)
    assert state.producers[pid].last_sequence == 59


def test_a_cleaned_segment_is_not_rewritten_again(storage: Storage, clock: Clock) -> None:
    """A second cleaning of segments that nothing new made dirty rewrites none of them
    (the fillers of the first one stay as they are)."""
    log = partition(storage)
    write_random(log, clock, seed=11, rounds=150)
    for _ in range(2):  # the second removes what the first stamped
        clock.now += 1
        assert run_cleaner(log, clock)
    clock.now += 1
    found = dirt(log, SETTINGS, clock.now, Checkpoint())  # as if everything were dirty
    again = clean(log, found.cleanable, SETTINGS, clock.now, lambda size: None, Checkpoint())
    assert isinstance(again, Cleaned) and again.segments == 0


CONFIGS = {"cleanup.policy": "compact",
           "min.cleanable.dirty.ratio": str(SETTINGS.min_dirty_ratio),
           "min.compaction.lag.ms": str(SETTINGS.min_lag_ms),
           "max.compaction.lag.ms": str(SETTINGS.max_lag_ms),
           "delete.retention.ms": str(SETTINGS.delete_retention_ms),
           "segment.bytes": str(SETTINGS.segment_bytes)}


def log_cleaner(storage: Storage, clock: Clock, configs: dict[str, str] = CONFIGS,
                ) -> LogCleaner:
    """The broker's cleaner over ``storage``, every partition of it compacted by
    ``configs``."""
    return LogCleaner(storage, lambda name: configs, lambda name, index: True, 0, clock)


def test_an_open_transaction_is_not_read_again_until_the_log_changes(
        storage: Storage, clock: Clock) -> None:
    """A transaction without its marker (a hung producer) bounds the cleaning; the
    cleaner then reads the partition again only once something is appended, and cleans
    the transaction once its marker is there."""
    log = partition(storage)
    for i in range(30):  # cleaned below the transaction at once
        append(log, batch([(f"p{i % 3}".encode(), f"v{i}".encode() * 20)], clock.now), clock)
    pid = 5
    clock.now += SEGMENT_MS  # the transaction starts a segment of its own
    for i in range(40):
        append(log, batch([(f"k{i % 3}".encode(), f"v{i}".encode() * 20)], clock.now, pid,
                          i, transactional=True), clock)
    clock.now += SEGMENT_MS
    append(log, batch([(b"other", b"other")], clock.now), clock)
    cleaner = log_cleaner(storage, clock)

    assert cleaner.run_once() == 1  # what lies below the transaction
    read = cleaner.io_bytes
    assert read > 0
    for _ in range(3):
        clock.now += 1000
        assert cleaner.run_once() == 0
    assert cleaner.io_bytes == read  # not read again

    append(log, batch([(b"other", b"again")], clock.now), clock)  # not its marker
    cleaner.run_once()  # reads the partition (and finds nothing more to clean)
    assert cleaner.io_bytes > read  # read once more
    read = cleaner.io_bytes
    clock.now += 1000
    assert cleaner.run_once() == 0 and cleaner.io_bytes == read

    append(log, marker_batch(pid, 0, True, clock.now), clock)
    clock.now += 1
    assert cleaner.run_once() == 1
    seen, _ = read_committed(log)
    assert {key: seen[key] for key in (b"k0", b"k1", b"k2")} == {
        f"k{i % 3}".encode(): (30 + i, f"v{i}".encode() * 20) for i in range(37, 40)}
    assert cleaner.io_bytes > read


def reclaimed_total() -> float:
    value = REGISTRY.get_sample_value("kop_log_cleaner_bytes_reclaimed_total")
    return 0.0 if value is None else value


def test_bytes_reclaimed_are_the_bytes_the_engine_freed(storage: Storage,
                                                        clock: Clock) -> None:
    """A cleaning that only stamps tombstones (removes nothing; the stamped batches grow
    a little, their timestamp deltas now against the horizon) reports no bytes reclaimed;
    the next, which removes them, reports what the partition shrank by."""
    log = partition(storage)
    tombstones = 0
    for i in range(40):
        value = None if i // 5 % 2 == 0 else f"v{i}".encode() * 20  # runs of 5
        built = batch([(f"k{i}".encode(), value)], clock.now, compression=0)
        tombstones += len(built) if value is None else 0
        append(log, built, clock)
    clock.now += SEGMENT_MS
    append(log, batch([(b"end", b"end")], clock.now), clock)
    assert len(log.sealed_segments()) > 1
    cleaner = log_cleaner(storage, clock, CONFIGS | {"segment.bytes": "1"})  # no merging

    before, size = reclaimed_total(), log.size_bytes
    clock.now += 1
    assert cleaner.run_once() == 1  # stamps the tombstones' delete horizon
    assert log.size_bytes >= size and reclaimed_total() == before

    size = log.size_bytes
    clock.now += 1  # past the horizon (delete.retention.ms 0)
    assert cleaner.run_once() == 1
    freed = reclaimed_total() - before
    assert freed == size - log.size_bytes
    assert tombstones // 2 < freed < tombstones * 2  # less the fillers over their gaps


def test_the_gil_changes_hands_sooner_while_a_cleaning_runs() -> None:
    """Within ``short_gil_turns`` the interpreter's switch interval is the cleaner's short
    one (never longer than it was); after it, what it was."""
    before = sys.getswitchinterval()
    with short_gil_turns():
        assert sys.getswitchinterval() == pytest.approx(min(before, GIL_TURN_SECONDS))
    assert sys.getswitchinterval() == before
    with pytest.raises(KeyError), short_gil_turns():
        raise KeyError("a cleaning that failed")
    assert sys.getswitchinterval() == before


def test_an_empty_batch_left_compressed_is_rewritten_without_codec(storage: Storage,
                                                                     clock: Clock) -> None:
    """An idempotent producer's last batch that the cleaning leaves with no record is
    written as Kafka writes an empty batch (no codec, no payload: librdkafka aborts on an
    empty compressed one), and such a batch an older cleaner wrote is rewritten."""
    log = partition(storage)
    append(log, batch([(b"a", b"old")], clock.now, 10, 0, compression=1), clock)
    left = bytearray(batch([(b"a", b"gone")], clock.now, 11, 0, compression=1))
    empty = rebuilt(left, read_header(left), b"", [], None)  # then as the new code does
    old_style = bytearray(empty[:61]) + deflate(1, b"")  # and as the old one did
    old_style[57:61] = (0).to_bytes(4, "big")
    old_style[21:23] = (int.from_bytes(old_style[21:23], "big") | 1).to_bytes(2, "big")
    old_style[8:12] = (len(old_style) - 12).to_bytes(4, "big")
    seal(old_style)
    append(log, old_style, clock)
    for i in range(40):  # replaces "a", rolls segments
        append(log, batch([(b"a", f"new-{i}".encode() * 20)], clock.now, compression=0), clock)
    clock.now += SEGMENT_MS
    append(log, batch([(b"end", b"end")], clock.now, compression=0), clock)
    assert run_cleaner(log, clock)
    headers = {info.base_offset: read_header(info.batch)
               for info in log.batches_from(log.log_start_offset)}
    assert headers[0].producer_id == 10 and headers[1].producer_id == 11
    for offset in (0, 1):
        assert (headers[offset].record_count, headers[offset].compression) == (0, 0)
    assert all(len(info.batch) == 61 for info in log.batches_from(0) if info.last_offset < 2)


def test_only_active_producers_keep_their_last_batch(storage: Storage,
                                                     clock: Clock) -> None:
    """Kafka keeps a producer's last batch (emptied) only while its producer state holds
    it: once the producer is idle past ``producerIdExpirationMs`` its batch goes like any
    other, or every producer id that ever wrote would keep one batch forever. Active are
    one that wrote within the expiration, and one whose transaction's marker (beyond the
    cleaned range) is that recent."""
    expiration = 3_600_000
    settings = dataclasses.replace(SETTINGS, producer_expiration_ms=expiration)
    log = partition(storage)
    for pid in range(100, 120):  # short-lived idempotent producers, one batch each
        append(log, batch([(b"k", f"v{pid}".encode())], clock.now, pid, 0, compression=0),
               clock)
    append(log, batch([(b"k", b"txn")], clock.now, 200, 0, True, compression=0), clock)
    clock.now += expiration + SEGMENT_MS  # every producer above idle past the expiration
    append(log, batch([(b"k", b"recent")], clock.now, 300, 0, compression=0), clock)
    append(log, batch([(b"k", b"latest")], clock.now, compression=0), clock)
    clock.now += SEGMENT_MS  # the marker opens a new segment: beyond the cleaned range
    marker = append(log, marker_batch(200, 0, True, clock.now), clock)
    for _ in range(2):
        run_cleaner(log, clock, settings=settings)
        clock.now += 1
    kept = {read_header(info.batch).producer_id: read_header(info.batch).record_count
            for info in log.batches_from(log.log_start_offset) if info.base_offset < marker}
    assert kept == {200: 0, 300: 0, -1: 1}
    state = PartitionProducers()
    for info in log.batches_from(log.log_start_offset):
        state.apply(info)
    assert sorted(state.producers) == [200, 300]
    assert state.producers[300].last_sequence == state.producers[200].last_sequence == 0


def test_one_topics_configs_never_stop_the_cleaning_of_the_others(
        storage: Storage, clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    """A delete.retention.ms as large as a long stamps a delete horizon saturated at the
    largest timestamp (now + it would overflow the batch's int64 field); a topic whose
    configs cannot be read is left, with one log line while the cause stays the same,
    and the other topics are cleaned as ever."""
    forever, broken, good = (f"public/default/{name}" for name in ("a", "b", "z"))
    configs = {forever: {**CONFIGS, "delete.retention.ms": str(LONG_MAX)},
               broken: {**CONFIGS, "min.compaction.lag.ms": "soon"},
               good: CONFIGS}
    logs = {}
    for name in configs:
        storage.create_topic(name, 1, {"cleanup.policy": "compact"})
        log = storage.partition(name, 0)
        assert log is not None
        logs[name] = log
        for i in range(30):  # tombstones among values, over several segments
            append(log, batch([(f"k{i % 3}".encode(), None if i % 2 else b"v" * 200)],
                              clock.now, compression=0), clock)
        clock.now += SEGMENT_MS
        append(log, batch([(b"last", b"v")], clock.now, compression=0), clock)
    cleaner = LogCleaner(storage, configs.get, lambda name, index: True, 0, clock)
    clock.now += 1
    with caplog.at_level(logging.WARNING, logger="broker_core.compaction.cleaner"):
        assert cleaner.run_once() == 2  # the other two
        clock.now += 1
        cleaner.run_once()
    told = [r.getMessage() for r in caplog.records if "not cleaned" in r.getMessage()]
    print("told:", told)
    assert len(told) == 1 and broken in told[0] and "soon" in told[0]
    assert Checkpoint.load(logs[forever]).horizon == LONG_MAX
    assert Checkpoint.load(logs[good]).offset > 0
    assert Checkpoint.load(logs[broken]) == Checkpoint()


def test_a_drop_that_overtakes_a_cleaning_is_no_failure(
        storage: Storage, clock: Clock, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Retention or DeleteRecords moves the log start while the cleaner reads (here at
    its first read): the cleaning stops, nothing is logged as a failure (a WARNING each
    time, with other offsets in it), and the next round cleans."""
    log = partition(storage)
    for i in range(60):
        append(log, batch([(f"k{i % 3}".encode(), f"v{i}".encode() * 20)], clock.now), clock)
    clock.now += SEGMENT_MS
    append(log, batch([(b"other", b"other")], clock.now), clock)
    reads = {name: getattr(log, name) for name in ("batches_from", "headers_from")}
    drop_to = log.next_offset // 3

    def overtaken(name: str) -> Callable[[int], Iterator[BatchInfo]]:
        def read(offset: int) -> Iterator[BatchInfo]:
            if log.log_start_offset < drop_to:
                log.delete_records_before(drop_to)
            return reads[name](offset)
        return read

    for name in reads:
        monkeypatch.setattr(log, name, overtaken(name))
    caplog.set_level(logging.DEBUG, logger="broker_core.compaction.cleaner")
    cleaner = log_cleaner(storage, clock)
    assert cleaner.run_once() == 0
    assert log.log_start_offset == drop_to
    assert "the log start moved from 0 to" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert cleaner.run_once() == 1
