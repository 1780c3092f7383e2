"""Cleaning one partition of a compacted topic: which of its sealed segments may be
cleaned, how dirty it is, and the rewrite that keeps the latest record of each key.

The *dirty* segments are the sealed ones from the cleaner's checkpoint (the end of the
last cleaning, kept in the partition's key-value area) on; *cleanable* are the sealed
segments up to the first dirty one whose records are younger than
``min.compaction.lag.ms``. A partition is cleaned when its dirty share of the cleanable
bytes is above ``min.cleanable.dirty.ratio``, when its oldest dirty data is older than
``max.compaction.lag.ms``, or when a delete horizon it stamped has passed (see
:func:`dirt`: Kafka's rules, on the records' timestamps).

A cleaning reads the cleanable segments three times. The first pass, on batch headers,
learns how each transaction ended (its marker), each producer's last batch, and the first
transaction without its marker: a transaction still open at the end of the range is
looked up in the log beyond it (control batches only), and one whose marker came later is
decided like the others (Kafka cleans below the last stable offset, and a long
transaction's marker is often in the open segment); one without a marker yet stops the
cleaning before the segment it starts in, so nothing at or beyond the last stable offset
is cleaned (the result names where it started: the cleaner does not read the partition
again for it until something is appended). The second maps each
key of the dirty part (from the checkpoint on; below it each key is there once already) to
the offset of its latest record, records of aborted transactions left out; the map is
bounded (``logCleanerDedupeBufferSize``, each key counted as its length plus
``MAP_ENTRY_BYTES``): when the next batch would outgrow it, the pass stops there and what
follows stays as it is, for the next cleaning (the checkpoint then lies inside a segment).
The third rewrites each segment (``records``) by Kafka's rules:

* a record stays unless its key has a later record in the map (a record without a key
  always stays), or its transaction was aborted;
* a tombstone (null value) stays until the delete horizon of its batch, stamped
  ``delete.retention.ms`` ahead by the first cleaning that keeps it, has passed;
* a batch left without records goes, unless it is its producer's last in the range and
  the producer is still active (as Kafka keeps the last batch of the producers its state
  still holds): it then stays empty, so the producer state rebuilt from the log keeps its
  sequence; a filler of an earlier cleaning stays as it is (so a segment cleaned before is
  not rewritten again for nothing). A producer is active while it has a transaction
  without its marker, or its latest batch (data or marker, in the range or the marker
  found beyond it) is younger than ``producerIdExpirationMs``: the rule by which the
  producer state forgets it (``partition_producers.expired``), so every producer id that
  ever wrote does not keep an empty batch forever;
* a transaction marker (commit or abort) goes once its transaction has nothing left in
  the log (not even its producer's last batch, kept empty) and its own delete horizon,
  stamped as a tombstone's by the first cleaning that finds the transaction empty, has
  passed (KIP-98's rule, as Kafka's cleaner applies it).

Below the checkpoint no record of an aborted transaction is left, so the aborted
transactions a read_committed fetch lists are only needed from there on: the producer
state forgets those whose marker lies below it (``PartitionProducers.cleaned_below``,
raised by the cleaner after each cleaning and read from the checkpoint when the state is
loaded). A marker is stamped by one cleaning and removed by a later one, so the checkpoint
that covers it is saved before it can go, and a producer snapshot taken before the
cleaning cannot bring back an aborted transaction whose marker is gone.

Kept records keep their offsets; removed ranges are covered by empty filler batches, so
a consumer positioned there moves on to the next kept offset. Adjacent segments whose
sizes add up to at most ``segment.bytes`` are written as one (Kafka's grouping, so a
cleaned partition does not keep ever smaller segments); a lone segment whose batches all
stay as they were is not written.
"""

from __future__ import annotations

