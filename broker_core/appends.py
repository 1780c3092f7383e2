"""The one way a batch enters a partition: ``AppendPath``.

Client produce, transaction markers, the broker's own topics and the audit topic all append
through it, so each of them gets the same three things: a failed write becomes a Kafka
error and one log line per cause (``storage_faults``), parked long-poll fetches of the
partition are woken (``waiters``), and the fsync policy counts the records
(``durability``: ``flushIntervalMessages`` / ``flushIntervalMs``). An append whose
acknowledgement waits for an fsync is visible, and its fetches woken, once that fsync is
done (``FlushScheduler.high_watermark``), as in Kafka with ``flush.messages``.

A partition whose appends are committed in groups (``GroupCommitted``: the ``postgres``
engine) answers an append at once with its base offset; what the caller awaits before
acknowledging is then the commit. Once it is done the fetches are woken (a fetch never
sees an offset before its commit); a commit that failed is logged here, once per cause,
and reaches the waiting caller as a :class:`ReportedFault` (an OSError answered with the
retriable error and not logged again; an :class:`UnknownOutcome` when the commit was sent
and its answer lost, so the batch may be stored; a commit fenced because another broker
took the partition reaches it as :class:`AppendFenced`, not a fault). The partition's
``generation`` moved on when the commit failed, which is how the producer state learns
that it must be rebuilt from what is stored (``producer_states``); an append judged
against the state from before is refused (``generation``).

A record batch whose commit's outcome is unknown is answered by what is stored: the
partition is asked (``GroupCommitted.holds``, again every ``READ_BACK_EVERY_S`` while the
database is away, for up to ``READ_BACK_S``) whether the batch is at its offset, and if
so it is acknowledged. A retriable error would tell librdkafka it is *not* persisted, and
an epoch bump (any partition of the producer answered OUT_OF_ORDER_SEQUENCE_NUMBER behind
a request that really failed) renumbers every unacknowledged message: a stored batch
would be sent again under a new epoch and stored twice. A retry judged a duplicate of a
batch whose commit is under way (``repeated``) is answered the same way should that
commit fail: by whether the batch it repeats is stored.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable

from broker_core.codec.batch_header import BatchHeader
from broker_core.codec.varints import Buffer
from broker_core.durability import FlushScheduler, TopicFlush
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.storage import PartitionStore, group_committed
from broker_core.storage.cluster import NotOwner
from broker_core.storage.errors import AppendAbandoned, AppendFenced, CommitUnknown, StorageError
from broker_core.storage.protocols import GroupCommitted
from broker_core.storage_faults import ReportedFault, UnknownOutcome, WriteKind
from broker_core.waiters import TopicPartition

READ_BACK_S = 20.0
"""Longest a record batch whose commit's outcome is unknown waits for the database to
tell whether it is stored (below a producer's default request timeout, 30 s); past it, it
is answered with the retriable error, the outcome still unknown."""
READ_BACK_EVERY_S = 0.2
"""How often that read is tried again while the database is away."""


class AppendPath:
    """Appends batches to partition stores, with fault handling, wake-ups and fsync policy."""

    def __init__(self, flusher: FlushScheduler) -> None:
        self.waiters = flusher.waiters
        self.flusher = flusher
        self.faults = flusher.faults
        self._last: dict[TopicPartition, asyncio.Future[None]] = {}
        """Per partition, the commit of its latest append, while it is under way."""
        self._reading: set[asyncio.Future[bool]] = set()
        """The read-backs under way of batches whose commit's outcome is unknown."""

    def append(self, key: TopicPartition, partition: PartitionStore, batch: Buffer,
               header: BatchHeader, kind: WriteKind,
               code: ErrorCode = ErrorCode.KAFKA_STORAGE_ERROR, what: str | None = None,
               generation: int | None = None,
               flush: TopicFlush | None = None) -> tuple[int, asyncio.Future[None] | None]:
        """Append ``batch`` (whose header was read once, as ``header``) to ``partition`` of
        topic-partition ``key``; return its base offset and what to await before
        acknowledging it (None: nothing yet). A failed write raises KafkaApiError ``code``
        and is logged as a fault of ``kind`` writing ``what`` (default: the
        topic-partition). ``generation``: the partition's commit generation the batch was
        judged at (``commit_generation``); a group-committed partition whose generation
        has moved on since refuses it, with ``code`` (the failure that moved it is the
        cause, logged already). ``flush``: the topic's own fsync policy (None: the
        broker's)."""
        try:  # not faults.guard: this is the produce hot path
            if group_committed(partition):
                base, commit = partition.append_deferred(batch, header, generation)
                asked = (partition, base, batch) if kind == WriteKind.RECORDS else None
                return base, self._committed(key, commit, kind, code, what, asked)
            base = partition.append(batch, header)
        except AppendAbandoned as exc:
            raise KafkaApiError(code, str(exc)) from None
        except OSError as exc:
            raise self.faults.failed(exc, what or f"{key[0]}-{key[1]}", kind, code) from None
        except NotOwner as exc:  # another broker took the partition: the write is fenced
            raise KafkaApiError(ErrorCode.NOT_LEADER_OR_FOLLOWER
                                if code == ErrorCode.KAFKA_STORAGE_ERROR else code,
                                str(exc)) from None
        self.faults.succeeded(kind)
        durable = self.flusher.appended(partition, key, base, header.record_count, len(batch),
                                        flush)
        if durable is None:  # visible now; else once fsynced, and woken then (durability)
            self.waiters.notify(key)
        return base, durable

    def _committed(self, key: TopicPartition, commit: asyncio.Future[None], kind: WriteKind,
                   code: ErrorCode, what: str | None,
                   asked: tuple[GroupCommitted, int, Buffer] | None = None
                   ) -> asyncio.Future[None]:
        """What the caller awaits: done after ``commit``, with wake-ups and fault notes.
        ``asked``: the partition, base offset and batch to read back when the commit's
        outcome is unknown (None: answered with the error at once)."""
        acknowledged: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # nobody awaits an acks=0 produce: its failure must not log "never retrieved"
        acknowledged.add_done_callback(_retrieve)

        def settle(done: asyncio.Future[None]) -> None:
            self._forget(key, done)
            error = (OSError(errno.ECANCELED, "the commit was cancelled") if done.cancelled()
                     else done.exception())
            if error is None:
                self.faults.succeeded(kind)
                self.waiters.notify(key)
                outcome: OSError | None = None
            elif isinstance(error, AppendFenced):  # not a fault: the partition moved
                outcome = error
            else:
                reason = error if isinstance(error, OSError) else OSError(str(error))
                if not isinstance(error, AppendAbandoned):  # its cause is logged already
                    self.faults.failed(reason, what or f"{key[0]}-{key[1]}", kind, code)
                reported = UnknownOutcome if isinstance(error, CommitUnknown) else ReportedFault
                outcome = reported(reason.errno, reason.strerror or str(reason))
            if isinstance(outcome, UnknownOutcome) and asked is not None:
                unknown = outcome
                self._read_back(asked, lambda stored: answer(None if stored else unknown,
                                                             stored=True))
                return
            answer(outcome)

        def answer(outcome: OSError | None, stored: bool = False) -> None:
            if outcome is None and stored:  # read back: it is stored after all
                self.waiters.notify(key)
            _resolve(acknowledged, outcome)

        commit.add_done_callback(settle)
        self._last[key] = commit  # until settled
        return acknowledged

    def _forget(self, key: TopicPartition, done: asyncio.Future[None]) -> None:
        if self._last.get(key) is done:
            del self._last[key]

    def _read_back(self, asked: tuple[GroupCommitted, int, Buffer],
                   then: Callable[[bool], None]) -> None:
        """Ask (``_stored``) whether the batch of ``asked`` is stored at its offset; call
        ``then`` with the answer (False: not there, or it cannot be told)."""
        task = asyncio.ensure_future(_stored(*asked))
        self._reading.add(task)  # held: the loop keeps only a weak reference
        task.add_done_callback(self._reading.discard)
        task.add_done_callback(lambda done: then(
            not done.cancelled() and done.exception() is None and done.result()))

    def repeated(self, key: TopicPartition, partition: PartitionStore, base: int,
                 batch: Buffer) -> asyncio.Future[None] | None:
        """What to await before acknowledging ``batch``, a retry of a batch already
        appended at ``base``, so it is never acknowledged before the batch it repeats is
        durable: the partition's commits under way (``settled``; should one of them fail,
        the retry is answered by what is stored, as a batch whose commit's answer was lost
        is), or on files its fsync under way or requested (a flush policy that fsyncs
        before acknowledging). None: nothing pending."""
        if group_committed(partition):
            return self.settled(key, (partition, base, batch))
        return self.flusher.pending(partition)

    def settled(self, key: TopicPartition,
                asked: tuple[GroupCommitted, int, Buffer] | None = None,
                ) -> asyncio.Future[None] | None:
        """What to await before acknowledging a retry of a batch already appended: the
        partition's commits under way (a partition's commits complete in order), so a retry
        is never acknowledged before the batch it repeats is stored. ``asked``: the batch
        to read back should the latest commit fail (it may be stored by an earlier one, or
        by that one if its answer was lost; None: the failure is the answer). None: nothing
        pending. A future of its own (the caller may cancel it without touching the
        others')."""
        last = self._last.get(key)
        if last is None:
            return None
        follower: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        follower.add_done_callback(_retrieve)

        def follow(done: asyncio.Future[None]) -> None:
            if follower.done():
                return
            error = (OSError(errno.ECANCELED, "the commit was cancelled") if done.cancelled()
                     else done.exception())
            if error is None or isinstance(error, AppendFenced):
                _resolve(follower, error)
                return
            # logged once by the original's settle: answered, not logged again
            fault = ReportedFault(errno.EIO, str(error))
            if asked is None:
                _resolve(follower, fault)
            else:
                self._read_back(asked, lambda stored: _resolve(follower, None if stored else fault))

        last.add_done_callback(follow)
        return follower


def _resolve(future: asyncio.Future[None], error: BaseException | None) -> None:
    """Answer ``future`` with ``error`` (None: done), unless its request was cancelled
    (the connection closed) and it is done already."""
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


async def _stored(partition: GroupCommitted, base: int, batch: Buffer) -> bool:
    """Whether ``batch`` is stored at ``base`` (its commit's answer was lost), asked in a
    worker thread, again while the database is away, for up to ``READ_BACK_S``; False when
    it cannot be told."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + READ_BACK_S
    while True:
        try:
            return await loop.run_in_executor(None, partition.holds, base, batch)
        except (OSError, StorageError):
            if loop.time() >= deadline:
                return False
        await asyncio.sleep(READ_BACK_EVERY_S)
