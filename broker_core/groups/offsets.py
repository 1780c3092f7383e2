"""Committed offsets of groups (Kafka's ``GroupMetadataManager`` part): OffsetCommit,
TxnOffsetCommit and the settling of a transaction's offsets, OffsetFetch, OffsetDelete and
the expiry of old offsets, and every write to ``__consumer_offsets`` (with the compaction
it triggers).

Whether a member may commit is the membership's business
(:mod:`broker_core.groups.membership`); what is stored, and when it counts, is decided
here: an offset counts (or is gone) once its write settled, and a failed write changes
nothing (one whose outcome is unknown, which may be stored, has the partition's groups
replayed from the log: :mod:`broker_core.system_topics`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from broker_core import naming
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.groups import offsets_topic
from broker_core.groups.model import CONSUMER_PROTOCOL, CommittedOffset, Group, GroupState
from broker_core.system_topic_index import Record
from broker_core.system_topics import SystemTopic

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class OffsetToCommit:
    """One partition's offset in an OffsetCommit request."""

    topic: str
    partition: int
    offset: int
    leader_epoch: int
    metadata: str | None
    retention_ms: int | None = None
    """The request's own retention (OffsetCommit v2-v4's ``retention_time_ms`` other than
    -1): the offset expires that long after its commit (Kafka's ``expire_timestamp``);
    None: by the broker's ``offsetsRetentionMinutes`` rules."""