import json
import logging
from bisect import bisect_right
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from broker_core.codec.batch_header import BatchHeader, last_offset_delta, read_header
from broker_core.codec.errors import MalformedBatch
from broker_core.codec.markers import COMMIT, marker_type
from broker_core.partition_producers import DEFAULT_EXPIRATION_MS, expired
from broker_core.storage import BatchInfo, PartitionStore, SealedSegment
from broker_core.topic_configs import LONG_MAX, config_number

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
    """A compacted topic's cleaning settings (its effective configs), and the broker's
    producer expiration."""

    min_dirty_ratio: float
    min_lag_ms: int
    max_lag_ms: int
    delete_retention_ms: int
    segment_bytes: int
    """Adjacent segments whose sizes add up to no more are merged into one."""
    producer_expiration_ms: int = DEFAULT_EXPIRATION_MS
    """``producerIdExpirationMs``: the last batch of a producer idle this long goes."""

    @classmethod
    def of(cls, configs: Mapping[str, str],
           producer_expiration_ms: int = DEFAULT_EXPIRATION_MS) -> CompactionSettings:
        return cls(float(configs["min.cleanable.dirty.ratio"]),
                   config_number(configs, "min.compaction.lag.ms"),
                   config_number(configs, "max.compaction.lag.ms"),
                   config_number(configs, "delete.retention.ms"),
                   config_number(configs, "segment.bytes"), producer_expiration_ms)


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
    """How far its oldest dirty data is past ``max.compaction.lag.ms`` (0 when it is not:
    Kafka's compaction delay)."""
    due: bool


FirstTimestamp = Callable[[PartitionStore, SealedSegment], int]
"""The max timestamp of a segment's first batch (-1 if it has none)."""


def first_batch_timestamp(store: PartitionStore, segment: SealedSegment) -> int:
    """The max timestamp of the first batch of ``segment`` still in the log (-1 if none)."""
    for info in store.headers_from(max(segment.first_offset, store.log_start_offset)):
        return info.max_timestamp if info.base_offset < segment.next_offset else -1
    return -1


def dirt(store: PartitionStore, settings: CompactionSettings, now: int,
         checkpoint: Checkpoint, first_timestamp: FirstTimestamp = first_batch_timestamp,
         ) -> Dirt:
    """How dirty ``store`` is, and whether it is due for a cleaning, as Kafka judges it by
    the records' timestamps (the batches' max timestamps: CreateTime or LogAppendTime):

    * the dirty segments from the first whose largest timestamp is less than
      ``min.compaction.lag.ms`` old are not cleanable (nor any after it);
    * the partition is due when its dirty share of the cleanable bytes is above
      ``min.cleanable.dirty.ratio``, or when the earliest first-batch timestamp of its dirty
      segments is more than ``max.compaction.lag.ms`` old (and something is cleanable), or
      when a delete horizon the last cleaning left has passed.
    """
    sealed = store.sealed_segments()
    dirty_all = [s for s in sealed if s.next_offset > checkpoint.offset]
    cleanable: list[SealedSegment] = []
    for segment in sealed:
        if settings.min_lag_ms > 0 and segment.next_offset > checkpoint.offset \
                and segment.max_timestamp > now - settings.min_lag_ms:
            break
        cleanable.append(segment)
    total = sum(segment.size_bytes for segment in cleanable)
    dirty = [s for s in cleanable if s.next_offset > checkpoint.offset]
    dirty_bytes = sum(segment.size_bytes for segment in dirty)
    ratio = dirty_bytes / total if total else 0.0
    firsts = [stamp for stamp in (first_timestamp(store, s) for s in dirty_all) if stamp > 0]
    clean_until = now - max(settings.max_lag_ms, 0)
    delay = max(clean_until - min(firsts), 0) if firsts else 0
    horizon_passed = checkpoint.horizon is not None and now >= checkpoint.horizon
    due = bool(cleanable) and (
        (bool(dirty) and (ratio > settings.min_dirty_ratio or delay > 0)) or horizon_passed)
    return Dirt(cleanable, ratio, delay, due)


@dataclass(slots=True)
class _Txn:
    start: int
    retained: bool = False


@dataclass(slots=True)
class _Plan:
    """What the first two passes learnt."""

    latest: dict[bytes, int] = field(default_factory=dict)
    aborted: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    """By producer id: (first offset, marker offset) of its aborted transactions."""
    last_batch: dict[int, int] = field(default_factory=dict)
    """By producer id: the base offset of its last data batch in the range, if the
    producer is still active (see the module docstring)."""
    open_from: int | None = None
    """First offset of the oldest transaction without its marker in the log."""
    limit: int | None = None
    """Where the key pass stopped, the map full: batches from there on stay as they are
    (None: it read the whole range)."""

    def aborted_at(self, producer_id: int, offset: int) -> bool:
        """Whether the producer's transactional batch at ``offset`` was aborted."""
        spans = self.aborted.get(producer_id, [])
        at = bisect_right(spans, (offset, _MAX_OFFSET)) - 1
        return at >= 0 and spans[at][0] <= offset < spans[at][1]


