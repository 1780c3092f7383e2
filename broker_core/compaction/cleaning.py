"""Cleaning one partition of a compacted topic: which of its sealed segments may be
cleaned, how dirty it is, and the rewrite that keeps the latest record of each key.

*Cleanable* are the sealed segments, from the log start on, whose newest batch is at least
``min.compaction.lag.ms`` old; the *dirty* ones are those from the cleaner's checkpoint
(the end of the last cleaning, kept in the partition's key-value area) on. A partition is
cleaned when its dirty share of the cleanable bytes reaches ``min.cleanable.dirty.ratio``,
when its oldest dirty data waited ``max.compaction.lag.ms``, or when a delete horizon it
stamped has passed.

A cleaning reads the cleanable segments twice. The first pass maps each key to the offset
of its latest record (records of a transaction count once its commit marker is read;
aborted ones never), notes the aborted transactions and the last batch of each producer.
A transaction without its marker in the range stops the cleaning before the segment it
starts in: nothing at or beyond the last stable offset is cleaned. The second pass
rewrites each segment (``records``) by Kafka's rules:

* a record stays if it is its key's latest (a record without a key always stays), unless
  its transaction was aborted;
* a tombstone (null value) stays until the delete horizon of its batch, stamped
  ``delete.retention.ms`` ahead by the first cleaning that keeps it, has passed;
* a batch left without records goes, unless it is its producer's last in the range: it
  then stays empty, so the producer state rebuilt from the log keeps its sequence;
* a commit marker goes once its transaction has nothing left and its own delete horizon
  (stamped as a tombstone's) has passed. Abort markers stay (their transaction's records
  go): the aborted transactions a read_committed fetch lists point at them.

Kept records keep their offsets; removed ranges are covered by empty filler batches, so
a consumer positioned there moves on to the next kept offset. A segment whose batches all
stay as they were is not written.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from broker_core.codec.batch_header import BatchHeader, last_offset_delta, read_header
from broker_core.codec.errors import MalformedBatch
from broker_core.codec.markers import COMMIT, marker_type
from broker_core.storage import BatchInfo, PartitionStore, SealedSegment

from . import records as rec

log = logging.getLogger(__name__)

CHECKPOINT_KEY = "cleaner-checkpoint.json"
"""The cleaner's checkpoint in the partition's key-value area: where the last cleaning
ended and the earliest delete horizon it left."""

Pace = Callable[[int], None]
"""Called with the bytes just read or written; sleeps to keep the cleaner's I/O rate (and
raises :class:`Stopped` when the broker stops)."""


class Stopped(Exception):
    """The broker is stopping: the cleaning in progress is left (nothing is swapped)."""


@dataclass(frozen=True, slots=True)
class CompactionSettings:
    """A compacted topic's cleaning settings (its effective configs)."""

    min_dirty_ratio: float
    min_lag_ms: int
    max_lag_ms: int
    delete_retention_ms: int

    @classmethod
    def of(cls, configs: Mapping[str, str]) -> CompactionSettings:
        return cls(float(configs["min.cleanable.dirty.ratio"]),
                   int(configs["min.compaction.lag.ms"]),
                   int(configs["max.compaction.lag.ms"]),
                   int(configs["delete.retention.ms"]))


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Where the last cleaning ended, and the earliest delete horizon left behind."""

    offset: int = 0
    horizon: int | None = None

    @classmethod
    def load(cls, store: PartitionStore) -> Checkpoint:
        raw = store.state.get(CHECKPOINT_KEY)
        if raw is None:
            return cls()
        try:
            doc = json.loads(raw)
            horizon = doc.get("horizon")
            return cls(int(doc["offset"]), None if horizon is None else int(horizon))
        except (ValueError, KeyError, TypeError):
            return cls()

    def save(self, store: PartitionStore) -> None:
        store.state.put(CHECKPOINT_KEY, json.dumps(
            {"offset": self.offset, "horizon": self.horizon}).encode())


@dataclass(frozen=True, slots=True)
class Dirt:
    """How much of a partition awaits cleaning."""

    cleanable: list[SealedSegment]
    ratio: float
    """Dirty bytes over cleanable bytes (0 when nothing is cleanable)."""
    delay_ms: int
    """How long its oldest dirty data has waited (0 when none)."""
    due: bool


def dirt(store: PartitionStore, settings: CompactionSettings, now: int,
         checkpoint: Checkpoint) -> Dirt:
    """How dirty ``store`` is, and whether it is due for a cleaning."""
    cleanable: list[SealedSegment] = []
    for segment in store.sealed_segments():
        if now - segment.max_broker_timestamp < settings.min_lag_ms:
            break
        cleanable.append(segment)
    total = sum(segment.size_bytes for segment in cleanable)
    dirty = [s for s in cleanable if s.next_offset > checkpoint.offset]
    dirty_bytes = sum(segment.size_bytes for segment in dirty)
    ratio = dirty_bytes / total if total else 0.0
    oldest = dirty[0].min_broker_timestamp if dirty else -1
    delay = max(now - oldest, 0) if oldest >= 0 else 0
    horizon_passed = checkpoint.horizon is not None and now >= checkpoint.horizon
    due = bool(cleanable) and (
        (bool(dirty) and (ratio >= settings.min_dirty_ratio or delay >= settings.max_lag_ms))
        or horizon_passed)
    return Dirt(cleanable, ratio, delay, due)


@dataclass(slots=True)
class _Txn:
    start: int
    keys: list[tuple[bytes, int]] = field(default_factory=list)
    retained: bool = False


@dataclass(slots=True)
class _Plan:
    """What the first pass learnt."""

    latest: dict[bytes, int] = field(default_factory=dict)
    aborted: set[tuple[int, int]] = field(default_factory=set)
    last_batch: dict[int, int] = field(default_factory=dict)
    open_from: int | None = None
    """First offset of the oldest transaction without its marker in the range."""


@dataclass(frozen=True, slots=True)
class Cleaned:
    """What one cleaning did."""

    segments: int
    """Segments rewritten."""
    bytes_before: int
    bytes_after: int
    end: int
    """The offset the cleaning reached (the new checkpoint)."""


def _batches(store: PartitionStore, segments: list[SealedSegment],
             pace: Pace) -> Iterator[BatchInfo]:
    if not segments:
        return
    end = segments[-1].next_offset
    start = max(segments[0].first_offset, store.log_start_offset)
    if start >= end:
        return
    for info in store.batches_from(start):
        if info.base_offset >= end:
            return
        pace(len(info.batch))
        yield info


def _plan(store: PartitionStore, segments: list[SealedSegment], pace: Pace) -> _Plan:
    plan = _Plan()
    pending: dict[int, _Txn] = {}
    for info in _batches(store, segments, pace):
        header = read_header(info.batch)
        pid = header.producer_id
        if header.is_control:
            txn = pending.pop(pid, None)
            if txn is None:
                continue
            if marker_type(info.batch) == COMMIT:
                for key, offset in txn.keys:
                    if plan.latest.get(key, -1) < offset:
                        plan.latest[key] = offset
            else:
                plan.aborted.add((pid, txn.start))
            continue
        _, records = rec.read_records(info.batch, header)
        if pid >= 0:
            plan.last_batch[pid] = info.base_offset
        if header.is_transactional:
            txn = pending.setdefault(pid, _Txn(info.base_offset))
            txn.keys += [(r.key, info.base_offset + r.offset_delta)
                         for r in records if r.key is not None]
        else:
            for r in records:
                if r.key is not None:
                    plan.latest[r.key] = info.base_offset + r.offset_delta
    if pending:
        plan.open_from = min(txn.start for txn in pending.values())
    return plan


class _Rewriter:
    """The second pass: each batch as it stays (or None when it goes)."""

    def __init__(self, plan: _Plan, settings: CompactionSettings, now: int) -> None:
        self.plan = plan
        self.now = now
        self.stamp = now + settings.delete_retention_ms
        self.open: dict[int, _Txn] = {}
        self.horizon: int | None = None
        """The earliest delete horizon among what stays."""

    def _note_horizon(self, horizon: int) -> None:
        self.horizon = horizon if self.horizon is None else min(self.horizon, horizon)

    def batch(self, info: BatchInfo) -> bytes | memoryview | None:
        header = read_header(info.batch)
        if header.is_control:
            return self._marker(info, header)
        pid = header.producer_id
        aborted = False
        txn: _Txn | None = None
        if header.is_transactional:
            txn = self.open.setdefault(pid, _Txn(info.base_offset))
            aborted = (pid, txn.start) in self.plan.aborted
        buf, records = rec.read_records(info.batch, header)
        horizon = rec.delete_horizon(header)
        passed = horizon is not None and self.now >= horizon
        latest = self.plan.latest
        kept = [r for r in records if not aborted and (
            r.key is None or latest.get(r.key) == info.base_offset + r.offset_delta)
            and not (r.tombstone and passed)]
        if not kept and not (pid >= 0 and self.plan.last_batch.get(pid) == info.base_offset):
            return None
        if txn is not None:
            txn.retained = True
        tombstones = any(r.tombstone for r in kept)
        stamp = self.stamp if tombstones and horizon is None else None
        if tombstones:
            self._note_horizon(horizon if horizon is not None else self.stamp)
        if len(kept) == len(records) and stamp is None:
            return info.batch
        return rec.rebuilt(info.batch, header, buf, kept, stamp)

    def _marker(self, info: BatchInfo, header: BatchHeader) -> bytes | memoryview | None:
        txn = self.open.pop(header.producer_id, None)
        if (txn is not None and txn.retained) or marker_type(info.batch) != COMMIT:
            return info.batch
        horizon = rec.delete_horizon(header)
        if horizon is None:
            self._note_horizon(self.stamp)
            return rec.stamped(info.batch, header, self.stamp)
        if self.now >= horizon:
            return None
        self._note_horizon(horizon)
        return info.batch


def _rewrite(store: PartitionStore, segment: SealedSegment, rewriter: _Rewriter,
             pace: Pace) -> list[BatchInfo] | None:
    """The segment's batches as they stay, fillers over what goes; None if unchanged."""
    out: list[BatchInfo] = []
    changed = False
    expected = segment.first_offset
    gap_stamp = -1  # the newest broker timestamp of the batches a filler replaces

    def fill(upto: int, stamp: int) -> None:
        nonlocal expected
        for batch in rec.fillers(expected, upto):
            last = expected + last_offset_delta(batch)
            out.append(BatchInfo(expected, last, -1, stamp, batch))
            expected = last + 1

    for info in _batches(store, [segment], pace):
        kept = rewriter.batch(info)
        if kept is None:
            changed = True
            gap_stamp = max(gap_stamp, info.broker_timestamp)
            continue
        if info.base_offset > expected:
            changed = True
            fill(info.base_offset, gap_stamp if gap_stamp >= 0 else info.broker_timestamp)
        changed = changed or kept is not info.batch
        out.append(BatchInfo(info.base_offset, info.last_offset, info.max_timestamp,
                             info.broker_timestamp, kept))
        expected, gap_stamp = info.last_offset + 1, -1
    if expected < segment.next_offset:
        changed = True
        fill(segment.next_offset,
             gap_stamp if gap_stamp >= 0 else segment.max_broker_timestamp)
    if changed:
        pace(sum(len(info.batch) for info in out))
    return out if changed else None


