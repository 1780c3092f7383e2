"""Per-partition producer state: idempotence, open transactions and aborted transactions.

For every producer id the partition remembers its epoch and its last five batches'
sequence ranges with their offsets: a retried batch is answered with its original offset
and not written again, a gap answers OUT_OF_ORDER_SEQUENCE_NUMBER, an older epoch
INVALID_PRODUCER_EPOCH. Open transactions hold back the last stable offset; aborted ones
are listed for read_committed fetches. ``producer_states`` keeps one per partition and
rebuilds it from snapshots and the log, so it survives restarts.

Both answers are asked by every fetch, so neither scans what the partition remembers: the
first offsets of the open transactions are kept by producer id with a heap of them (the
oldest at its top, entries of transactions since ended dropped when they come up), and the
aborted transactions in marker order, each with a bound below which no transaction listed
after it begins (Kafka's transaction index keeps the last stable offset at each abort for
that): a fetch finds the first whose marker is at or past its start by bisection and stops
at the first whose bound reaches its end (Kafka's ``collectAbortedTxns``).

A transaction marker is refused (:meth:`PartitionProducers.check_marker`, as Kafka's
``appendEndTxnMarker``) when its coordinator epoch is below the last one that ended a
transaction of the producer here (TRANSACTION_COORDINATOR_FENCED: a coordinator that lost
the transactional id's state partition, whose late marker would end the producer's next
transaction) or its producer epoch below the producer's (INVALID_PRODUCER_EPOCH). The
coordinator epoch of each producer is kept in its snapshot and read back from the markers.

A batch that skips ahead of the sequence expected, within ``RESUME_GRACE_S`` of the
partition refusing a produce as not its leader or failing an append
(:attr:`PartitionProducers.resumed_at`), is answered NOT_LEADER_OR_FOLLOWER, not
OUT_OF_ORDER: its predecessor was refused while the partition moved here (a request
pipelined behind it is judged once the claim is done) or its write failed, and the client
sends that one again first. OUT_OF_ORDER_SEQUENCE_NUMBER there makes librdkafka bump its
epoch and send every message it has not seen acknowledged again, on every partition, as
new: those a broker stored without its answer coming back (a broker paused or killed
meanwhile) were stored twice.

A producer that wrote nothing for ``producer.id.expiration.ms`` (and has no open
transaction) is forgotten (:meth:`PartitionProducers.expire`). A producer the partition
does not know is accepted at any sequence, as Kafka does since KIP-360: it may be one
whose state expired, or whose every batch retention deleted, and refusing it would be
fatal to an idempotent client that did nothing wrong.
"""

from __future__ import annotations

import time
from array import array
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from heapq import heapify, heappop, heappush
from operator import itemgetter
from typing import TypedDict

from broker_core.codec.batch_header import BatchHeader, read_header
from broker_core.codec.markers import COMMIT, read_marker
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.storage import BatchInfo

_KEPT_BATCHES = 5
_MARKER = itemgetter(2)
"""An aborted transaction's marker offset (its list is in that order)."""
_HEAP_SLACK = 16
"""Ended transactions the heap of open ones may hold beyond their number before it is
rebuilt from them."""
_INT32_MAX = 2**31 - 1
DEFAULT_EXPIRATION_MS = 86_400_000
"""Kafka's ``producer.id.expiration.ms``: one day."""


def expired(last_timestamp: int, now_ms: int, expiration_ms: int) -> bool:
    """Whether a producer whose latest batch (data or marker) has ``last_timestamp`` is
    idle past the expiration at ``now_ms`` (one with an open transaction never is: the
    caller's check)."""
    return last_timestamp <= now_ms - expiration_ms

BatchRange = tuple[int, int, int, int]
"""A kept batch: first and last sequence, base and last offset."""
ProducerSnapshot = tuple[int, list[BatchRange], int | None, int, int, bool]
"""A producer in a snapshot: epoch, kept batches, first offset of its open transaction,
last timestamp, coordinator epoch of its last marker, and whether its last sequence is
unknown (``ProducerEntry.sequence_unknown``) (a JSON array; its batches read back as
lists; a snapshot written before the coordinator epoch was kept has four items, before
the last flag five)."""


class Snapshot(TypedDict):
    """The producer state of a partition as stored: valid up to ``offset``."""

    offset: int
    producers: dict[str, ProducerSnapshot]
    aborted: list[tuple[int, int, int]]