_MAX_OFFSET = 2**63 - 1
DEFAULT_MAP_BYTES = 128 << 20
"""Kafka's ``log.cleaner.dedupe.buffer.size`` default: 128 MiB."""
MAP_ENTRY_BYTES = 100
"""What one key of the cleaner's map costs beside the key's own bytes (a Python dict
entry, its key object and offset), as counted against ``logCleanerDedupeBufferSize``."""


def _entry_bytes(key: bytes) -> int:
    return MAP_ENTRY_BYTES + len(key)


@dataclass(frozen=True, slots=True)
class Cleaned:
    """What one cleaning did."""

    segments: int
    """Segments rewritten."""
    bytes_before: int
    """The size of the rewritten segments, as the engine counts it (on disk)."""
    bytes_after: int
    """The size of what replaced them, as the engine counts it after the swap."""
    end: int
    """The offset the cleaning reached."""
    checkpoint: int
    """The checkpoint saved: below it no record of an aborted transaction is left."""
    open_from: int | None = None
    """The first offset of a transaction without its marker that bounded the cleaning
    (None: none did)."""


@dataclass(frozen=True, slots=True)
class Blocked:
    """A cleaning an open transaction left nothing to do: nothing from ``open_from`` (the
    first offset of the oldest transaction without its marker) on may be cleaned yet."""

    open_from: int


def _size_after(store: PartitionStore, group: list[SealedSegment],
                batches: list[BatchInfo]) -> int:
    """The size of the segment that replaced ``group``, as the engine counts it (its
    entries' overhead included); the batches' bytes if it is gone meanwhile."""
    ident = group[0].ident
    return next((s.size_bytes for s in store.sealed_segments() if s.ident == ident),
                sum(len(info.batch) for info in batches))


def _batches(store: PartitionStore, segments: list[SealedSegment], pace: Pace,
             start: int = 0, headers: bool = False) -> Iterator[BatchInfo]:
    """The batches of ``segments`` from ``start`` on (whole, or with ``headers`` perhaps
    only the headers of data batches)."""
    if not segments:
        return
    end = segments[-1].next_offset
    start = max(start, segments[0].first_offset, store.log_start_offset)
    if start >= end:
        return
    for info in (store.headers_from if headers else store.batches_from)(start):
        if info.base_offset >= end:
            return
        pace(len(info.batch))
        yield info


def _outcomes(store: PartitionStore, segments: list[SealedSegment], pace: Pace, now: int,
              expiration_ms: int) -> _Plan:
    """The first pass, on batch headers: how each transaction ended, the last batch of
    each producer still active at ``now``, the first open transaction."""
    plan = _Plan()
    pending: dict[int, int] = {}  # producer id -> first offset of its open transaction
    written: dict[int, int] = {}  # producer id -> the timestamp of its latest batch
    for info in _batches(store, segments, pace, headers=True):
        header = read_header(info.batch)
        pid = header.producer_id
        if pid >= 0:
            written[pid] = header.max_timestamp
        if header.is_control:
            first = pending.pop(pid, None)
            if first is not None and marker_type(info.batch) != COMMIT:
                plan.aborted.setdefault(pid, []).append((first, info.base_offset))
            continue
        if pid >= 0:
            plan.last_batch[pid] = info.base_offset
        if header.is_transactional:
            pending.setdefault(pid, info.base_offset)
    if pending:
        _decide_later(store, segments[-1].next_offset, pending, plan, pace, written)
    if pending:
        plan.open_from = min(pending.values())
    for pid in [pid for pid in plan.last_batch
                if pid not in pending and expired(written[pid], now, expiration_ms)]:
        del plan.last_batch[pid]
    return plan


