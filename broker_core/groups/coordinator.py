"""The group coordinator: the groups this broker coordinates, and the I/O around them.

It drives the membership state machine (:mod:`broker_core.groups.membership`): it turns a
request into an input with the clock's time, answers the waiting JoinGroup and SyncGroup
requests and arms asyncio timers as the machine's effects say, writes the group's record,
and feeds timers that fire and writes that settle back in. Offsets are kept by
:mod:`broker_core.groups.offsets`; records are decoded and replayed by
:mod:`broker_core.groups.offsets_topic`.

As :mod:`broker_core.stages` requires, a member is registered in the dispatch stage (the
input is applied before ``join``/``sync`` return) and the wait for the rest of the group is
the future they return, the request's waiting stage.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.groups import offsets_topic
from broker_core.groups.config import GroupConfig
from broker_core.groups.effects import (
    AnswerJoin,
    AnswerSync,
    Arm,
    Cancel,
    Effect,
    Followup,
    JoinRequest,
    Step,
    Timer,
    Waiting,
)
from broker_core.groups.membership import GroupMembership
from broker_core.groups.model import (
    CommittedOffset,
    Group,
    GroupState,
    JoinResult,
    LeaveResult,
    SyncResult,
)
from broker_core.groups.offsets import GroupOffsets, OffsetToCommit, TopicPartition
from broker_core.storage.cluster import MarkerRequest
from broker_core.system_topics import StateCoordinator, SystemTopic
from common.log_fields import group_fields, topic_fields

log = logging.getLogger(__name__)
_R = TypeVar("_R")
Written = tuple[Followup, "asyncio.Future[None] | ErrorCode | None"]

EXPIRY_FAILURES_LOGGED = 10
"""Groups whose expiry failed named in the log per round at most (a full disk fails them
all: the rest are counted in one line)."""


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class _GroupIO:
    """The driver's side of one group: the requests waiting and the timers armed."""

    joins: dict[str, asyncio.Future[JoinResult]] = field(default_factory=dict)
    syncs: dict[str, asyncio.Future[SyncResult]] = field(default_factory=dict)
    timers: dict[Timer, asyncio.TimerHandle] = field(default_factory=dict)

    def cancel_timers(self) -> None:
        for handle in self.timers.values():
            handle.cancel()
        self.timers.clear()


