"""The group coordinator: Kafka's classic group protocol over in-memory groups, with every
rebalance outcome and committed offset written to ``__consumer_offsets``.

Rebalances follow Kafka: a join moves the group to PreparingRebalance, the join phase ends
when every member has rejoined (or the rebalance timeout drops the stragglers; an empty
group's first rebalance waits ``initial_rebalance_delay_ms`` for more members), the leader
gets the member list and sends the assignment in SyncGroup, and the group is Stable.
Members that stop heartbeating are removed after their session timeout.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.groups import offsets_topic
from broker_core.groups.model import (
    CommittedOffset,
    Group,
    GroupState,
    JoinResult,
    Member,
    SyncResult,
)
from broker_core.system_topics import Record, StateCoordinator, SystemTopic

log = logging.getLogger(__name__)
TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """Settings of the group coordinator."""

    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 300_000
    initial_rebalance_delay_ms: int = 3000
    group_id_max_length: int = 255
    offset_metadata_max_size: int = 4096
    offsets_retention_ms: int = 4320 * 60_000
    retention_check_interval_ms: int = 600_000


@dataclass(frozen=True, slots=True)
class JoinRequest:
    """The fields of a JoinGroup request the coordinator uses."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    require_known_member: bool


@dataclass(frozen=True, slots=True)
class OffsetToCommit:
    """One partition's offset in an OffsetCommit request."""

    topic: str
    partition: int
    offset: int
    leader_epoch: int
    metadata: str | None


def _now_ms() -> int:
    return int(time.time() * 1000)