def clean(store: PartitionStore, cleanable: list[SealedSegment], settings: CompactionSettings,
          now: int, pace: Pace, previous: Checkpoint) -> Cleaned | None:
    """Clean the ``cleanable`` segments of ``store`` (see the module docstring); None when
    an open transaction leaves nothing to clean. Raises MalformedBatch for a batch whose
    records do not parse (the partition is then left as it is)."""
    for segment in cleanable:  # trusted at start-up: scanned before it is rewritten
        at = max(segment.first_offset, store.log_start_offset)
        if at < segment.next_offset and store.needs_verification(at):
            store.verify_at(at)
    plan = _plan(store, cleanable, pace)
    if plan.open_from is not None:
        cleanable = [s for s in cleanable if s.next_offset <= plan.open_from]
    if not cleanable:
        return None
    rewriter = _Rewriter(plan, settings, now)
    before = after = rewritten = 0
    end = cleanable[-1].next_offset
    for segment in cleanable:
        batches = _rewrite(store, segment, rewriter, pace)
        if batches is None:
            continue
        if not store.replace_segment(segment, batches):  # changed meanwhile: next time
            end = segment.first_offset
            break
        rewritten += 1
        before += segment.size_bytes
        after += sum(len(info.batch) for info in batches)
    horizon = rewriter.horizon
    if previous.offset > end and previous.horizon is not None:  # beyond: still pending
        horizon = previous.horizon if horizon is None else min(horizon, previous.horizon)
    Checkpoint(max(end, previous.offset), horizon).save(store)
    return Cleaned(rewritten, before, after, end)


__all__ = ["CHECKPOINT_KEY", "Checkpoint", "Cleaned", "CompactionSettings", "Dirt",
           "MalformedBatch", "Stopped", "clean", "dirt"]