@dataclass(slots=True)
class ProducerEntry:
    """What a partition knows of one producer id."""

    epoch: int
    batches: deque[BatchRange] = field(default_factory=lambda: deque(maxlen=_KEPT_BATCHES))
    last_timestamp: int = -1
    coordinator_epoch: int = -1
    """The coordinator epoch of the last transaction marker written for the producer (-1:
    none known)."""
    sequence_unknown: bool = False
    """Restored from a snapshot taken while every remembered batch of the producer was
    still being committed (an engine that commits in groups): the batches stored before
    them are no longer remembered, so until it writes again the producer continues at any
    sequence, as one the partition does not know (its epoch and open transaction are
    kept). Without it, its retry of a batch whose commit failed would be refused
    OUT_OF_ORDER_SEQUENCE_NUMBER (expected 0), which makes librdkafka bump its epoch."""
    ended: tuple[int, int] | None = None
    """The first offset and the marker offset of the producer's last ended transaction:
    a snapshot valid up to an offset between them counts it open (an engine that commits
    in groups applies a marker before it is stored)."""

    @property
    def last_sequence(self) -> int:
        """The last sequence number written, -1 when none."""
        return self.batches[-1][1] if self.batches else -1


@dataclass(eq=False, slots=True)
class Verification:
    """That a producer's transaction took this partition, as the coordinator's state said
    (KIP-890's VerificationGuard): made before the state is read, found done by the
    append, dropped by the producer's next transaction marker, so a transaction that ended
    while the state was read lets no batch in after its marker."""

    epoch: int
    key: tuple[str, str]
    """The transactional id: its state topic and scoped id."""
    done: bool = False


RESUME_GRACE_S = 10.0
"""How long after a partition refused a produce as not its leader, or failed an append, a
batch that skips sequences is taken for one whose predecessor is still to come (module
docstring)."""


def _next_sequence(last: int) -> int:
    return 0 if last == _INT32_MAX else last + 1


def _ahead(sequence: int, expected: int) -> bool:
    """Whether ``sequence`` lies after ``expected`` (within half the wrapping range)."""
    return 0 < (sequence - expected) % (_INT32_MAX + 1) < (_INT32_MAX + 1) // 2


def _batch_last_sequence(header: BatchHeader) -> int:
    """The batch's last sequence: its base plus its last offset delta, wrapping past
    2**31 - 1 to 0 as Kafka's sequences do."""
    return (header.base_sequence + header.last_offset_delta) % (_INT32_MAX + 1)