class GroupOffsets:
    """The offsets of the groups a coordinator holds, and the writes to their log."""

    def __init__(self, store: SystemTopic, offset_metadata_max_size: int,
                 retention_ms: int, groups_in: Callable[[str, int], Iterable[Group]]) -> None:
        self.store = store
        self.offset_metadata_max_size = offset_metadata_max_size
        self.retention_ms = retention_ms
        self._groups_in = groups_in
        """The groups kept in one partition of the log (what a compaction keeps)."""
        self._settling: dict[tuple[str, int], list[Sequence[Record]]] = {}
        """Offset records appended but not yet settled, per log partition: kept in memory
        only once their write settles, rewritten by a compaction meanwhile."""

    # -- the log -------------------------------------------------------------------------

    def append_group(self, group: Group) -> asyncio.Future[None] | None:
        """Append the group's record as it is now (as :meth:`append`); from now on it is
        the group record a compaction keeps."""
        key, value = offsets_topic.group_record(group)
        assert value is not None
        return self.append(group, [(key, value)], (key, value))

    def append(self, group: Group, batch: Sequence[Record],
               group_record: tuple[bytes, bytes] | None = None
               ) -> asyncio.Future[None] | None:
        """Append ``batch`` (with the group's ``group_record``, if any) to the group's log
        partition, compacting it when due; return what to await for durability
        (KafkaApiError NOT_COORDINATOR when the write fails, say on a full disk: the caller
        changes its state only after this)."""
        durable = self.store.append(group.topic, group.partition, batch)
        if group_record is not None:
            group.record = group_record
        if self.store.needs_compaction(group.topic, group.partition):
            live = offsets_topic.snapshot(
                self._groups_in(group.topic, group.partition),
                self._settling.get((group.topic, group.partition), ()))
            self.store.compact(group.topic, group.partition, live)
        return durable

    async def write(self, group: Group, batch: Sequence[Record]) -> None:
        """Append ``batch`` and wait until it is durable; the caller changes its state only
        after this (a compaction meanwhile keeps the batch). KafkaApiError when the write
        or its commit fails, and NOT_COORDINATOR when another broker took the partition
        meanwhile (its offsets are what the log holds, the caller's state is forgotten)."""
        key = (group.topic, group.partition)
        settling = self._settling.setdefault(key, [])
        settling.append(batch)
        try:
            await self.store.settle(self.append(group, batch))
        finally:
            moved = self._settling.get(key) is not settling
            if not moved:
                settling.remove(batch)
                if not settling:
                    del self._settling[key]
        if moved:
            raise KafkaApiError(ErrorCode.NOT_COORDINATOR,
                                f"group {group.group_id!r} moved to another coordinator")

    def partition_unloaded(self, topic: str, partition: int) -> None:
        """Forget the writes in flight of a partition another broker took."""
        self._settling.pop((topic, partition), None)

    # -- commits -------------------------------------------------------------------------

    async def commit(self, group: Group, offsets: Sequence[OffsetToCommit],
                     now: int) -> dict[TopicPartition, ErrorCode]:
        """OffsetCommit (the membership allowed it): an error per partition. What is kept
        once the write settles is ``group.unsettled``'s entry, less what a tombstone
        appended after it removed (:meth:`delete`)."""
        results, accepted = self._accept(group, offsets, now)
        batch = [offsets_topic.offset_record(group.group_id, t, p, c)
                 for (t, p), c in accepted.items()]
        unsettled = dict(accepted)
        group.unsettled.append(unsettled)

        def keep(_: dict[TopicPartition, CommittedOffset]) -> None:
            for tp, committed in unsettled.items():
                group.install(tp, committed)

        try:
            return await self._store_offsets(group, batch, results, accepted, keep)
        finally:
            group.unsettled = [u for u in group.unsettled if u is not unsettled]

    async def txn_commit(self, group: Group, producer_id: int,
                         offsets: Sequence[OffsetToCommit], now: int,
                         producer_epoch: int = -1) -> dict[TopicPartition, ErrorCode]:
        """TxnOffsetCommit: offsets held pending until the transaction ends (the caller
        refused a producer epoch that an end fenced: :meth:`Group.txn_fenced`). An end of
        a later epoch accepted while the write is under way drops what it would have kept:
        its record comes after this one in the log, so a replay drops it as well."""
        results, accepted = self._accept(group, offsets, now)
        batch = [offsets_topic.txn_offset_record(group.group_id, producer_id, t, p, c)
                 for (t, p), c in accepted.items()]

        def keep(settled: dict[TopicPartition, CommittedOffset]) -> None:
            if not group.txn_fenced(producer_id, producer_epoch):
                group.pending_txn.setdefault(producer_id, {}).update(settled)

        return await self._store_offsets(group, batch, results, accepted, keep)

    async def complete_txn(self, group: Group, producer_id: int, commit: bool, now: int,
                           producer_epoch: int = -1, coordinator_epoch: int = -1) -> None:
        """A transaction that added the group ended (at ``now``): apply or drop its pending
        offsets (once that is written). Refused, nothing written, when an end of a later
        coordinator epoch (TRANSACTION_COORDINATOR_FENCED) or producer epoch
        (INVALID_PRODUCER_EPOCH) was accepted for the producer (-1: unknown, not judged):
        the end of a coordinator that lost the transactional id, which would end the
        producer's next transaction. A fence forgotten (:meth:`Group.forget_txn_fences`)
        judges nothing."""
        fenced = group.txn_fences.get(producer_id)
        if fenced is not None and 0 <= coordinator_epoch < fenced.coordinator_epoch:
            raise KafkaApiError(ErrorCode.TRANSACTION_COORDINATOR_FENCED,
                                f"an end of producer {producer_id}'s offsets in group "
                                f"{group.group_id!r} from coordinator epoch "
                                f"{coordinator_epoch}, which {fenced.coordinator_epoch} "
                                "fenced")
        if fenced is not None and group.txn_fenced(producer_id, producer_epoch):
            raise KafkaApiError(ErrorCode.INVALID_PRODUCER_EPOCH,
                                f"an end of producer {producer_id}'s offsets in group "
                                f"{group.group_id!r} at epoch {producer_epoch}, older than "
                                f"{fenced.producer_epoch}")
        group.fence_txn(producer_id, producer_epoch, coordinator_epoch, now)  # before the
        # write: an end of a lower epoch arriving meanwhile is refused, and the fence is
        # not forgotten
        await self.write(group, [offsets_topic.txn_end_record(
            group.group_id, producer_id, commit, producer_epoch, coordinator_epoch,
            ended_ms=now)])
        group.settle_txn(producer_id, commit, now, producer_epoch, coordinator_epoch)

    def _accept(self, group: Group, offsets: Sequence[OffsetToCommit], now: int
                ) -> tuple[dict[TopicPartition, ErrorCode],
                           dict[TopicPartition, CommittedOffset]]:
        """The error of each partition whose metadata is too large, the others' offsets,
        each at the position of its record in ``group``'s log (the caller appends them
        with no turn of the event loop in between: in the log's order)."""
        results: dict[TopicPartition, ErrorCode] = {}
        accepted: dict[TopicPartition, CommittedOffset] = {}
        for item in offsets:
            metadata = item.metadata or ""
            if len(metadata.encode()) > self.offset_metadata_max_size:
                results[(item.topic, item.partition)] = ErrorCode.OFFSET_METADATA_TOO_LARGE
                continue
            expires = None if item.retention_ms is None else now + item.retention_ms
            accepted[(item.topic, item.partition)] = CommittedOffset(
                item.offset, item.leader_epoch, metadata, now, group.next_position(),
                expires)
        return results, accepted

    async def _store_offsets(self, group: Group, batch: Sequence[Record],
                             results: dict[TopicPartition, ErrorCode],
                             accepted: dict[TopicPartition, CommittedOffset],
                             keep: Callable[[dict[TopicPartition, CommittedOffset]], None]
                             ) -> dict[TopicPartition, ErrorCode]:
        """Write the accepted offsets and, once the write settled, ``keep`` them; a failed
        write or fsync (a full disk) answers its error for each of them and keeps nothing,
        as Kafka does."""
        outcome = ErrorCode.NONE
        if batch:
            committing = group.committing
            for tp in accepted:
                committing[tp] = committing.get(tp, 0) + 1
            try:
                await self.write(group, batch)
            except KafkaApiError as error:
                outcome = error.code
            else:
                keep(accepted)
            finally:
                for tp in accepted:
                    left = committing[tp] - 1
                    if left:
                        committing[tp] = left
                    else:
                        del committing[tp]
        results.update(dict.fromkeys(accepted, outcome))
        return results

    # -- reads ---------------------------------------------------------------------------

    @staticmethod
    def unstable(group: Group | None) -> set[TopicPartition]:
        """Partitions with offsets pending in an open transaction."""
        if group is None:
            return set()
        return {tp for pending in group.pending_txn.values() for tp in pending}

    @staticmethod
    def committed(group: Group | None, partitions: Iterable[TopicPartition] | None
                  ) -> dict[TopicPartition, CommittedOffset | None]:
        """Committed offsets of the group (all of them when ``partitions`` is None)."""
        stored = group.offsets if group is not None else {}
        if partitions is None:
            return dict(stored)
        return {tp: stored.get(tp) for tp in partitions}

    # -- deletion and expiry -------------------------------------------------------------

    async def delete(self, group: Group, partitions: Sequence[TopicPartition]) -> None:
        """Remove committed offsets (the caller checked the subscriptions), once their
        tombstones are written: a failed write removes nothing, so a retry writes again.

        The log's order is the truth, as a replay sees it (after a restart, or on another
        coordinator): a tombstone removes what every record before it wrote, and nothing
        after it. So once the tombstones settle, a partition's offset goes if it was
        written before them: the one committed when they were appended, or that of a
        commit whose record preceded them and whose write was still under way (settled
        meanwhile, or later: such a commit does not keep it, as Kafka's ``removeOffsets``
        clears ``pendingOffsetCommits``). That commit is still answered NONE, as Kafka
        answers it: its offset was written, and deleted after. An offset committed after
        the tombstones were appended stays (its record follows them). Transactional
        offsets still pending stay too: a replay of a tombstone leaves them."""
        gone = {tp: group.offsets[tp] for tp in partitions if tp in group.offsets}
        if not gone:
            return
        before = list(group.unsettled)
        await self.write(group, [offsets_topic.offset_record(group.group_id, t, p, None)
                                 for t, p in gone])
        for tp, committed in gone.items():
            written_before = [committed, *(u.pop(tp) for u in before if tp in u)]
            if any(group.offsets.get(tp) is c for c in written_before):
                del group.offsets[tp]

    async def drop(self, group: Group) -> None:
        """Write the tombstones of the group and all its offsets (then the caller forgets
        it)."""
        tombstones = [offsets_topic.offset_record(group.group_id, t, p, None)
                      for t, p in group.offsets]
        tombstones.append(offsets_topic.group_record(group, deleted=True))
        await self.write(group, tombstones)

    def expired(self, group: Group, now: int) -> list[TopicPartition]:
        """The offsets of ``group`` past the retention, by Kafka's rules (KIP-211, KIP-496),
        but those with a commit under way:

        - an Empty group that had members: all of them once it has been empty that long;
        - a group that only stores offsets (no protocol type): each one committed that long
          ago;
        - a Stable group of the consumer protocol: each one committed that long ago on a
          topic none of its members subscribes to (nothing when a member's subscription
          cannot be read);
        - any other group (rebalancing, or another protocol such as Connect's): none.

        An offset committed with a retention of its own (OffsetCommit v2-v4) is past it at
        its ``expire_timestamp`` instead, in each of these cases (Kafka's rule)."""
        retention = self.retention_ms

        def past(committed: CommittedOffset, since: int) -> bool:
            if committed.expire_timestamp is not None:
                return now >= committed.expire_timestamp
            return now - since > retention

        if group.state == GroupState.EMPTY and group.protocol_type is not None:
            doomed = [tp for tp, c in group.offsets.items() if past(c, group.state_timestamp)]
        else:
            doomed = [tp for tp, c in group.offsets.items() if past(c, c.commit_timestamp)]
            if doomed and group.state != GroupState.EMPTY:
                doomed = self._unsubscribed(group, doomed)
        return [tp for tp in doomed if tp not in group.committing]

    @staticmethod
    def _unsubscribed(group: Group, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """Those of ``partitions`` whose topic a Stable consumer group does not subscribe to
        (none in any other case)."""
        if group.state != GroupState.STABLE or group.protocol_type != CONSUMER_PROTOCOL:
            return []
        subscribed = group.subscribed_topics()
        if subscribed is None:
            return []
        return [tp for tp in partitions if not naming.named_in(tp[0], subscribed)]
