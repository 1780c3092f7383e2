"""The transaction coordinator, after Kafka's: transactional ids map to a producer id and an
epoch; a transaction collects partitions and groups, and its end writes a marker into
every partition and settles the groups' pending offsets.

Every state change is a record of ``__transaction_state`` written before it is acted on,
and the state in memory changes only once that record is durable (a failed write changes
nothing, so the client's retry writes again; one whose outcome is unknown has the
partition's state replayed from the log, :mod:`broker_core.system_topics`): a transaction
caught in
PrepareCommit/PrepareAbort by a crash is completed at start, and one still Ongoing is
aborted once its timeout passes. While an id's record is being written, other requests for
it get CONCURRENT_TRANSACTIONS (Kafka's pending state), and they retry.

The periodic duty (timeouts, completions to try again, expired ids) only starts each id's
work, as a task of its own, and never waits for it: a completion that cannot finish (a
marker whose partition's owner cannot write it, queued in a cluster until it can) holds
that id alone, as Kafka's timeout scan never waits for the markers it sends.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from functools import partial

from broker_core.errors import MARKER_FENCED, ErrorCode, KafkaApiError
from broker_core.groups.config import TRANSACTIONAL_ID_EXPIRATION_MS
from broker_core.groups.coordinator import GroupCoordinator
from broker_core.storage.cluster import MarkerRequest
from broker_core.storage_faults import WriteKind
from broker_core.system_topics import StateCoordinator, SystemTopic
from broker_core.transactions.model import (
    ENDING,
    Txn,
    TxnState,
    decode_key,
    state_key,
    tombstone,
)
from broker_core.transactions.producer_ids import ProducerIdAllocator
from common.log_fields import topic_fields

log = logging.getLogger(__name__)
MarkerWriter = Callable[[MarkerRequest], "asyncio.Future[None] | None"]
TxnKey = tuple[str, str]
"""How the coordinator keys a transactional id: its state topic and its scoped id."""
_MAX_EPOCH = 32767


@dataclass(frozen=True, slots=True)
class TxnConfig:
    """Settings of the transaction coordinator."""

    enabled: bool = True
    max_timeout_ms: int = 900_000
    id_expiration_ms: int = TRANSACTIONAL_ID_EXPIRATION_MS
    abort_check_interval_ms: int = 10_000


def _now_ms() -> int:
    return int(time.time() * 1000)


def check_batch(txn: Txn, epoch: int, topic: str, index: int) -> None:
    """Refuse a batch of ``epoch`` into partition ``index`` of ``topic`` unless the
    transaction of ``txn`` (the producer id's own) is open at that epoch and added the
    partition (CONCURRENT_TRANSACTIONS while it is ending)."""
    if epoch != txn.epoch:
        raise KafkaApiError(ErrorCode.INVALID_PRODUCER_EPOCH,
                            f"producer {txn.producer_id} epoch {epoch} is not {txn.epoch}")
    if txn.state in ENDING:
        raise KafkaApiError(ErrorCode.CONCURRENT_TRANSACTIONS,
                            f"the transaction of producer {txn.producer_id} is completing")
    if txn.state != TxnState.ONGOING or (topic, index) not in txn.partitions:
        raise KafkaApiError(ErrorCode.INVALID_TXN_STATE,
                            f"partition {topic}-{index} is not part of the open "
                            f"transaction of producer {txn.producer_id}")


class TransactionCoordinator(StateCoordinator):
    """Every transactional id of this broker, keyed by (state topic, transactional id)."""

    def __init__(self, config: TxnConfig, store: SystemTopic, ids: ProducerIdAllocator,
                 write_marker: MarkerWriter, groups: GroupCoordinator) -> None:
        super().__init__(store, config.abort_check_interval_ms)
        self.config = config
        self.ids = ids
        self.write_marker = write_marker
        self.groups = groups
        self.end_group_txn: Callable[[MarkerRequest], Awaitable[None]] = groups.end_txn
        """Ends a transaction's pending offsets of a group (through the group's
        coordinator when that is another broker: the engine sets it)."""
        self.txns: dict[tuple[str, str], Txn] = {}
        self.by_producer: dict[int, Txn] = {}
        self._pending: dict[tuple[str, str], Txn | None] = {}
        """The state of each id whose record is being written (what it becomes once the
        write is durable, None for a tombstone; a compaction meanwhile keeps that)."""
        self._unloads: dict[tuple[str, int], int] = {}
        """How often each partition was handed to another broker (a write that settles
        after that changes nothing here)."""
        self._finishing: set[tuple[str, str]] = set()
        """The ids whose markers are being written (:meth:`_finish`)."""
        self._duties: dict[TxnKey, asyncio.Task[None]] = {}
        """The work started in the background for an id (a completion, a timeout's abort,
        an expiry): one at a time per id."""
        self._failing: set[TxnKey] = set()
        """The ids whose last background work failed (logged once until one succeeds)."""
        self._stopping = False

    # -- life cycle ----------------------------------------------------------------------

    def replay(self, topic: str, partition: int, key: bytes, value: bytes | None) -> None:
        """Apply one record of ``__transaction_state``."""
        transactional_id = decode_key(key)
        if transactional_id is None:
            return
        old = self.txns.pop((topic, transactional_id), None)
        if old is not None:
            self.by_producer.pop(old.producer_id, None)
        if value is not None:
            txn = Txn.from_record(transactional_id, topic, partition, json.loads(value))
            self.txns[(topic, transactional_id)] = txn
            self.by_producer[txn.producer_id] = txn

    async def stop(self) -> None:
        """Stop background work, the periodic duty first, then the work it (or a replay)
        started, completions under way included (the next owner of their partition
        completes them)."""
        self._stopping = True
        await super().stop()
        tasks = list(self._duties.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def partition_loaded(self, topic: str, partition: int) -> None:
        """Complete the transactions that the last owner of this partition (a crash, or a
        broker that handed it over) left in PrepareCommit or PrepareAbort."""
        ending = [t for t in self.txns.values()
                  if (t.topic, t.partition) == (topic, partition) and t.state in ENDING]
        for txn in ending:
            log.info("completing transaction %s (%s) left by the previous coordinator",
                     txn.transactional_id, txn.state.value)
            self._start((txn.topic, txn.transactional_id), txn,
                        self._finish(txn, txn.state == TxnState.PREPARE_COMMIT))

    def _start(self, key: TxnKey, txn: Txn, work: Coroutine[None, None, None]
               ) -> asyncio.Task[None] | None:
        """Run ``work`` for ``txn`` in the background, unless work of the id is under way
        or the coordinator stops (then it is closed, never run)."""
        if self._stopping or key in self._duties:
            work.close()
            return None
        task = asyncio.get_running_loop().create_task(work)
        self._duties[key] = task
        task.add_done_callback(partial(self._done, key, txn))
        return task

    def _done(self, key: TxnKey, txn: Txn, task: asyncio.Task[None]) -> None:
        """A background work of ``txn`` ended: a failure is logged (once per id until its
        work succeeds again; the periodic duty tries again)."""
        if self._duties.get(key) is task:
            del self._duties[key]
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            self._failing.discard(key)
            return
        if key in self._failing:
            return
        self._failing.add(key)
        if not isinstance(error, KafkaApiError):
            log.error("transactional id %s: its background work failed (tried again; "
                      "logged once until it succeeds)", txn.transactional_id,
                      exc_info=error, extra=topic_fields(txn.topic))
        else:
            log.warning("transactional id %s (%s): its background work failed (tried "
                        "again; logged once until it succeeds): %s", txn.transactional_id,
                        txn.state.value, error.message, extra=topic_fields(txn.topic))

    def partition_unloaded(self, topic: str, partition: int) -> None:
        """Another broker coordinates this partition's transactional ids now, or this one
        replays them again: forget them (a write of one forgotten is refused)."""
        self._unloads[(topic, partition)] = self._unloads.get((topic, partition), 0) + 1
        gone = [key for key, txn in self.txns.items()
                if (txn.topic, txn.partition) == (topic, partition)]
        for key in gone:
            txn = self.txns.pop(key)
            if self.by_producer.get(txn.producer_id) is txn:
                del self.by_producer[txn.producer_id]
            duty = self._duties.pop(key, None)
            if duty is not None:  # its writes would be refused: the next owner's to do
                duty.cancel()
            self._failing.discard(key)

    async def periodic(self, now: int) -> None:
        """Abort timed-out transactions; forget expired transactional ids."""
        self.expire(now)

    # -- placement and checks ------------------------------------------------------------

    def check(self, topic: str, transactional_id: str) -> ErrorCode:
        """Whether the transactional id can be served now (NOT_COORDINATOR while its
        partition is offline after a failed fsync: memory may hold what the log lost)."""
        if not self.config.enabled:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if not transactional_id:
            return ErrorCode.INVALID_REQUEST
        return self.serving_error(topic, transactional_id)

    def _owned(self, topic: str, transactional_id: str, producer_id: int,
               epoch: int) -> Txn:
        """The transaction, if this producer id and epoch may act on it and it is not
        being completed."""
        txn = self._current(topic, transactional_id, producer_id, epoch)
        if txn.state in ENDING:
            raise KafkaApiError(ErrorCode.CONCURRENT_TRANSACTIONS,
                                f"transaction of {transactional_id!r} is completing")
        return txn

    def _current(self, topic: str, transactional_id: str, producer_id: int,
                   epoch: int) -> Txn:
        """The transaction, if this producer id and epoch are its current ones: an epoch
        other than the current one, older or newer, is PRODUCER_FENCED, as Kafka's
        coordinator answers AddPartitionsToTxn, AddOffsetsToTxn and a client's EndTxn
        (before transaction version 2, which this broker does not offer)."""
        txn = self.txns.get((topic, transactional_id))
        if txn is None or txn.producer_id != producer_id:
            raise KafkaApiError(ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                                f"producer id {producer_id} does not belong to "
                                f"transactional id {transactional_id!r}")
        if epoch != txn.epoch:
            raise KafkaApiError(ErrorCode.PRODUCER_FENCED,
                                f"epoch {epoch} of {transactional_id!r} is not the current "
                                f"one ({txn.epoch})")
        return txn

    async def _write(self, txn: Txn | None, target: Txn) -> None:
        """Write ``target``, the next state of ``txn`` (None for a new id), and once the
        write is durable make it the state in memory. While it is written other requests
        for the id get CONCURRENT_TRANSACTIONS; a write or fsync that fails (a full disk,
        a failed commit) changes nothing and raises NOT_COORDINATOR (a commit whose outcome
        is unknown has the partition replayed), as does a partition that another broker
        took, or this one forgot, meanwhile."""
        key = (target.topic, target.transactional_id)
        if self.txns.get(key) is not txn:  # forgotten (its partition moved or is replayed
            # again) since the caller found it: what it writes would not be what it knew
            raise KafkaApiError(ErrorCode.NOT_COORDINATOR,
                                f"{target.transactional_id!r} is no longer held here")
        if key in self._pending:
            raise KafkaApiError(ErrorCode.CONCURRENT_TRANSACTIONS,
                                f"a state change of {target.transactional_id!r} is being "
                                f"written")
        target.update_ms = _now_ms()
        unloads = self._unloads.get((target.topic, target.partition), 0)
        self._pending[key] = target
        try:
            durable = self.store.append(target.topic, target.partition, [target.to_record()])
            if self.store.needs_compaction(target.topic, target.partition):
                self.store.compact(target.topic, target.partition,
                                   self._live(target.topic, target.partition))
            await self.store.settle(durable)
        finally:
            if self._pending.get(key) is target:
                del self._pending[key]
        if self.txns.get(key) is not txn or \
                self._unloads.get((target.topic, target.partition), 0) != unloads:
            raise KafkaApiError(ErrorCode.NOT_COORDINATOR,
                                f"{target.transactional_id!r} moved to another coordinator")
        if txn is None:
            txn = self.txns[key] = target
        else:
            if self.by_producer.get(txn.producer_id) is txn:
                del self.by_producer[txn.producer_id]
            vars(txn).update(vars(target))
        self.by_producer[txn.producer_id] = txn

    def _live(self, topic: str, partition: int) -> list[tuple[bytes, bytes]]:
        """The records of every id of the partition, those being written as they will be
        (what a compaction keeps)."""
        live: dict[tuple[str, str], Txn | None] = {
            key: txn for key, txn in self.txns.items()
            if (txn.topic, txn.partition) == (topic, partition)}
        live.update((key, txn) for key, txn in self._pending.items()
                    if key in live or (txn is not None
                                       and (txn.topic, txn.partition) == (topic, partition)))
        return [txn.to_record() for txn in live.values() if txn is not None]

    def _allocate(self) -> int:
        """A new producer id (NOT_COORDINATOR when its block cannot be written)."""
        with self.store.faults.guard("the producer id block", WriteKind.COORDINATOR,
                                     ErrorCode.NOT_COORDINATOR):
            return self.ids.allocate()

    # -- InitProducerId ------------------------------------------------------------------

    async def init_producer_id(self, topic: str, transactional_id: str | None, timeout_ms: int,
                               producer_id: int, epoch: int) -> tuple[int, int]:
        """A producer id and epoch for an idempotent or transactional producer."""
        if transactional_id is None:
            return self._allocate(), 0
        if not 0 < timeout_ms <= self.config.max_timeout_ms:
            raise KafkaApiError(ErrorCode.INVALID_TRANSACTION_TIMEOUT,
                                f"transaction timeout {timeout_ms} ms is outside 1.."
                                f"{self.config.max_timeout_ms}")
        txn = self.txns.get((topic, transactional_id))
        if txn is None:
            new = Txn(transactional_id, topic, self.place(topic, transactional_id),
                      self._allocate(), 0, timeout_ms)
            await self._write(None, new)
            log.info("transactional id %s has producer id %d", transactional_id,
                     new.producer_id)
            return new.producer_id, new.epoch
        if txn.state in ENDING:
            raise KafkaApiError(ErrorCode.CONCURRENT_TRANSACTIONS,
                                f"transaction of {transactional_id!r} is completing")
        asked = (producer_id, epoch)
        if producer_id >= 0 and asked == (txn.last_producer_id, txn.last_epoch) and \
                txn.state != TxnState.ONGOING:
            # the retry of the last bump, whose answer was lost (KIP-360): its result (once
            # a transaction is open the answer was not lost: a stale duplicate is fenced)
            return txn.producer_id, txn.epoch
        if producer_id >= 0 and asked != (txn.producer_id, txn.epoch):
            raise KafkaApiError(ErrorCode.PRODUCER_FENCED,
                                f"producer {producer_id} epoch {epoch} is not the current one "
                                f"of {transactional_id!r}")
        if txn.state == TxnState.ONGOING:
            log.info("aborting the open transaction of %s for a new producer session",
                     transactional_id)
            await self._end(txn, commit=False, fence=True)
        target = self._bumped(txn)
        target.timeout_ms = timeout_ms
        target.state = TxnState.EMPTY
        # a new session (no producer id given) leaves nothing to retry: a zombie of the
        # last one is fenced, as Kafka's
        target.last_producer_id, target.last_epoch = asked if producer_id >= 0 else (-1, -1)
        await self._write(txn, target)
        return txn.producer_id, txn.epoch

    def _bumped(self, txn: Txn) -> Txn:
        """A copy of ``txn`` for a new producer session: the epoch raised, or a new producer
        id at epoch 0 once the epoch is exhausted (from 32766 on, as Kafka rotates it)."""
        target = txn.copy()
        if txn.epoch + 1 >= _MAX_EPOCH:
            target.producer_id, target.epoch = self._allocate(), 0
        else:
            target.epoch += 1
        return target

    @staticmethod
    def _fenced(txn: Txn) -> Txn:
        """A copy of ``txn`` whose epoch is raised to fence its producer before its open
        transaction is aborted (a timeout, a new session): the same producer id, at most
        epoch 32767, since the abort markers that follow must end the transaction of that
        producer id (Kafka's prepareFenceProducerEpoch; only the next session's bump
        rotates the id)."""
        target = txn.copy()
        target.epoch = min(txn.epoch + 1, _MAX_EPOCH)
        return target

    # -- a transaction's content ---------------------------------------------------------

    @staticmethod
    def _begun(txn: Txn) -> Txn:
        """A copy of ``txn`` with its transaction open (a new one unless it is)."""
        target = txn.copy()
        if target.state != TxnState.ONGOING:
            target.state = TxnState.ONGOING
            target.start_ms = _now_ms()
            target.partitions.clear()
            target.groups.clear()
        return target

    async def add_partitions(self, topic: str, transactional_id: str, producer_id: int,
                             epoch: int, partitions: Iterable[tuple[str, int]]) -> None:
        """Add partitions to the producer's transaction (starting it when needed)."""
        txn = self._owned(topic, transactional_id, producer_id, epoch)
        wanted = set(partitions)
        if txn.state == TxnState.ONGOING and wanted <= txn.partitions:
            return
        target = self._begun(txn)
        target.partitions |= wanted
        await self._write(txn, target)

    async def add_group(self, topic: str, transactional_id: str, producer_id: int,
                        epoch: int, group: tuple[str, str]) -> None:
        """Add a group whose offsets the transaction will commit."""
        txn = self._owned(topic, transactional_id, producer_id, epoch)
        if txn.state == TxnState.ONGOING and group in txn.groups:
            return
        target = self._begun(txn)
        target.groups.add(group)
        await self._write(txn, target)

    def check_offsets(self, topic: str, transactional_id: str, producer_id: int, epoch: int,
                      group: tuple[str, str]) -> None:
        """TxnOffsetCommit is allowed: the transaction is open and has added the group. An
        epoch other than the current one is INVALID_PRODUCER_EPOCH, as Kafka answers a
        transactional write (its verification's PRODUCER_FENCED is turned into that, as for
        a produced batch: :func:`check_batch`)."""
        try:
            txn = self._owned(topic, transactional_id, producer_id, epoch)
        except KafkaApiError as error:
            if error.code != ErrorCode.PRODUCER_FENCED:
                raise
            raise KafkaApiError(ErrorCode.INVALID_PRODUCER_EPOCH, error.message) from None
        if txn.state != TxnState.ONGOING or group not in txn.groups:
            raise KafkaApiError(ErrorCode.INVALID_TXN_STATE,
                                f"transaction of {transactional_id!r} has not added group "
                                f"{group[1]!r} (AddOffsetsToTxn first)")

    def verify_produce(self, producer_id: int, epoch: int, key: TxnKey | None, topic: str,
                       index: int) -> None:
        """A transactional batch may only go to a partition its open transaction added, and
        only under its own transactional id (``key``: the state topic and scoped id of the
        one the request named; None: not checked, the broker's own writes), as this
        broker's state in memory says, once it holds the id's state: while this broker
        replays the id's partition (or does not coordinate it, or its log is offline), what
        :meth:`serving_error` answers, never a judgement on a state half replayed."""
        if key is not None and self.config.enabled and not self.holds(*key):
            code = self.serving_error(*key)  # replays an empty partition at once
            if code != ErrorCode.NONE:
                raise KafkaApiError(code, "the transaction coordinator cannot tell now")
        txn = self.by_producer.get(producer_id)
        if txn is None:
            raise KafkaApiError(ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                                f"producer id {producer_id} has no transactional id")
        if key is not None and (txn.topic, txn.transactional_id) != key:
            raise KafkaApiError(ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                                f"producer id {producer_id} is not that of the "
                                "transactional id the request names")
        check_batch(txn, epoch, topic, index)

    def stored(self, key: TxnKey, partition: int) -> Txn | None:
        """The state of a transactional id as its coordinator last made it durable (another
        broker, in a cluster), read from ``partition`` of its state topic (its
        :meth:`place`); None when it has none. Blocking: a worker thread."""
        topic, transactional_id = key
        record = self.store.newest(topic, partition, state_key(transactional_id))
        if record is None or record[1] is None:
            return None
        return Txn.from_record(transactional_id, topic, partition, json.loads(record[1]))

    # -- the end of a transaction --------------------------------------------------------

    async def end_txn(self, topic: str, transactional_id: str, producer_id: int, epoch: int,
                      commit: bool) -> None:
        """EndTxn: commit or abort the open transaction. As Kafka's: while a state change
        of the id is being written, or the same end is being completed (a retry),
        CONCURRENT_TRANSACTIONS; once it is complete, NONE; an end other than the one
        under way or done, or no open transaction, INVALID_TXN_STATE."""
        txn = self._current(topic, transactional_id, producer_id, epoch)
        if (topic, transactional_id) in self._pending:
            raise KafkaApiError(ErrorCode.CONCURRENT_TRANSACTIONS,
                                f"a state change of {transactional_id!r} is being written")
        done = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        if txn.state == done:
            return  # a retry of an end that already happened
        if txn.state == (TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT):
            raise KafkaApiError(ErrorCode.CONCURRENT_TRANSACTIONS,
                                f"transaction of {transactional_id!r} is completing")
        if txn.state != TxnState.ONGOING:
            raise KafkaApiError(ErrorCode.INVALID_TXN_STATE,
                                f"transactional id {transactional_id!r} has no open "
                                f"transaction to {'commit' if commit else 'abort'} "
                                f"(state {txn.state.value})")
        await self._end(txn, commit, fence=False)

    async def _end(self, txn: Txn, commit: bool, fence: bool) -> None:
        target = self._fenced(txn) if fence else txn.copy()
        target.state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        await self._write(txn, target)
        await self._finish(txn, commit)

    async def _finish(self, txn: Txn, commit: bool) -> None:
        """Write the markers, settle group offsets, and mark the transaction complete. If a
        write fails (a full disk) the transaction stays prepared, and the periodic duty
        tries again (markers written twice are harmless: the second one ends nothing)."""
        key = (txn.topic, txn.transactional_id)
        if key in self._finishing:
            return
        self._finishing.add(key)
        try:
            await self._complete(txn, commit)
        finally:
            self._finishing.discard(key)

    async def _complete(self, txn: Txn, commit: bool) -> None:
        """Write the markers and end the groups' offsets at the coordinator epoch this
        broker loaded the id's partition at, if it still holds the id as ``txn`` (else
        NOT_COORDINATOR: the next coordinator completes it); a partition or group that a
        later coordinator epoch reached refuses them."""
        coordinator_epoch = self.claim_epoch(txn.topic, txn.partition)
        if coordinator_epoch is None or \
                self.txns.get((txn.topic, txn.transactional_id)) is not txn:
            raise KafkaApiError(ErrorCode.NOT_COORDINATOR,
                                f"{txn.transactional_id!r} is no longer held here")
        try:
            waits = [self.write_marker(MarkerRequest(t, p, txn.producer_id, txn.epoch,
                                                     commit,
                                                     coordinator_epoch=coordinator_epoch))
                     for t, p in sorted(txn.partitions)]
            for offsets_topic, group_id in sorted(txn.groups):
                await self.end_group_txn(MarkerRequest(offsets_topic, -1, txn.producer_id,
                                                       txn.epoch, commit, group_id,
                                                       coordinator_epoch))
        except KafkaApiError as error:
            if error.code not in MARKER_FENCED:
                raise
            raise KafkaApiError(ErrorCode.NOT_COORDINATOR,  # a later coordinator's to end
                                f"{txn.transactional_id!r}: {error.message}") from None
        try:
            await asyncio.gather(*(w for w in waits if w is not None))
        except OSError as exc:
            raise self.store.faults.failed(exc, "transaction markers (fsync)",
                                           WriteKind.CHECKPOINTS,
                                           ErrorCode.NOT_COORDINATOR) from None
        target = txn.copy()
        target.state = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        target.partitions.clear()
        target.groups.clear()
        target.start_ms = -1
        await self._write(txn, target)
        log.info("%s transaction of %s (producer %d epoch %d) over %d partitions",
                 "committed" if commit else "aborted", txn.transactional_id, txn.producer_id,
                 txn.epoch, len(waits))

    # -- timeouts and expiry -------------------------------------------------------------

    def expire(self, now: int) -> list[asyncio.Task[None]]:
        """Start, each in a task of its own, the abort of every transaction past its
        timeout, the completion of every one whose completion failed, and the expiry of
        every id idle past the expiration; the tasks started (never awaited here: one that
        cannot finish holds no other id)."""
        started: list[asyncio.Task[None]] = []
        for key, txn in list(self.txns.items()):
            if key not in self._duties and self._duty(key, txn, now) is not None:
                task = self._start(key, txn, self._do_duty(key, txn, now))
                if task is not None:
                    started.append(task)
        return started

    def _duty(self, key: TxnKey, txn: Txn, now: int
              ) -> Callable[[], Awaitable[None]] | None:
        """What the periodic duty has to do for ``txn`` at ``now``, or None: nothing, or
        not now (its partition still being replayed, when its state may be an intermediate
        one; a state change of it being written; its markers being written; forgotten)."""
        if (txn.topic, txn.partition) not in self._loaded or key in self._pending or \
                key in self._finishing or self.txns.get(key) is not txn:
            return None
        if txn.state in ENDING:  # its completion failed (a full disk): try again
            return partial(self._finish, txn, txn.state == TxnState.PREPARE_COMMIT)
        if txn.state == TxnState.ONGOING:
            return partial(self._time_out, txn) if now - txn.start_ms > txn.timeout_ms \
                else None
        if now - txn.update_ms > self.config.id_expiration_ms:
            return partial(self._forget, key, txn)
        return None

    async def _do_duty(self, key: TxnKey, txn: Txn, now: int) -> None:
        """Do the periodic duty's work of ``txn``, if it is still due now that the task
        runs (a request may have changed the id meanwhile)."""
        work = self._duty(key, txn, now)
        if work is not None:
            await work()

    async def _time_out(self, txn: Txn) -> None:
        log.info("transaction of %s timed out after %d ms; aborting",
                 txn.transactional_id, txn.timeout_ms, extra=topic_fields(txn.topic))
        await self._end(txn, commit=False, fence=True)

    async def _forget(self, key: tuple[str, str], txn: Txn) -> None:
        """Write the tombstone of an expired id and, once it is durable, forget the id
        (no other change of it is written meanwhile)."""
        self._pending[key] = None
        try:
            await self.store.settle(self.store.append(txn.topic, txn.partition,
                                                      [tombstone(txn.transactional_id)]))
        finally:
            if key in self._pending and self._pending[key] is None:
                del self._pending[key]
        if self.txns.get(key) is txn:
            del self.txns[key]
            if self.by_producer.get(txn.producer_id) is txn:
                del self.by_producer[txn.producer_id]
        log.info("transactional id %s expired", txn.transactional_id)

    # -- administration ------------------------------------------------------------------

    def find(self, topic: str, transactional_id: str) -> Txn | None:
        """The transaction state of an id."""
        return self.txns.get((topic, transactional_id))

    def of_topic(self, topic: str) -> list[Txn]:
        """All transactional ids kept in a state topic, but those of an offline partition."""
        return [t for (kept, _), t in self.txns.items() if kept == topic
                and not self.store.offline(kept, t.partition)]