class PartitionProducers:
    """The producer state of one partition."""

    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}
        self._open: dict[int, int] = {}
        """By producer id (one of ``producers``), the first offset of its open transaction."""
        self._oldest: list[tuple[int, int]] = []
        """A heap of (first offset, producer id) holding every entry of ``_open``, and
        entries of transactions ended since (dropped when they reach the top, or all at
        once when they outnumber the open ones by ``_HEAP_SLACK``)."""
        self._aborted: list[tuple[int, int, int]] = []  # (producer id, first offset, marker)
        self._bounds: array[int] = array("q")
        """For each of ``_aborted``: no aborted transaction listed after it begins below."""
        self.verifications: dict[int, Verification] = {}
        """By producer id, its open transaction's verification (never stored: a state
        rebuilt from the log verifies again)."""
        self.cleaned_below = 0
        """The log cleaner's checkpoint: no record of an aborted transaction is left below
        it, so aborted transactions whose marker lies below are not listed (their marker
        may be gone). The cleaner's thread raises it (one int, assigned whole)."""
        self.resumed_at: float | None = None
        """When the partition last refused a produce as not its leader or failed an append
        (``time.monotonic``; ``ProducerStates.resume``), or None."""

    # -- produce -------------------------------------------------------------------------

    def check(self, header: BatchHeader) -> int | None:
        """Validate a batch of an idempotent or transactional producer before it is written.

        Return the original base offset when the batch is a retry of one already written.
        """
        entry = self.check_epoch(header.producer_id, header.producer_epoch)
        if entry is None:  # new, expired or retained away: any sequence starts it
            return None
        last_seq = _batch_last_sequence(header)
        if header.producer_epoch == entry.epoch:
            for first, last, base, _last_offset in entry.batches:
                if (first, last) == (header.base_sequence, last_seq):
                    return base
            if entry.sequence_unknown and not entry.batches:
                return None
            expected = _next_sequence(entry.last_sequence)
            if header.base_sequence != expected:
                if self._resuming() and _ahead(header.base_sequence, expected):
                    raise KafkaApiError(
                        ErrorCode.NOT_LEADER_OR_FOLLOWER,
                        f"producer {header.producer_id} sent sequence {header.base_sequence},"
                        f" expected {expected}, just after the partition moved here or "
                        "failed a write: its earlier batch is to come first")
                raise KafkaApiError(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                                    f"producer {header.producer_id} sent sequence "
                                    f"{header.base_sequence}, expected {expected}")
        elif header.base_sequence != 0:
            raise KafkaApiError(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                                f"producer {header.producer_id} epoch {header.producer_epoch} "
                                f"must start at sequence 0, not {header.base_sequence}")
        return None

    def _resuming(self) -> bool:
        """Whether :attr:`resumed_at` is within ``RESUME_GRACE_S``."""
        return self.resumed_at is not None \
            and time.monotonic() - self.resumed_at < RESUME_GRACE_S

    def check_epoch(self, producer_id: int, epoch: int) -> ProducerEntry | None:
        """What the partition knows of the producer (None: nothing), once ``epoch`` is not
        older than the epoch it knows (INVALID_PRODUCER_EPOCH: a fenced producer's batch,
        or a transaction marker for an epoch already ended)."""
        entry = self.producers.get(producer_id)
        if entry is not None and epoch < entry.epoch:
            raise KafkaApiError(ErrorCode.INVALID_PRODUCER_EPOCH,
                                f"producer {producer_id} epoch {epoch} "
                                f"is older than {entry.epoch}")
        return entry

    def record(self, header: BatchHeader, base_offset: int, timestamp: int) -> None:
        """Remember a data batch written at ``base_offset`` with max timestamp
        ``timestamp`` (the log append time on topics that use it)."""
        entry = self.producers.get(header.producer_id)
        if entry is None or header.producer_epoch > entry.epoch:
            entry = self.producers[header.producer_id] = ProducerEntry(
                header.producer_epoch,
                coordinator_epoch=entry.coordinator_epoch if entry is not None else -1,
                ended=entry.ended if entry is not None else None)
        last_offset = base_offset + header.last_offset_delta
        if header.base_sequence >= 0:
            # as Kafka: the offsets a batch covers are its sequences, even once the
            # log cleaner removed some of its records (or all: it keeps the batch empty)
            entry.batches.append((header.base_sequence, _batch_last_sequence(header),
                                  base_offset, last_offset))
            entry.sequence_unknown = False
        entry.last_timestamp = timestamp  # as Kafka: the latest batch's, not the largest
        if header.is_transactional and header.producer_id not in self._open:
            self._begin(header.producer_id, base_offset)

    def verifying(self, producer_id: int, epoch: int, key: tuple[str, str]) -> Verification:
        """The verification of the producer's transaction here, made now unless one for
        the same epoch and transactional id is under way or done. A batch naming another
        transactional id at the epoch of one under way or done is verified (it can only
        fail: a producer id has one transactional id) with a verification kept nowhere, so
        it cannot displace the producer's own."""
        found = self.verifications.get(producer_id)
        if found is not None and found.epoch == epoch:
            return found if found.key == key else Verification(epoch, key)
        found = self.verifications[producer_id] = Verification(epoch, key)
        return found

    def refused(self, producer_id: int, guard: Verification) -> None:
        """The coordinator's state refused ``guard``'s batch (or could not be read): the
        guard goes, so refusals leave nothing behind (a producer's own later batch makes a
        new one)."""
        if self.verifications.get(producer_id) is guard:
            del self.verifications[producer_id]

    def verified(self, producer_id: int, epoch: int, key: tuple[str, str]) -> bool:
        """Whether the producer's open transaction was verified here, at ``epoch`` and
        for transactional id ``key``, and has written no marker since."""
        found = self.verifications.get(producer_id)
        return found is not None and found.done and found.epoch == epoch and \
            found.key == key

    def check_marker(self, producer_id: int, epoch: int, coordinator_epoch: int) -> None:
        """Refuse a transaction marker of producer ``epoch`` from a coordinator at
        ``coordinator_epoch`` before it is written: TRANSACTION_COORDINATOR_FENCED when a
        marker of a later coordinator epoch was written for the producer (a negative
        ``coordinator_epoch``, unknown, is not judged), INVALID_PRODUCER_EPOCH when the
        producer is known at a later epoch."""
        entry = self.check_epoch(producer_id, epoch)
        if entry is not None and 0 <= coordinator_epoch < entry.coordinator_epoch:
            raise KafkaApiError(ErrorCode.TRANSACTION_COORDINATOR_FENCED,
                                f"a marker of producer {producer_id} from coordinator epoch "
                                f"{coordinator_epoch}, which {entry.coordinator_epoch} fenced")

    def end_transaction(self, producer_id: int, epoch: int, commit: bool,
                        marker_offset: int, timestamp: int,
                        coordinator_epoch: int = -1) -> None:
        """Apply a transaction marker of ``coordinator_epoch`` written at ``marker_offset``
        at ``timestamp`` (judged by :meth:`check_marker` first, unless it is replayed)."""
        entry = self.producers.get(producer_id)
        if entry is None:
            entry = self.producers[producer_id] = ProducerEntry(epoch)
        entry.epoch = max(entry.epoch, epoch)
        entry.coordinator_epoch = max(entry.coordinator_epoch, coordinator_epoch)
        entry.last_timestamp = timestamp
        self.verifications.pop(producer_id, None)
        first = self._open.pop(producer_id, None)
        if first is not None:
            entry.ended = (first, marker_offset)
        if first is None or commit:
            return
        if self._aborted and marker_offset < self._aborted[-1][2]:
            # markers are applied in offset order; one that ever came late is sorted in
            # and the bounds computed again, so that they hold whatever comes
            self._aborted.append((producer_id, first, marker_offset))
            self._index_aborted()
            return
        # a transaction listed later is open now, or begins past this marker
        oldest = self._oldest_open()
        self._aborted.append((producer_id, first, marker_offset))
        self._bounds.append(marker_offset + 1 if oldest is None
                            else min(oldest, marker_offset + 1))

    def expire(self, now_ms: int, expiration_ms: int) -> int:
        """Forget producers without an open transaction whose last write (by its batch
        timestamp) is ``expiration_ms`` or more before ``now_ms``; return how many."""
        idle = [pid for pid, entry in self.producers.items()
                if pid not in self._open
                and expired(entry.last_timestamp, now_ms, expiration_ms)]
        for pid in idle:
            del self.producers[pid]
        return len(idle)

    # -- fetch ---------------------------------------------------------------------------

    def last_stable_offset(self, high_watermark: int, log_start: int) -> int:
        """The first offset of the oldest open transaction, else the high watermark; not
        below the log start (as Kafka: DeleteRecords or retention may have moved it past
        an open transaction's first offset) and, above all, never above the high watermark
        the caller answers with it, as Kafka keeps it: the state counts batches not visible
        yet (one waiting for its fsync; on PostgreSQL, any queued to the group commit),
        which may open a transaction beyond it. The one home of that rule: Fetch and
        ListOffsets both ask here, with the high watermark they answer."""
        first = self._oldest_open() if self._open else None
        return min(max(high_watermark if first is None else first, log_start), high_watermark)

    def aborted_between(self, start: int, end: int,
                        cleaned_below: int | None = None) -> list[tuple[int, int]]:
        """(producer id, first offset) of aborted transactions overlapping [start, end),
        but not those the log cleaner emptied (marker below ``cleaned_below``: by default
        the current one; a fetch passes the one it read before reading the batches, which
        the cleaner may swap meanwhile, so that the records it got are judged by it)."""
        start = max(start, self.cleaned_below if cleaned_below is None else cleaned_below)
        aborted = self._aborted
        if not aborted or aborted[-1][2] < start:
            return []
        found = []
        bounds = self._bounds
        for at in range(bisect_left(aborted, start, key=_MARKER), len(aborted)):
            pid, first, _marker = aborted[at]
            if first < end:
                found.append((pid, first))
            if bounds[at] >= end:  # none listed later begins before the end
                break
        return found

    def open_transaction(self, producer_id: int) -> int | None:
        """The first offset of the producer's open transaction here, None when none is."""
        return self._open.get(producer_id)

    @property
    def aborted(self) -> list[tuple[int, int, int]]:
        """(producer id, first offset, marker offset) of the aborted transactions still
        listed, in marker order (read only)."""
        return self._aborted

    def _begin(self, producer_id: int, first: int) -> None:
        """The producer's transaction opens at offset ``first``."""
        self._open[producer_id] = first
        heap = self._oldest
        if len(heap) > 2 * len(self._open) + _HEAP_SLACK:
            heap[:] = [(offset, pid) for pid, offset in self._open.items()]
            heapify(heap)
        else:
            heappush(heap, (first, producer_id))

    def _oldest_open(self) -> int | None:
        """The first offset of the oldest open transaction, None when none is open."""
        heap, open_ = self._oldest, self._open
        while heap and open_.get(heap[0][1]) != heap[0][0]:
            heappop(heap)
        return heap[0][0] if heap else None

    def _index_aborted(self) -> None:
        """Sort the aborted transactions by marker and compute their bounds (a transaction
        listed later is one listed now, one open now, or one beginning past every marker)."""
        aborted = self._aborted
        aborted.sort(key=_MARKER)
        oldest = self._oldest_open()
        bounds = array("q", bytes(8 * len(aborted)))
        later = oldest if oldest is not None else 2**63 - 1
        for at in range(len(aborted) - 1, -1, -1):
            _pid, first, marker = aborted[at]
            bounds[at] = min(later, marker + 1)
            later = min(later, first)
        self._bounds = bounds

    # -- persistence ---------------------------------------------------------------------

    def apply(self, info: BatchInfo) -> None:
        """Replay one stored batch."""
        header = read_header(info.batch)
        if header.producer_id < 0:
            return
        if header.is_control:
            kind, coordinator_epoch = read_marker(info.batch)
            self.end_transaction(header.producer_id, header.producer_epoch, kind == COMMIT,
                                 info.base_offset, header.max_timestamp, coordinator_epoch)
        else:
            self.record(header, info.base_offset, header.max_timestamp)

    def to_json(self, offset: int) -> Snapshot:
        """A snapshot valid up to ``offset`` (copies: it may be encoded in another thread).

        Batches at or beyond ``offset`` are left out: an engine that commits appends in
        groups has them in memory before they are stored, and one whose commit then fails
        must not be taken for stored when the state is rebuilt from this snapshot (a retry
        of it would be acknowledged as a duplicate of nothing). Replaying the log from
        ``offset`` brings back the ones that were stored. So are transaction markers: a
        transaction begun below ``offset`` whose marker is not is open in the snapshot (were
        it closed, replaying its abort marker would list no aborted transaction, and
        read_committed fetches would serve its records)."""
        producers: dict[str, ProducerSnapshot] = {}
        for pid, entry in self.producers.items():
            kept = [batch for batch in entry.batches if batch[3] < offset]
            first = self._open.get(pid)
            if (first is None or first >= offset) and entry.ended is not None \
                    and entry.ended[0] < offset <= entry.ended[1]:
                first = entry.ended[0]  # its marker is not below the offset: open there
            producers[str(pid)] = (entry.epoch, kept,
                                   first if first is not None and first < offset else None,
                                   entry.last_timestamp, entry.coordinator_epoch,
                                   entry.sequence_unknown or (bool(entry.batches)
                                                              and not kept))
        return {"offset": offset, "producers": producers,
                "aborted": self._aborted[:bisect_left(self._aborted, offset, key=_MARKER)]}

    def forget_aborted_before(self, offset: int) -> None:
        """Drop aborted transactions whose marker is below ``offset`` (the log start) or
        below ``cleaned_below``: no fetch lists them any more."""
        offset = max(offset, self.cleaned_below)
        if self._aborted and self._aborted[0][2] < offset:
            below = bisect_left(self._aborted, offset, key=_MARKER)
            del self._aborted[:below]
            del self._bounds[:below]

    @classmethod
    def from_json(cls, document: Snapshot) -> PartitionProducers:
        """Restore a snapshot."""
        state = cls()
        for pid, (epoch, batches, first, stamp, *rest) in document["producers"].items():
            kept = ((b[0], b[1], b[2], b[3]) for b in batches)  # JSON gives lists
            state.producers[int(pid)] = ProducerEntry(
                epoch, deque(kept, maxlen=_KEPT_BATCHES), stamp,
                int(rest[0]) if rest else -1,  # -1: a snapshot from before it was kept
                bool(rest[1]) if len(rest) > 1 else False)
            if first is not None:
                state._begin(int(pid), int(first))
        state._aborted = [(int(a[0]), int(a[1]), int(a[2])) for a in document["aborted"]]
        state._index_aborted()
        return state
