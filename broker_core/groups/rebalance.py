"""The membership machine's internal transitions (the base of ``GroupMembership``).

``RebalanceRules`` holds what the inputs of :mod:`broker_core.groups.membership` set in
motion: checking a member, arming and cancelling its session timer, removing a member
(answering its waiting join or sync), and the rebalance itself: preparing it, the initial
rebalance delay, and completing the join phase with the answers it sends. Like the
machine, it only changes the :class:`~broker_core.groups.model.Group` and appends effects
for the driver; nothing here awaits, sleeps or writes.
"""

from __future__ import annotations

import logging

from broker_core.errors import ErrorCode
from broker_core.groups.config import GROUP_MAX_SIZE, GROUP_METADATA_MAX_BYTES
from broker_core.groups.effects import (
    REBALANCE_TIMER,
    AnswerJoin,
    AnswerSync,
    Arm,
    Cancel,
    Effect,
    Persist,
    Timer,
    TimerKind,
)
from broker_core.groups.model import Group, GroupState, JoinResult, Member, MemberList, SyncResult
from common.log_fields import LogFields, group_fields

log = logging.getLogger(__name__)


class RebalanceRules:
    """Members' timers and removal, and the rebalance, applied to ``group``."""

    def __init__(self, group: Group, initial_rebalance_delay_ms: int, *,
                 max_size: int = GROUP_MAX_SIZE,
                 metadata_max_bytes: int = GROUP_METADATA_MAX_BYTES) -> None:
        self.group = group
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.max_size = max_size
        """Members and pending member ids of the group (``groupMaxSize``)."""
        self.metadata_max_bytes = metadata_max_bytes
        """The group's :attr:`~Group.member_bytes` (``groupMetadataMaxBytes``)."""
        self._out: list[Effect] = []

    def _fields(self) -> LogFields:
        """The fields of a log line about this group (``logFormat=json``)."""
        return group_fields(self.group.group_id, self.group.topic)

    # -- members -------------------------------------------------------------------------

    def _check_member(self, member_id: str, instance: str | None,
                      generation: int) -> tuple[ErrorCode, Member | None]:
        group = self.group
        if group.state == GroupState.DEAD:  # as Kafka: its deletion is being written; retry
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, None
        if instance is not None and group.static_members.get(instance, member_id) != member_id:
            return ErrorCode.FENCED_INSTANCE_ID, None
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID, None
        if generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION, member
        return ErrorCode.NONE, member

    def _arm_session(self, member: Member, now: int) -> None:
        member.session_deadline = now + member.session_timeout_ms
        self._out.append(Arm(Timer(TimerKind.SESSION, member.member_id),
                             member.session_deadline))

    def _disarm_session(self, member: Member) -> None:
        if member.session_deadline is not None:
            member.session_deadline = None
            self._out.append(Cancel(Timer(TimerKind.SESSION, member.member_id)))

    def _cancel_timers(self) -> None:
        group = self.group
        for member in group.members.values():
            self._disarm_session(member)
        for member_id in group.pending:
            self._out.append(Cancel(Timer(TimerKind.PENDING, member_id)))
        group.pending.clear()
        self._disarm_rebalance()

    def _remove_member(self, member: Member, error: ErrorCode) -> None:
        group = self.group
        self._disarm_session(member)
        group.remove_member(member.member_id)
        if member.group_instance_id is not None and \
                group.static_members.get(member.group_instance_id) == member.member_id:
            del group.static_members[member.group_instance_id]
        self._answer_waiting(member, error)

    def _answer_waiting(self, member: Member, error: ErrorCode) -> None:
        """Answer the member's waiting join and sync with ``error``."""
        if member.joining:
            self.group.set_joining(member, False)
            self._out.append(AnswerJoin(member.member_id, JoinResult(error, member.member_id)))
        if member.syncing:
            member.syncing = False
            self._out.append(AnswerSync(member.member_id, SyncResult(error)))

    def _member_left(self, member: Member, now: int) -> None:
        self._remove_member(member, ErrorCode.UNKNOWN_MEMBER_ID)
        if self.group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(now)
        elif self.group.state == GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(now)

    def _session_expired(self, member_id: str, now: int) -> None:
        member = self.group.members.get(member_id)
        if member is None or member.joining:
            return
        member.session_deadline = None
        if member.syncing:
            # As Kafka (MemberMetadata.hasSatisfiedHeartbeat): a member waiting for its
            # assignment is alive (librdkafka does not heartbeat meanwhile); the wait
            # itself is bounded by the rebalance timeout (``_sync_expired``).
            self._arm_session(member, now)
            return
        log.info("member %s of group %s missed its session timeout", member_id,
                 self.group.group_id, extra=self._fields())
        self._member_left(member, now)

    def _pending_expired(self, member_id: str, now: int) -> None:
        if self.group.pending.pop(member_id, None) is not None:
            log.info("pending member %s of group %s never rejoined", member_id,
                     self.group.group_id, extra=self._fields())
            if self.group.state == GroupState.PREPARING_REBALANCE:
                self._maybe_complete_join(now)

    # -- rebalance -----------------------------------------------------------------------

    def _arm_rebalance(self, at: int) -> None:
        self.group.rebalance_deadline = at
        self._out.append(Arm(REBALANCE_TIMER, at))

    def _disarm_rebalance(self) -> None:
        if self.group.rebalance_deadline is not None:
            self.group.rebalance_deadline = None
            self._out.append(Cancel(REBALANCE_TIMER))

    def _sync_expired(self, now: int) -> None:
        """The rebalance timeout after the join phase passed (Kafka's pending-sync
        expiration): the members that never sent their SyncGroup are removed and the
        group rebalances; a leader that never syncs does not hold the group forever."""
        group = self.group
        late = [group.members[m] for m in group.awaiting_sync if m in group.members]
        group.awaiting_sync.clear()
        if not late:
            return
        for member in late:
            log.info("member %s of group %s did not sync in time", member.member_id,
                     group.group_id, extra=self._fields())
            self._remove_member(member, ErrorCode.UNKNOWN_MEMBER_ID)
        self._prepare_rebalance(now)

    def _synced(self, member_id: str) -> None:
        """The member sent its SyncGroup: no longer awaited (the bound ends with the last)."""
        group = self.group
        if member_id in group.awaiting_sync:
            group.awaiting_sync.discard(member_id)
            if not group.awaiting_sync:
                self._disarm_rebalance()

    def _prepare_rebalance(self, now: int) -> None:
        group = self.group
        group.awaiting_sync.clear()
        if group.state == GroupState.COMPLETING_REBALANCE:
            for member in group.members.values():
                group.set_assignment(member, b"")
                if member.syncing:
                    member.syncing = False
                    self._out.append(AnswerSync(
                        member.member_id, SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)))
        initial = group.state == GroupState.EMPTY
        group.state = GroupState.PREPARING_REBALANCE
        group.state_timestamp = now
        delay = self.initial_rebalance_delay_ms
        if initial and delay > 0:
            group.delaying = True
            group.initial_delay_ms = max(group.max_rebalance_timeout_ms() - delay, 0)
            group.delay_members_before = len(group.members)
            self._arm_rebalance(now + delay)
            return
        self._arm_rebalance(now + group.max_rebalance_timeout_ms())
        self._maybe_complete_join(now)

    def _initial_delay_over(self, now: int) -> None:
        """The initial delay ended: wait once more if members kept arriving, else finish."""
        group = self.group
        if len(group.members) > group.delay_members_before and group.initial_delay_ms > 0:
            wait = min(self.initial_rebalance_delay_ms, group.initial_delay_ms)
            group.initial_delay_ms -= wait
            group.delay_members_before = len(group.members)
            self._arm_rebalance(now + wait)
            return
        group.initial_delay_ms = 0
        group.delaying = False
        if group.all_joined():
            self._complete_join(now)
        else:
            self._arm_rebalance(now + group.max_rebalance_timeout_ms())

    def _maybe_complete_join(self, now: int) -> None:
        group = self.group
        if group.state == GroupState.PREPARING_REBALANCE and group.all_joined() \
                and not group.delaying:
            self._complete_join(now)

    def _complete_join(self, now: int) -> None:
        group = self.group
        self._disarm_rebalance()
        group.initial_delay_ms = 0
        group.delaying = False
        if group.state != GroupState.PREPARING_REBALANCE:
            return
        # As Kafka: dynamic members that did not rejoin are removed; static ones stay in
        # the new generation (the leader assigns to them; the sync bound or their session
        # removes them if they never come back), so a restarting static member comes back
        # without another rebalance.
        for member in [m for m in group.members.values()
                       if not m.joining and m.group_instance_id is None]:
            log.info("member %s of group %s did not rejoin in time", member.member_id,
                     group.group_id, extra=self._fields())
            self._remove_member(member, ErrorCode.UNKNOWN_MEMBER_ID)
        joined = [m.member_id for m in group.members.values() if m.joining]
        if group.members and not joined:
            # only absent static members: wait once more (their sessions end meanwhile)
            log.info("group %s: no member rejoined in time", group.group_id,
                     extra=self._fields())
            self._arm_rebalance(now + group.max_rebalance_timeout_ms())
            return
        group.generation += 1
        group.state_timestamp = now
        if not group.members:
            group.state = GroupState.EMPTY
            group.protocol = None
            group.leader = None
            self._out.append(Persist())
            log.info("group %s is empty at generation %d", group.group_id, group.generation,
                     extra=self._fields())
            return
        group.protocol = group.choose_protocol()
        if group.leader not in joined:
            group.leader = joined[0]
        group.state = GroupState.COMPLETING_REBALANCE
        group.awaiting_sync = set(group.members)
        self._arm_rebalance(now + group.max_rebalance_timeout_ms())
        log.info("group %s: generation %d with %d members, protocol %s", group.group_id,
                 group.generation, len(group.members), group.protocol,
                 extra=self._fields())
        everyone = self.group.everyone()
        for member in group.members.values():
            if member.joining:  # not a static member that did not rejoin
                group.set_joining(member, False)
                self._out.append(AnswerJoin(member.member_id,
                                            self._join_result(member.member_id, everyone)))
            self._arm_session(member, now)

    def _join_result(self, member_id: str, everyone: MemberList = ()) -> JoinResult:
        group = self.group
        return JoinResult(
            ErrorCode.NONE, member_id, group.generation, group.protocol_type, group.protocol,
            group.leader or "", everyone if member_id == group.leader else (),
        )