class GroupCoordinator(StateCoordinator):
    """All groups of this broker, keyed by (offsets topic, group id)."""

    def __init__(self, config: GroupConfig, store: SystemTopic) -> None:
        super().__init__(store, config.retention_check_interval_ms)
        self.config = config
        self.groups: dict[tuple[str, str], Group] = {}
        self.resigned = False
        self._settling: dict[tuple[str, int], list[Sequence[Record]]] = {}
        """Offset records appended but not yet settled, per log partition: kept in memory
        only once their write settles, rewritten by a compaction meanwhile."""

    # -- life cycle ----------------------------------------------------------------------

    async def stop(self) -> None:
        """Stop background work and every timer."""
        await super().stop()
        for group in self.groups.values():
            self._cancel_timers(group)

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
        """Cancel the group's timers and answer its waiting joins and syncs NOT_COORDINATOR;
        return how many were waiting."""
        self._cancel_timers(group)
        waiting = 0
        for member in group.members.values():
            join, sync = member.join_waiter, member.sync_waiter
            member.join_waiter = member.sync_waiter = None
            if join is not None and not join.done():
                join.set_result(JoinResult(ErrorCode.NOT_COORDINATOR, member.member_id))
                waiting += 1
            if sync is not None and not sync.done():
                sync.set_result(SyncResult(ErrorCode.NOT_COORDINATOR))
                waiting += 1
        return waiting

    def partition_unloaded(self, topic: str, partition: int) -> None:
        """Another broker coordinates the groups of this partition now: forget them here
        (their state is in the log the new coordinator replays)."""
        gone = [key for key, group in self.groups.items()
                if (group.topic, group.partition) == (topic, partition)]
        for key in gone:
            self._release(self.groups.pop(key))
        self._settling.pop((topic, partition), None)
        if gone:
            log.info("no longer coordinating %d groups of %s-%d", len(gone), topic, partition)

    def partition_loaded(self, topic: str, partition: int) -> None:
        """Members restored from the log get their session timers."""
        for group in self.groups.values():
            if (group.topic, group.partition) == (topic, partition):
                for member in group.members.values():
                    self._schedule_session(group, member)

    async def periodic(self, now: int) -> None:
        """Expire offsets."""
        await self.expire_offsets(now)

    def replay(self, topic: str, partition: int, key: bytes, value: bytes | None) -> None:
        """Apply one record of ``__consumer_offsets``."""
        record = offsets_topic.decode(key, value)
        if record is None:
            return
        ident = (topic, record.group_id)
        group = self.groups.get(ident)
        if group is None:
            group = self.groups[ident] = Group(record.group_id, topic, partition)
        if isinstance(record, offsets_topic.OffsetRecord):
            tp = (record.topic, record.partition)
            if record.committed is None:
                group.offsets.pop(tp, None)
            else:
                group.offsets[tp] = record.committed
        elif isinstance(record, offsets_topic.TxnOffsetRecord):
            group.pending_txn.setdefault(record.producer_id, {})[
                (record.topic, record.partition)] = record.committed
        elif isinstance(record, offsets_topic.TxnEndRecord):
            self._settle(group, record.producer_id, record.commit)
        elif record.value is None:
            del self.groups[ident]
        else:
            offsets_topic.restore_group(group, record.value)

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

    # -- persistence ---------------------------------------------------------------------

    def _store(self, group: Group, batch: Sequence[Record]) -> asyncio.Future[None] | None:
        """Append ``batch`` to the group's log (KafkaApiError NOT_COORDINATOR when the write
        fails, say on a full disk: the caller changes its state only after this)."""
        durable = self.store.append(group.topic, group.partition, batch)
        if self.store.needs_compaction(group.topic, group.partition):
            self._compact(group.topic, group.partition)
        return durable

    async def _write(self, group: Group, batch: Sequence[Record]) -> None:
        await self.store.settle(self._store(group, batch))

    def _compact(self, topic: str, partition: int) -> None:
        live: list[Record] = []
        for group in self.groups.values():
            if (group.topic, group.partition) != (topic, partition):
                continue
            if group.protocol_type is not None:
                live.append(offsets_topic.group_record(group))
            live.extend(offsets_topic.offset_record(group.group_id, t, p, committed)
                        for (t, p), committed in group.offsets.items())
            live.extend(offsets_topic.txn_offset_record(group.group_id, pid, t, p, committed)
                        for pid, pending in group.pending_txn.items()
                        for (t, p), committed in pending.items())
        for batch in self._settling.get((topic, partition), ()):
            live.extend(batch)
        self.store.compact(topic, partition, live)

    # -- timers --------------------------------------------------------------------------

    def _schedule_session(self, group: Group, member: Member) -> None:
        if member.session_timer is not None:
            member.session_timer.cancel()
        member.session_timer = asyncio.get_running_loop().call_later(
            member.session_timeout_ms / 1000, self._session_expired, group, member.member_id)

    def _session_expired(self, group: Group, member_id: str) -> None:
        member = group.members.get(member_id)
        if member is None or member.join_waiter is not None:
            return
        log.info("member %s of group %s missed its session timeout", member_id,
                 group.group_id)
        self._member_left(group, member)

    def _cancel_timers(self, group: Group) -> None:
        for member in group.members.values():
            if member.session_timer is not None:
                member.session_timer.cancel()
        for timer in group.pending.values():
            timer.cancel()
        if group.rebalance_timer is not None:
            group.rebalance_timer.cancel()

    # -- membership ----------------------------------------------------------------------

    def _remove_member(self, group: Group, member: Member, error: ErrorCode) -> None:
        if member.session_timer is not None:
            member.session_timer.cancel()
        group.members.pop(member.member_id, None)
        if member.group_instance_id is not None and \
                group.static_members.get(member.group_instance_id) == member.member_id:
            del group.static_members[member.group_instance_id]
        if member.join_waiter is not None and not member.join_waiter.done():
            member.join_waiter.set_result(JoinResult(error, member.member_id))
        if member.sync_waiter is not None and not member.sync_waiter.done():
            member.sync_waiter.set_result(SyncResult(error))

    def _member_left(self, group: Group, member: Member) -> None:
        self._remove_member(group, member, ErrorCode.UNKNOWN_MEMBER_ID)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group)
        elif group.state == GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(group)

    def _expire_pending(self, group: Group, member_id: str) -> None:
        if group.pending.pop(member_id, None) is not None:
            log.info("pending member %s of group %s never rejoined", member_id,
                     group.group_id)
            if group.state == GroupState.PREPARING_REBALANCE:
                self._maybe_complete_join(group)

    def _prepare_rebalance(self, group: Group) -> None:
        loop = asyncio.get_running_loop()
        if group.state == GroupState.COMPLETING_REBALANCE:
            for member in group.members.values():
                member.assignment = b""
                if member.sync_waiter is not None and not member.sync_waiter.done():
                    member.sync_waiter.set_result(SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
                member.sync_waiter = None
        initial = group.state == GroupState.EMPTY
        group.state = GroupState.PREPARING_REBALANCE
        group.state_timestamp = _now_ms()
        if group.rebalance_timer is not None:
            group.rebalance_timer.cancel()
        if initial and self.config.initial_rebalance_delay_ms > 0:
            delay = self.config.initial_rebalance_delay_ms
            group.delaying = True
            group.initial_delay_ms = max(group.max_rebalance_timeout_ms() - delay, 0)
            group.rebalance_timer = loop.call_later(
                delay / 1000, self._initial_delay_over, group, len(group.members))
            return
        group.rebalance_timer = loop.call_later(
            group.max_rebalance_timeout_ms() / 1000, self._complete_join, group)
        self._maybe_complete_join(group)

    def _initial_delay_over(self, group: Group, members_before: int) -> None:
        """The initial delay ended: wait once more if members kept arriving, else finish."""
        delay = self.config.initial_rebalance_delay_ms
        if len(group.members) > members_before and group.initial_delay_ms > 0:
            wait = min(delay, group.initial_delay_ms)
            group.initial_delay_ms -= wait
            group.rebalance_timer = asyncio.get_running_loop().call_later(
                wait / 1000, self._initial_delay_over, group, len(group.members))
            return
        group.rebalance_timer = None
        group.initial_delay_ms = 0
        group.delaying = False
        if group.all_joined():
            self._complete_join(group)
        else:
            group.rebalance_timer = asyncio.get_running_loop().call_later(
                group.max_rebalance_timeout_ms() / 1000, self._complete_join, group)

    def _maybe_complete_join(self, group: Group) -> None:
        if group.state == GroupState.PREPARING_REBALANCE and group.all_joined() \
                and not group.delaying:
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        if group.rebalance_timer is not None:
            group.rebalance_timer.cancel()
            group.rebalance_timer = None
        group.initial_delay_ms = 0
        group.delaying = False
        if group.state != GroupState.PREPARING_REBALANCE:
            return
        for member in [m for m in group.members.values() if m.join_waiter is None]:
            log.info("member %s of group %s did not rejoin in time", member.member_id,
                     group.group_id)
            self._remove_member(group, member, ErrorCode.UNKNOWN_MEMBER_ID)
        group.generation += 1
        group.state_timestamp = _now_ms()
        if not group.members:
            group.state = GroupState.EMPTY
            group.protocol = None
            group.leader = None
            asyncio.get_running_loop().create_task(self._persist_quietly(group))
            log.info("group %s is empty at generation %d", group.group_id, group.generation)
            return
        group.protocol = group.choose_protocol()
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.state = GroupState.COMPLETING_REBALANCE
        log.info("group %s: generation %d with %d members, protocol %s", group.group_id,
                 group.generation, len(group.members), group.protocol)
        everyone = self._everyone(group)
        for member in group.members.values():
            waiter = member.join_waiter
            member.join_waiter = None
            if waiter is not None and not waiter.done():
                waiter.set_result(self._join_result(group, member.member_id, everyone))
            self._schedule_session(group, member)

    @staticmethod
    def _everyone(group: Group) -> tuple[tuple[str, str | None, bytes], ...]:
        """What the leader learns of each member: id, instance id and protocol metadata."""
        return tuple((m.member_id, m.group_instance_id, m.metadata_for(group.protocol or ""))
                     for m in group.members.values())

    def _join_result(self, group: Group, member_id: str,
                     everyone: tuple[tuple[str, str | None, bytes], ...] = ()) -> JoinResult:
        return JoinResult(
            ErrorCode.NONE, member_id, group.generation, group.protocol_type, group.protocol,
            group.leader or "", everyone if member_id == group.leader else (),
        )

    async def _persist_quietly(self, group: Group) -> None:
        try:
            await self._write(group, [offsets_topic.group_record(group)])
        except KafkaApiError:  # a full disk, logged once by the store
            return
        except Exception:
            log.exception("could not persist group %s", group.group_id)

    # -- JoinGroup -----------------------------------------------------------------------

    async def join(self, topic: str, group_id: str,
                   request: JoinRequest) -> JoinResult | asyncio.Future[JoinResult]:
        """Handle JoinGroup: the result, or (the member registered) the future of the
        result once the rebalance completes (a request's waiting stage)."""
        if not (self.config.min_session_timeout_ms <= request.session_timeout_ms
                <= self.config.max_session_timeout_ms):
            return JoinResult(ErrorCode.INVALID_SESSION_TIMEOUT, request.member_id)
        group = (self._get_or_create(topic, group_id) if not request.member_id
                 else self.find(topic, group_id))
        if group is None:
            return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, request.member_id)
        if group.state == GroupState.DEAD:
            return JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, request.member_id)
        names = [name for name, _ in request.protocols]
        if not group.supports(request.protocol_type, names):
            return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, request.member_id)
        if not request.member_id:
            return await self._join_new(group, request)
        return await self._join_known(group, request)

    def _new_member(self, group: Group, member_id: str, request: JoinRequest) -> Member:
        member = Member(member_id, request.group_instance_id, request.client_id,
                        request.client_host, request.rebalance_timeout_ms,
                        request.session_timeout_ms, request.protocol_type,
                        list(request.protocols))
        group.members[member_id] = member
        if request.group_instance_id is not None:
            group.static_members[request.group_instance_id] = member_id
        if group.protocol_type is None or len(group.members) == 1:
            group.protocol_type = request.protocol_type
        return member

    def _await_join(self, group: Group, member: Member) -> asyncio.Future[JoinResult]:
        waiter: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()
        member.join_waiter = waiter
        if member.session_timer is not None:
            member.session_timer.cancel()
            member.session_timer = None
        if group.state == GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(group)
        else:
            self._prepare_rebalance(group)
        return waiter

    async def _join_new(self, group: Group,
                        request: JoinRequest) -> JoinResult | asyncio.Future[JoinResult]:
        member_id = f"{request.client_id}-{uuid.uuid4()}"
        instance = request.group_instance_id
        if instance is not None and instance in group.static_members:
            return await self._replace_static(group, member_id, request)
        if instance is None and request.require_known_member:
            group.pending[member_id] = asyncio.get_running_loop().call_later(
                request.session_timeout_ms / 1000, self._expire_pending, group, member_id)
            return JoinResult(ErrorCode.MEMBER_ID_REQUIRED, member_id)
        return self._await_join(group, self._new_member(group, member_id, request))

    async def _replace_static(self, group: Group, member_id: str,
                              request: JoinRequest) -> JoinResult | asyncio.Future[JoinResult]:
        """A static member rejoined with a new member id: the old id is fenced."""
        assert request.group_instance_id is not None
        old = group.members[group.static_members[request.group_instance_id]]
        self._remove_member(group, old, ErrorCode.FENCED_INSTANCE_ID)
        member = self._new_member(group, member_id, request)
        member.assignment = old.assignment
        if group.leader == old.member_id:
            group.leader = member_id
        log.info("static member %s of group %s is now %s", request.group_instance_id,
                 group.group_id, member_id)
        if group.state == GroupState.STABLE and group.choose_protocol() == group.protocol:
            # As Kafka: no rebalance when the group's protocol would not change; a leader
            # gets the members back but is told to skip the assignment.
            self._schedule_session(group, member)
            try:
                await self._write(group, [offsets_topic.group_record(group)])
            except KafkaApiError as error:
                return JoinResult(error.code, member_id)
            everyone = self._everyone(group) if member_id == group.leader else ()
            return dataclasses.replace(self._join_result(group, member_id, everyone),
                                       skip_assignment=member_id == group.leader)
        return self._await_join(group, member)

    async def _join_known(self, group: Group,
                          request: JoinRequest) -> JoinResult | asyncio.Future[JoinResult]:
        member_id = request.member_id
        instance = request.group_instance_id
        if instance is not None and group.static_members.get(instance, member_id) != member_id:
            return JoinResult(ErrorCode.FENCED_INSTANCE_ID, member_id)
        pending = group.pending.pop(member_id, None)
        if pending is not None:
            pending.cancel()
            return self._await_join(group, self._new_member(group, member_id, request))
        member = group.members.get(member_id)
        if member is None:
            return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id)
        unchanged = member.protocols == list(request.protocols)
        member.protocols = list(request.protocols)
        member.session_timeout_ms = request.session_timeout_ms
        member.rebalance_timeout_ms = request.rebalance_timeout_ms
        if group.state == GroupState.STABLE and unchanged and member_id != group.leader:
            self._schedule_session(group, member)
            return self._join_result(group, member_id)
        if group.state == GroupState.COMPLETING_REBALANCE and unchanged:
            return self._join_result(group, member_id, self._everyone(group))
        return self._await_join(group, member)

    # -- SyncGroup, Heartbeat, LeaveGroup ------------------------------------------------

    def _check_member(self, group: Group | None, member_id: str, instance: str | None,
                      generation: int) -> tuple[ErrorCode, Member | None]:
        if group is None or group.state == GroupState.DEAD:
            return ErrorCode.UNKNOWN_MEMBER_ID, None
        if instance is not None and group.static_members.get(instance, member_id) != member_id:
            return ErrorCode.FENCED_INSTANCE_ID, None
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID, None
        if generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION, member
        return ErrorCode.NONE, member

    async def sync(self, topic: str, group_id: str, member_id: str, instance: str | None,
                   generation: int, protocol_type: str | None, protocol: str | None,
                   assignments: dict[str, bytes]) -> SyncResult | asyncio.Future[SyncResult]:
        """Handle SyncGroup: the result, or the future of a follower's result once the
        leader's assignment is stored (a request's waiting stage)."""
        group = self.find(topic, group_id)
        error, member = self._check_member(group, member_id, instance, generation)
        if error != ErrorCode.NONE or member is None or group is None:
            return SyncResult(error)
        if (protocol_type is not None and protocol_type != group.protocol_type) or \
                (protocol is not None and protocol != group.protocol):
            return SyncResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        self._schedule_session(group, member)
        if group.state == GroupState.PREPARING_REBALANCE:
            return SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)
        if group.state == GroupState.STABLE:
            return SyncResult(ErrorCode.NONE, group.protocol_type, group.protocol,
                              member.assignment)
        waiter: asyncio.Future[SyncResult] = asyncio.get_running_loop().create_future()
        member.sync_waiter = waiter
        if member_id == group.leader:
            for each in group.members.values():
                each.assignment = assignments.get(each.member_id, b"")
            current = group.generation
            try:
                await self._write(group, [offsets_topic.group_record(group)])
            except KafkaApiError as failure:  # as Kafka: the members rejoin
                self._finish_sync(group, failure.code)
                if group.state == GroupState.COMPLETING_REBALANCE and \
                        group.generation == current:
                    self._prepare_rebalance(group)
            if group.state == GroupState.COMPLETING_REBALANCE and group.generation == current:
                group.state = GroupState.STABLE
                self._finish_sync(group, ErrorCode.NONE)
        return waiter

    def _finish_sync(self, group: Group, error: ErrorCode) -> None:
        for member in group.members.values():
            waiter = member.sync_waiter
            member.sync_waiter = None
            if waiter is not None and not waiter.done():
                waiter.set_result(SyncResult(error, group.protocol_type, group.protocol,
                                             member.assignment if not error else b""))

    def heartbeat(self, topic: str, group_id: str, member_id: str, instance: str | None,
                  generation: int) -> ErrorCode:
        """Handle Heartbeat."""
        group = self.find(topic, group_id)
        error, member = self._check_member(group, member_id, instance, generation)
        if error != ErrorCode.NONE or member is None or group is None:
            return error
        self._schedule_session(group, member)
        if group.state == GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave(self, topic: str, group_id: str,
              leaving: Iterable[tuple[str, str | None]]) -> list[ErrorCode]:
        """Handle LeaveGroup for each (member id, group instance id)."""
        group = self.find(topic, group_id)
        results = []
        for member_id, instance in leaving:
            if group is None or group.state == GroupState.DEAD:
                results.append(ErrorCode.UNKNOWN_MEMBER_ID)
                continue
            if instance is not None:
                mapped = group.static_members.get(instance)
                if mapped is None:
                    results.append(ErrorCode.UNKNOWN_MEMBER_ID)
                    continue
                if member_id and member_id != mapped:
                    results.append(ErrorCode.FENCED_INSTANCE_ID)
                    continue
                member_id = mapped
            if member_id in group.pending:
                group.pending.pop(member_id).cancel()
                results.append(ErrorCode.NONE)
                self._maybe_complete_join(group)
                continue
            member = group.members.get(member_id)
            if member is None:
                results.append(ErrorCode.UNKNOWN_MEMBER_ID)
                continue
            log.info("member %s left group %s", member_id, group.group_id)
            self._member_left(group, member)
            results.append(ErrorCode.NONE)
        return results

    # -- offsets -------------------------------------------------------------------------

    def _commit_check(self, group: Group, member_id: str, instance: str | None,
                      generation: int) -> ErrorCode:
        if group.state == GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if generation < 0 and group.state == GroupState.EMPTY:
            return ErrorCode.NONE
        error, _member = self._check_member(group, member_id, instance, generation)
        if error == ErrorCode.NONE and group.state == GroupState.COMPLETING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return error

    async def commit(self, topic: str, group_id: str, member_id: str, instance: str | None,
                     generation: int, offsets: Sequence[OffsetToCommit]
                     ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        """Handle OffsetCommit: a group-level error, or an error per partition."""
        group = (self._get_or_create(topic, group_id) if generation < 0
                 else self.find(topic, group_id))
        if group is None:  # a generation of a group that does not exist (any more)
            return ErrorCode.ILLEGAL_GENERATION, {}
        error = self._commit_check(group, member_id, instance, generation)
        if error != ErrorCode.NONE:
            return error, {}
        if member_id in group.members:
            self._schedule_session(group, group.members[member_id])
        results, accepted = self._offsets_to_store(offsets)
        batch = [offsets_topic.offset_record(group_id, t, p, c) for (t, p), c in accepted.items()]
        return ErrorCode.NONE, await self._store_offsets(group, batch, results, accepted,
                                                         group.offsets.update)

    def _offsets_to_store(self, offsets: Sequence[OffsetToCommit]
                          ) -> tuple[dict[TopicPartition, ErrorCode],
                                     dict[TopicPartition, CommittedOffset]]:
        """The error of each partition whose metadata is too large, the others' offsets."""
        results: dict[TopicPartition, ErrorCode] = {}
        accepted: dict[TopicPartition, CommittedOffset] = {}
        now = _now_ms()
        for item in offsets:
            metadata = item.metadata or ""
            if len(metadata.encode()) > self.config.offset_metadata_max_size:
                results[(item.topic, item.partition)] = ErrorCode.OFFSET_METADATA_TOO_LARGE
                continue
            accepted[(item.topic, item.partition)] = CommittedOffset(
                item.offset, item.leader_epoch, metadata, now)
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
            key = (group.topic, group.partition)
            settling = self._settling.setdefault(key, [])
            settling.append(batch)
            try:
                await self.store.settle(self._store(group, batch))
            except KafkaApiError as error:
                outcome = error.code
            else:
                keep(accepted)
            finally:
                settling.remove(batch)
                if not settling:
                    del self._settling[key]
        results.update(dict.fromkeys(accepted, outcome))
        return results

    async def txn_commit(self, topic: str, group_id: str, producer_id: int, member_id: str,
                         instance: str | None, generation: int,
                         offsets: Sequence[OffsetToCommit]
                         ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        """Handle TxnOffsetCommit: offsets held pending until the transaction ends."""
        group = self._get_or_create(topic, group_id)
        if generation >= 0 or member_id:
            error, _member = self._check_member(group, member_id, instance, generation)
            if error != ErrorCode.NONE:
                return error, {}
        results, accepted = self._offsets_to_store(offsets)
        batch = [offsets_topic.txn_offset_record(group_id, producer_id, t, p, c)
                 for (t, p), c in accepted.items()]

        def keep(settled: dict[TopicPartition, CommittedOffset]) -> None:
            group.pending_txn.setdefault(producer_id, {}).update(settled)

        return ErrorCode.NONE, await self._store_offsets(group, batch, results, accepted,
                                                         keep)

    def _settle(self, group: Group, producer_id: int, commit: bool) -> None:
        pending = group.pending_txn.pop(producer_id, {})
        if commit:
            group.offsets.update(pending)

    async def complete_txn(self, topic: str, group_id: str, producer_id: int,
                           commit: bool) -> None:
        """A transaction that added the group ended: apply or drop its pending offsets."""
        group = self._get_or_create(topic, group_id)
        durable = self._store(group, [offsets_topic.txn_end_record(group_id, producer_id, commit)])
        self._settle(group, producer_id, commit)
        await self.store.settle(durable)

    def unstable(self, topic: str, group_id: str) -> set[TopicPartition]:
        """Partitions with offsets pending in an open transaction."""
        group = self.find(topic, group_id)
        if group is None:
            return set()
        return {tp for pending in group.pending_txn.values() for tp in pending}

    def committed(self, topic: str, group_id: str,
                  partitions: Iterable[TopicPartition] | None
                  ) -> dict[TopicPartition, CommittedOffset | None]:
        """Committed offsets of the group (all of them when ``partitions`` is None)."""
        group = self.find(topic, group_id)
        stored = group.offsets if group is not None else {}
        if partitions is None:
            return dict(stored)
        return {tp: stored.get(tp) for tp in partitions}

    # -- administration ------------------------------------------------------------------

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
        log.info("deleted group %s", group_id)
        return ErrorCode.NONE

    async def _drop(self, group: Group) -> None:
        tombstones = [offsets_topic.offset_record(group.group_id, t, p, None)
                      for t, p in group.offsets]
        tombstones.append(offsets_topic.group_record(group, deleted=True))
        durable = self._store(group, tombstones)
        group.state = GroupState.DEAD
        self._cancel_timers(group)
        del self.groups[(group.topic, group.group_id)]
        await self.store.settle(durable)

    async def delete_offsets(self, group: Group, partitions: Sequence[TopicPartition]) -> None:
        """Remove committed offsets (the caller checked the subscriptions)."""
        gone = [tp for tp in dict.fromkeys(partitions) if tp in group.offsets]  # once each
        if not gone:
            return
        durable = self._store(group, [offsets_topic.offset_record(group.group_id, t, p, None)
                                      for t, p in gone])
        for tp in gone:
            del group.offsets[tp]
        await self.store.settle(durable)

    # -- offset expiry -------------------------------------------------------------------

    async def expire_offsets(self, now: int) -> None:
        """Drop offsets of groups that have been empty longer than the retention."""
        retention = self.config.offsets_retention_ms
        for group in list(self.groups.values()):
            if group.state != GroupState.EMPTY or (group.topic, group.partition) \
                    not in self._loaded:
                continue
            if group.protocol_type is not None:
                expired = list(group.offsets) if now - group.state_timestamp > retention else []
            else:
                expired = [tp for tp, c in group.offsets.items()
                           if now - c.commit_timestamp > retention]
            if expired:
                log.info("expiring %d offsets of group %s", len(expired), group.group_id)
                await self.delete_offsets(group, expired)
            if not group.offsets and not group.pending_txn and \
                    self.groups.get((group.topic, group.group_id)) is group:
                await self._drop(group)