def _decide_later(store: PartitionStore, end: int, pending: dict[int, int], plan: _Plan,
                  pace: Pace, written: dict[int, int]) -> None:
    """Decide the ``pending`` transactions (producer id -> first offset) whose markers are
    at or after ``end``: an abort is noted in ``plan``, a commit needs nothing (its records
    are mapped as any others); those still open stay in ``pending``. A marker's timestamp
    goes to ``written`` (its producer's latest batch, as far as the cleaning reads)."""
    if end >= store.next_offset:
        return
    for info in store.headers_from(end):
        pace(len(info.batch))
        header = read_header(info.batch)
        first = pending.pop(header.producer_id, None) if header.is_control else None
        if first is None:
            continue
        written[header.producer_id] = header.max_timestamp
        if marker_type(info.batch) != COMMIT:
            plan.aborted.setdefault(header.producer_id, []).append((first, info.base_offset))
        if not pending:
            return


def _map_keys(store: PartitionStore, segments: list[SealedSegment], pace: Pace, plan: _Plan,
              dirty_from: int, map_bytes: int) -> None:
    """The second pass: each key's latest offset from ``dirty_from`` on (below it each key
    is there once already), records of aborted transactions left out, until the map would
    outgrow ``map_bytes`` (at least one batch is mapped): it then stops before that batch
    (``_Plan.limit``)."""
    used = 0  # estimated bytes of the map
    mapped = False
    for info in _batches(store, segments, pace, start=dirty_from):
        header = read_header(info.batch)
        if header.is_control or (header.is_transactional
                                 and plan.aborted_at(header.producer_id, info.base_offset)):
            continue
        _, records = rec.read_records(info.batch, header)
        keyed = [(r.key, info.base_offset + r.offset_delta)
                 for r in records if r.key is not None]
        cost = sum(_entry_bytes(key) for key, _ in keyed if key not in plan.latest)
        if mapped and used + cost > map_bytes:
            plan.limit = info.base_offset
            return
        mapped = True
        used += cost
        for key, offset in keyed:
            plan.latest[key] = offset


class _Rewriter:
    """The second pass: each batch as it stays (or None when it goes)."""

    def __init__(self, plan: _Plan, settings: CompactionSettings, now: int) -> None:
        self.plan = plan
        self.now = now
        # saturated: delete.retention.ms may be as large as a long (Long.MAX: forever)
        self.stamp = min(now + settings.delete_retention_ms, LONG_MAX)
        self.open: dict[int, _Txn] = {}
        self.horizon: int | None = None
        """The earliest delete horizon among what stays."""

    def _note_horizon(self, horizon: int) -> None:
        self.horizon = horizon if self.horizon is None else min(self.horizon, horizon)

    def batch(self, info: BatchInfo) -> bytes | memoryview | None:
        limit = self.plan.limit
        if limit is not None and info.base_offset >= limit:  # beyond the map: next time
            return info.batch
        header = read_header(info.batch)
        if header.is_control:
            return self._marker(info, header)
        pid = header.producer_id
        aborted = False
        txn: _Txn | None = None
        if header.is_transactional:
            txn = self.open.setdefault(pid, _Txn(info.base_offset))
            aborted = self.plan.aborted_at(pid, info.base_offset)
        if header.record_count == 0 and pid < 0:  # a filler of an earlier cleaning
            return info.batch
        buf, records = rec.read_records(info.batch, header)
        horizon = rec.delete_horizon(header)
        passed = horizon is not None and self.now >= horizon
        latest = self.plan.latest
        kept = [r for r in records if not aborted and (
            r.key is None or latest.get(r.key, -1) <= info.base_offset + r.offset_delta)
            and not (r.tombstone and passed)]
        if not kept and not (pid >= 0 and self.plan.last_batch.get(pid) == info.base_offset):
            return None
        if txn is not None:
            txn.retained = True
        tombstones = any(r.tombstone for r in kept)
        stamp = self.stamp if tombstones and horizon is None else None
        if tombstones:
            self._note_horizon(horizon if horizon is not None else self.stamp)
        if len(kept) == len(records) and stamp is None and (kept or not header.compression):
            return info.batch  # (an empty batch an older cleaner left compressed is rewritten)
        return rec.rebuilt(info.batch, header, buf, kept, stamp)

    def _marker(self, info: BatchInfo, header: BatchHeader) -> bytes | memoryview | None:
        txn = self.open.pop(header.producer_id, None)
        if txn is not None and txn.retained:
            return info.batch
        horizon = rec.delete_horizon(header)
        if horizon is None:
            self._note_horizon(self.stamp)
            return rec.stamped(info.batch, header, self.stamp)
        if self.now >= horizon:
            return None
        self._note_horizon(horizon)
        return info.batch