class GroupCoordinator(StateCoordinator):
    """All groups of this broker, keyed by (offsets topic, group id)."""

    def __init__(self, config: GroupConfig, store: SystemTopic) -> None:
        super().__init__(store, config.retention_check_interval_ms)
        self.config = config
        self.groups: dict[tuple[str, str], Group] = {}
        self.resigned = False
        self.offsets = GroupOffsets(store, config.offset_metadata_max_size,
                                    config.offsets_retention_ms, self._groups_in)
        self._io: dict[Group, _GroupIO] = {}
        self._background: set[asyncio.Task[None]] = set()

    # -- life cycle ----------------------------------------------------------------------

    async def stop(self) -> None:
        """Stop background work and every timer."""
        await super().stop()
        for io in self._io.values():
            io.cancel_timers()

    def resign(self) -> None:
        """Stop coordinating (at shutdown), as Kafka's coordinator does when it unloads its
        groups: every JoinGroup and SyncGroup still waiting is answered NOT_COORDINATOR at
        once, every timer is cancelled, and later group requests get NOT_COORDINATOR (the
        client looks for the coordinator again). Nothing is written: the committed offsets
        and the last generation stay as stored."""
        self.resigned = True
        waiting = sum(self._release(group) for group in self.groups.values())
        if waiting:
            log.info("stopped coordinating groups: %d waiting join or sync requests answered "
                     "NOT_COORDINATOR", waiting)

    def _release(self, group: Group) -> int:
        """Release the group (answer its waiting joins and syncs NOT_COORDINATOR, cancel its
        timers); return how many requests were waiting."""
        step = self._machine(group).release()
        self._apply(group, step.effects, _now_ms())
        return sum(isinstance(effect, AnswerJoin | AnswerSync) for effect in step.effects)

    def partition_unloaded(self, topic: str, partition: int) -> None:
        """Another broker coordinates the groups of this partition now, or this one replays
        it again: forget them here (their state is in the log the coordinator replays).
        A write of a group forgotten is refused (it would change what the replay reads)."""
        gone = [group for group in self.groups.values()
                if (group.topic, group.partition) == (topic, partition)]
        for group in gone:
            self._release(group)
            self._forget(group)
        self.offsets.partition_unloaded(topic, partition)
        if gone:
            log.info("forgot %d groups of %s-%d", len(gone), topic, partition,
                     extra=topic_fields(topic))

    def partition_loaded(self, topic: str, partition: int) -> None:
        """Members restored from the log get their session timers."""
        now = _now_ms()
        for group in list(self._groups_in(topic, partition)):
            self._apply(group, self._machine(group).loaded(now).effects, now)

    async def periodic(self, now: int) -> None:
        """Expire offsets."""
        await self.expire_offsets(now)

    def replay(self, topic: str, partition: int, key: bytes, value: bytes | None) -> None:
        """Apply one record of ``__consumer_offsets``."""
        offsets_topic.replay(self.groups, topic, partition, key, value, _now_ms())

    # -- placement -----------------------------------------------------------------------

    def check(self, topic: str, group_id: str) -> ErrorCode:
        """INVALID_GROUP_ID, NOT_COORDINATOR (after ``resign``, or while the group's
        partition is offline after a failed fsync: what memory holds may be more than the
        log kept, so nothing of it is served, reads included), COORDINATOR_LOAD_IN_PROGRESS,
        or NONE when the group is served."""
        if self.resigned:
            return ErrorCode.NOT_COORDINATOR
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID
        return self.serving_error(topic, group_id)

    def find(self, topic: str, group_id: str) -> Group | None:
        """The group, if it exists."""
        return self.groups.get((topic, group_id))

    def _get_or_create(self, topic: str, group_id: str) -> Group:
        group = self.groups.get((topic, group_id))
        if group is None:
            group = Group(group_id, topic, self.place(topic, group_id),
                          state_timestamp=_now_ms())
            self.groups[(topic, group_id)] = group
        return group

    def groups_of(self, topic: str) -> list[Group]:
        """Every live group kept in ``topic``, but those of a partition that is offline
        (Kafka's coordinator lists only the groups of the partitions it owns)."""
        return [g for (t, _), g in self.groups.items() if t == topic
                and g.state != GroupState.DEAD and not self.store.offline(t, g.partition)]

    def _groups_in(self, topic: str, partition: int) -> Iterator[Group]:
        return (g for g in self.groups.values() if (g.topic, g.partition) == (topic, partition))

    def _held(self, group: Group) -> bool:
        return self.groups.get((group.topic, group.group_id)) is group

    def _forget(self, group: Group) -> None:
        """The group is no longer held here: drop it and cancel its timers."""
        if self._held(group):
            del self.groups[(group.topic, group.group_id)]
        io = self._io.pop(group, None)
        if io is not None:
            io.cancel_timers()

    # -- driving the membership machine ---------------------------------------------------

    def _machine(self, group: Group) -> GroupMembership:
        return GroupMembership(group, self.config.initial_rebalance_delay_ms,
                               max_size=self.config.max_size,
                               metadata_max_bytes=self.config.metadata_max_bytes)

    def _forget_if_unused(self, group: Group) -> None:
        """Forget a group that holds and wrote nothing (:meth:`Group.unused`: made by a
        join that was refused, or whose pending member ids all lapsed or left), at once
        rather than at the next expiry pass: a JoinGroup per new group id leaves nothing."""
        if group.unused() and self._held(group):
            self._forget(group)

    def _apply(self, group: Group, effects: Sequence[Effect], now: int,
               io: _GroupIO | None = None) -> list[Written]:
        """Carry out ``effects`` (``now``: the clock of the input that gave them); return
        the writes whose outcome the machine waits for, appended but not yet settled."""
        io = io or self._io.setdefault(group, _GroupIO())
        written: list[Written] = []
        for effect in effects:
            if isinstance(effect, Arm):
                old = io.timers.pop(effect.timer, None)
                if old is not None:
                    old.cancel()
                if self._held(group):  # no timers for a group handed over meanwhile
                    io.timers[effect.timer] = asyncio.get_running_loop().call_later(
                        max(effect.at - now, 0) / 1000, self._fire, group, effect.timer)
            elif isinstance(effect, Cancel):
                handle = io.timers.pop(effect.timer, None)
                if handle is not None:
                    handle.cancel()
            elif isinstance(effect, AnswerJoin):
                _resolve(io.joins, effect.member_id, effect.result)
            elif isinstance(effect, AnswerSync):
                _resolve(io.syncs, effect.member_id, effect.result)
            elif effect.followup is not None:
                written.append((effect.followup, self._persist(group)))
            else:
                self._persist_quietly(group)
        return written

    def _persist(self, group: Group) -> asyncio.Future[None] | ErrorCode | None:
        """Append the group's record as it is now: what to await, or the error
        (NOT_COORDINATOR for a group no longer held here)."""
        if not self._held(group):
            return ErrorCode.NOT_COORDINATOR
        try:
            return self.offsets.append_group(group)
        except KafkaApiError as failure:
            return failure.code

    def _persist_quietly(self, group: Group) -> None:
        """Write the group's record; a failure is only logged (a full disk: by the store)."""
        try:
            durable = self._persist(group)
        except Exception:
            log.exception("could not persist group %s", group.group_id,
                          extra=group_fields(group.group_id, group.topic))
            return
        if isinstance(durable, asyncio.Future):
            task = asyncio.get_running_loop().create_task(self._settle_quietly(group, durable))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _settle_quietly(self, group: Group, durable: asyncio.Future[None]) -> None:
        try:
            await self.store.settle(durable)
        except KafkaApiError:  # a full disk, logged once by the store
            return
        except Exception:
            log.exception("could not persist group %s", group.group_id,
                          extra=group_fields(group.group_id, group.topic))

    async def _settle(self, group: Group, io: _GroupIO, written: list[Written]) -> None:
        """Wait for each write the machine waits for and report its outcome back."""
        while written:
            followup, durable = written.pop(0)
            error = durable if isinstance(durable, ErrorCode) else ErrorCode.NONE
            if not isinstance(durable, ErrorCode):
                try:
                    await self.store.settle(durable)
                except KafkaApiError as failure:  # as Kafka: the members rejoin
                    error = failure.code
            now = _now_ms()
            step = self._machine(group).persisted(followup, error, now)
            written.extend(self._apply(group, step.effects, now, io))

    def _fire(self, group: Group, timer: Timer) -> None:
        io = self._io.get(group)
        if io is None or io.timers.pop(timer, None) is None or not self._held(group):
            return
        now = _now_ms()
        written = self._apply(group, self._machine(group).timer_fired(timer, now).effects,
                              now, io)
        self._forget_if_unused(group)
        if written:  # not from a timer today; still carried out
            task = asyncio.get_running_loop().create_task(self._settle(group, io, written))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _answer(self, group: Group, step: Step[_R | Waiting], now: int,
                      waiters: Callable[[_GroupIO], dict[str, asyncio.Future[_R]]]
                      ) -> _R | asyncio.Future[_R]:
        """Carry out ``step`` of a request: its reply, or (the waiter registered first, as
        the step's own effects may answer it) the future of its answer."""
        io = self._io.setdefault(group, _GroupIO())
        reply = step.reply
        waiter: asyncio.Future[_R] | None = None
        if isinstance(reply, Waiting):
            waiter = asyncio.get_running_loop().create_future()
            waiters(io)[reply.member_id] = waiter
        await self._settle(group, io, self._apply(group, step.effects, now, io))
        if waiter is None:
            assert not isinstance(reply, Waiting)
            return reply
        return waiter

    # -- JoinGroup, SyncGroup, Heartbeat, LeaveGroup --------------------------------------

    async def join(self, topic: str, group_id: str,
                   request: JoinRequest) -> JoinResult | asyncio.Future[JoinResult]:
        """Handle JoinGroup: the result, or (the member registered) the future of the
        result once the rebalance completes (a request's waiting stage)."""
        if not self.config.accepts_session_timeout(request.session_timeout_ms):
            return JoinResult(ErrorCode.INVALID_SESSION_TIMEOUT, request.member_id)
        group = (self._get_or_create(topic, group_id) if not request.member_id
                 else self.find(topic, group_id))
        if group is None:
            return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, request.member_id)
        now = _now_ms()
        step = self._machine(group).join(request, f"{request.client_id}-{uuid.uuid4()}", now)
        joined = await self._answer(group, step, now, lambda io: io.joins)
        self._forget_if_unused(group)
        return joined

    async def sync(self, topic: str, group_id: str, member_id: str, instance: str | None,
                   generation: int, protocol_type: str | None, protocol: str | None,
                   assignments: dict[str, bytes]) -> SyncResult | asyncio.Future[SyncResult]:
        """Handle SyncGroup: the result, or the future of a follower's result once the
        leader's assignment is stored (a request's waiting stage)."""
        group = self.find(topic, group_id)
        if group is None:
            return SyncResult(ErrorCode.UNKNOWN_MEMBER_ID)
        now = _now_ms()
        step = self._machine(group).sync(member_id, instance, generation, protocol_type,
                                         protocol, assignments, now)
        return await self._answer(group, step, now, lambda io: io.syncs)

    def heartbeat(self, topic: str, group_id: str, member_id: str, instance: str | None,
                  generation: int) -> ErrorCode:
        """Handle Heartbeat."""
        group = self.find(topic, group_id)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        now = _now_ms()
        step = self._machine(group).heartbeat(member_id, instance, generation, now)
        self._apply(group, step.effects, now)
        return step.reply

    def leave(self, topic: str, group_id: str,
              leaving: Iterable[tuple[str, str | None]]) -> LeaveResult:
        """Handle LeaveGroup for each (member id, group instance id)."""
        group = self.find(topic, group_id)
        if group is None:
            return LeaveResult(ErrorCode.NONE,
                               tuple(ErrorCode.UNKNOWN_MEMBER_ID for _ in leaving))
        now = _now_ms()
        step = self._machine(group).leave(leaving, now)
        self._apply(group, step.effects, now)
        self._forget_if_unused(group)
        return step.reply

    # -- offsets -------------------------------------------------------------------------

    async def commit(self, topic: str, group_id: str, member_id: str, instance: str | None,
                     generation: int, offsets: Sequence[OffsetToCommit]
                     ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        """Handle OffsetCommit: a group-level error, or an error per partition."""
        group = (self._get_or_create(topic, group_id) if generation < 0
                 else self.find(topic, group_id))
        if group is None:  # a generation of a group that does not exist (any more)
            return ErrorCode.ILLEGAL_GENERATION, {}
        now = _now_ms()
        step = self._machine(group).commit_check(member_id, instance, generation, now)
        self._apply(group, step.effects, now)
        if step.reply != ErrorCode.NONE:
            return step.reply, {}
        return ErrorCode.NONE, await self.offsets.commit(group, offsets, now)

    async def txn_commit(self, topic: str, group_id: str, producer_id: int, member_id: str,
                         instance: str | None, generation: int,
                         offsets: Sequence[OffsetToCommit], producer_epoch: int = -1
                         ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        """Handle TxnOffsetCommit: offsets held pending until the transaction ends.
        INVALID_PRODUCER_EPOCH when an end of a later epoch of the producer was accepted
        here (as Kafka's offsets partition refuses a transactional write below the epoch
        of the producer's last marker): a commit arriving after the coordinator aborted its
        transaction (timed out, the epoch bumped) would stay pending for ever, every
        read_committed member's OffsetFetch answered UNSTABLE_OFFSET_COMMIT. (The
        transaction's coordinator checks the commit itself when it is this broker; on a
        cluster it may be another one.)"""
        group = self._get_or_create(topic, group_id)
        error = self._machine(group).txn_commit_check(member_id, instance, generation)
        if error == ErrorCode.NONE and group.txn_fenced(producer_id, producer_epoch):
            error = ErrorCode.INVALID_PRODUCER_EPOCH
        if error != ErrorCode.NONE:
            return error, {}
        return ErrorCode.NONE, await self.offsets.txn_commit(group, producer_id, offsets,
                                                             _now_ms(), producer_epoch)

    async def complete_txn(self, topic: str, group_id: str, producer_id: int,
                           commit: bool, producer_epoch: int = -1,
                           coordinator_epoch: int = -1) -> None:
        """A transaction that added the group ended: apply or drop its pending offsets
        (refused when a later coordinator or producer epoch fenced it:
        :meth:`GroupOffsets.complete_txn`)."""
        await self.offsets.complete_txn(self._get_or_create(topic, group_id), producer_id,
                                        commit, _now_ms(), producer_epoch, coordinator_epoch)

    async def end_txn(self, end: MarkerRequest) -> None:
        """:meth:`complete_txn` as a transaction coordinator asks it: the group, producer,
        outcome and epochs of ``end`` (``end.topic`` is the group's ``__consumer_offsets``)."""
        assert end.group_id is not None
        await self.complete_txn(end.topic, end.group_id, end.producer_id, end.commit,
                                end.producer_epoch, end.coordinator_epoch)

    def unstable(self, topic: str, group_id: str) -> set[TopicPartition]:
        """Partitions with offsets pending in an open transaction."""
        return self.offsets.unstable(self.find(topic, group_id))

    def committed(self, topic: str, group_id: str,
                  partitions: Iterable[TopicPartition] | None
                  ) -> dict[TopicPartition, CommittedOffset | None]:
        """Committed offsets of the group (all of them when ``partitions`` is None)."""
        return self.offsets.committed(self.find(topic, group_id), partitions)

    async def delete_offsets(self, group: Group, partitions: Sequence[TopicPartition]) -> None:
        """Remove committed offsets (the caller checked the subscriptions); NOT_COORDINATOR
        for a group no longer held here (forgotten since the caller found it)."""
        if not self._held(group):
            raise KafkaApiError(ErrorCode.NOT_COORDINATOR,
                                f"group {group.group_id!r} is no longer held here")
        await self.offsets.delete(group, partitions)

    # -- deletion and expiry -------------------------------------------------------------

    def topic_deleted(self, internal: str) -> None:
        """A topic was deleted (here or through another broker): remove its committed
        offsets from every group coordinated here, as Kafka does, so a topic created again
        under the name is read from where ``auto.offset.reset`` says, not from an offset
        of the old one. Written in the background; a failure is logged (expiry removes
        them later)."""
        for group in list(self.groups.values()):
            gone = [tp for tp in group.offsets if tp[0] == internal]
            if gone and (group.topic, group.partition) in self._loaded:
                task = asyncio.get_running_loop().create_task(
                    self._delete_quietly(group, gone))
                self._background.add(task)
                task.add_done_callback(self._background.discard)

    async def _delete_quietly(self, group: Group, partitions: list[TopicPartition]) -> None:
        try:
            await self.delete_offsets(group, partitions)
        except KafkaApiError as error:
            log.warning("could not remove the offsets of group %s on a deleted topic: %s",
                        group.group_id, error, extra=group_fields(group.group_id, group.topic))
        else:
            log.info("removed %d offsets of group %s on a deleted topic", len(partitions),
                     group.group_id, extra=group_fields(group.group_id, group.topic))

    async def delete_group(self, topic: str, group_id: str) -> ErrorCode:
        """Handle one group of DeleteGroups."""
        group = self.find(topic, group_id)
        if group is None or group.state == GroupState.DEAD:
            return ErrorCode.GROUP_ID_NOT_FOUND
        if group.state != GroupState.EMPTY:
            return ErrorCode.NON_EMPTY_GROUP
        try:
            await self._drop(group)
        except KafkaApiError as error:
            return error.code
        log.info("deleted group %s", group_id, extra=group_fields(group_id, topic))
        return ErrorCode.NONE

    async def _drop(self, group: Group) -> None:
        """Delete the (empty) group: Dead while its tombstones are written (its requests
        get COORDINATOR_NOT_AVAILABLE and retry), forgotten once they are durable; Empty
        again when the write fails, so a retry writes them again."""
        self._apply(group, self._machine(group).delete().effects, _now_ms())
        try:
            await self.offsets.drop(group)
        except KafkaApiError:
            if self._held(group):
                self._apply(group, self._machine(group).undeleted().effects, _now_ms())
            raise
        self._forget(group)

    async def expire_offsets(self, now: int) -> None:
        """Drop the offsets past the retention (:meth:`GroupOffsets.expired`: those of
        groups empty that long, and those committed that long ago by groups that only
        store offsets or, while Stable, no longer subscribe to their topic), by tombstones
        in the log, so a restart or another coordinator replays them gone; then drop the
        groups left empty without offsets. A group whose tombstones cannot be written
        keeps what it has until the next round; the other groups expire all the same (one
        line per failed group, at most :data:`EXPIRY_FAILURES_LOGGED` a round). Each
        group also forgets the transaction fences that cannot matter any more
        (:meth:`Group.forget_txn_fences`: in memory only, the next compaction leaves them
        out, and a replay of the records still stored forgets them again, by their own
        times)."""
        failed = forgotten = 0
        for group in list(self.groups.values()):
            if (group.topic, group.partition) not in self._loaded or not self._held(group):
                continue  # not replayed yet, or forgotten while an earlier one was written
            forgotten += group.forget_txn_fences(now,
                                                 self.config.transactional_id_expiration_ms)
            try:
                await self._expire(group, now)
            except KafkaApiError as error:  # the storage logged its cause once
                failed += 1
                if failed <= EXPIRY_FAILURES_LOGGED:
                    log.warning("could not expire the offsets of group %s (retried next "
                                "round): %s", group.group_id, error.message,
                                extra=group_fields(group.group_id, group.topic))
        if failed > EXPIRY_FAILURES_LOGGED:
            log.warning("could not expire the offsets of %d more groups this round (retried "
                        "next round)", failed - EXPIRY_FAILURES_LOGGED)
        if forgotten:
            log.info("forgot %d transaction fence(s) of producer ids whose last end is over "
                     "%d ms old", forgotten, self.config.transactional_id_expiration_ms)

    async def _expire(self, group: Group, now: int) -> None:
        """One group's part of :meth:`expire_offsets`."""
        expired = self.offsets.expired(group, now)
        if expired:
            log.info("expiring %d offsets of group %s", len(expired), group.group_id,
                     extra=group_fields(group.group_id, group.topic))
            await self.delete_offsets(group, expired)
        if group.state == GroupState.EMPTY and not group.has_offsets() and self._held(group):
            await self._drop(group)


def _resolve(waiters: dict[str, asyncio.Future[_R]], member_id: str, result: _R) -> None:
    waiter = waiters.pop(member_id, None)
    if waiter is not None and not waiter.done():
        waiter.set_result(result)