def _groups(segments: list[SealedSegment], max_bytes: int) -> list[list[SealedSegment]]:
    """``segments`` in runs of adjacent ones to be written as one, as Kafka groups them:
    their sizes add up to at most ``max_bytes`` (``segment.bytes``) and their offsets span
    at most 2**31 - 1 (a batch's offset deltas must reach)."""
    groups: list[list[SealedSegment]] = []
    for segment in segments:
        group = groups[-1] if groups else None
        if group is not None and group[-1].next_offset == segment.first_offset \
                and sum(s.size_bytes for s in group) + segment.size_bytes <= max_bytes \
                and segment.next_offset - group[0].first_offset <= _MAX_SPAN:
            group.append(segment)
        else:
            groups.append([segment])
    return groups


_MAX_SPAN = 2**31 - 1


def _rewrite(store: PartitionStore, group: list[SealedSegment], rewriter: _Rewriter,
             pace: Pace) -> list[BatchInfo] | None:
    """The batches of a run of segments as they stay, fillers over what goes; None if
    unchanged (one segment whose batches all stay as they are)."""
    out: list[BatchInfo] = []
    changed = len(group) > 1
    segment = group[-1]
    expected = group[0].first_offset
    gap_stamp = -1  # the newest broker timestamp of the batches a filler replaces

    def fill(upto: int, stamp: int) -> None:
        nonlocal expected
        for batch in rec.fillers(expected, upto):
            last = expected + last_offset_delta(batch)
            out.append(BatchInfo(expected, last, -1, stamp, batch))
            expected = last + 1

    for info in _batches(store, group, pace):
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
          now: int, pace: Pace, previous: Checkpoint,
          map_bytes: int = DEFAULT_MAP_BYTES) -> Cleaned | Blocked | None:
    """Clean the ``cleanable`` segments of ``store`` (see the module docstring), as far as
    a map of ``map_bytes`` reaches; :class:`Blocked` when an open transaction leaves
    nothing to clean, None when nothing is cleanable.
    Raises MalformedBatch for a batch whose records do not parse (the partition is then
    left as it is)."""
    for segment in cleanable:  # trusted at start-up: scanned before it is rewritten
        at = max(segment.first_offset, store.log_start_offset)
        if at < segment.next_offset and store.needs_verification(at):
            store.verify_at(at)
    plan = _outcomes(store, cleanable, pace, now, settings.producer_expiration_ms)
    if plan.open_from is not None:
        cleanable = [s for s in cleanable if s.next_offset <= plan.open_from]
    _map_keys(store, cleanable, pace, plan, previous.offset, map_bytes)
    if plan.limit is not None:
        cleanable = [s for s in cleanable if s.first_offset < plan.limit]
    if not cleanable:
        return None if plan.open_from is None else Blocked(plan.open_from)
    rewriter = _Rewriter(plan, settings, now)
    before = after = rewritten = 0
    end = cleanable[-1].next_offset
    if plan.limit is not None:
        end = min(end, plan.limit)
    for group in _groups(cleanable, settings.segment_bytes):
        batches = _rewrite(store, group, rewriter, pace)
        if batches is None:
            continue
        if not store.replace_segments(group, batches):  # changed meanwhile: next time
            end = group[0].first_offset
            break
        rewritten += len(group)
        before += sum(segment.size_bytes for segment in group)
        after += _size_after(store, group, batches)
    horizon = rewriter.horizon
    if previous.offset > end and previous.horizon is not None:  # beyond: still pending
        horizon = previous.horizon if horizon is None else min(horizon, previous.horizon)
    saved = Checkpoint(max(end, previous.offset), horizon)
    saved.save(store)
    return Cleaned(rewritten, before, after, end, saved.offset, plan.open_from)


__all__ = ["CHECKPOINT_KEY", "DEFAULT_MAP_BYTES", "Blocked", "Checkpoint", "Cleaned",
           "CompactionSettings", "Dirt", "FirstTimestamp", "MalformedBatch", "Stopped", "clean",
           "dirt", "first_batch_timestamp"]
