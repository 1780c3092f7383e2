"""The membership of one group as a sans-I/O state machine (Kafka's classic group protocol).

Each input (a JoinGroup, SyncGroup, Heartbeat or LeaveGroup, a commit's membership check, a
timer that fired, a write that settled) carries the clock (``now``, ms) and returns a
:class:`Step`: the caller's answer, or :class:`Waiting` when a later effect answers it,
and the effects for the driver (:mod:`broker_core.groups.effects`). The state is the
:class:`~broker_core.groups.model.Group` itself; nothing here awaits, sleeps or writes.

Rebalances follow Kafka: a join moves the group to PreparingRebalance; the join phase ends
when every member has rejoined (or the rebalance timeout drops the stragglers; an empty
group's first rebalance waits ``initial_rebalance_delay_ms`` for more members), the leader
gets the member list and sends the assignment in SyncGroup, and once that is written the
group is Stable. Members that stop heartbeating are removed after their session timeout,
but for those waiting in JoinGroup or SyncGroup (as Kafka); members that do not send their
SyncGroup within the rebalance timeout after the join phase are removed and the group
rebalances (Kafka's pending-sync expiration).

The inputs and the JoinGroup and SyncGroup handling are here; the transitions they set in
motion (member timers and removal, preparing and completing a rebalance) are in
:mod:`broker_core.groups.rebalance`, the base class.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from typing import TypeVar

from broker_core.errors import ErrorCode
from broker_core.groups.effects import (
    AnswerJoin,
    AnswerSync,
    Arm,
    AssignmentWritten,
    Cancel,
    Followup,
    JoinRequest,
    Persist,
    StaticRejoinWritten,
    Step,
    Timer,
    TimerKind,
    Waiting,
)
from broker_core.groups.model import (
    GroupState,
    JoinResult,
    LeaveResult,
    Member,
    SyncResult,
    record_bytes,
)
from broker_core.groups.rebalance import RebalanceRules

log = logging.getLogger(__name__)
_R = TypeVar("_R")

FULL_REFUSALS_LOGGED_EVERY = 1000
"""A full group's GROUP_MAX_SIZE_REACHED refusals are logged the first time and then once
per this many (each line says how many so far)."""


class GroupMembership(RebalanceRules):
    """The membership rules applied to ``group``, the state they change."""

    def _step(self, reply: _R) -> Step[_R]:
        out, self._out = self._out, []
        return Step(reply, out)

    # -- inputs: requests ----------------------------------------------------------------

    def join(self, request: JoinRequest, new_member_id: str,
             now: int) -> Step[JoinResult | Waiting]:
        """A JoinGroup (its session timeout already checked); ``new_member_id`` is the id
        a member joining without one gets."""
        group = self.group
        if group.state == GroupState.DEAD:
            return self._step(JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, request.member_id))
        names = [name for name, _ in request.protocols]
        if not group.supports(request.protocol_type, names):
            return self._step(JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                                         request.member_id))
        refused = self._refused_join(request, new_member_id)
        if refused is not None:
            return self._step(refused)
        if not request.member_id:
            return self._step(self._join_new(request, new_member_id, now))
        return self._step(self._join_known(request, now))

    def sync(self, member_id: str, instance: str | None, generation: int,
             protocol_type: str | None, protocol: str | None, assignments: dict[str, bytes],
             now: int) -> Step[SyncResult | Waiting]:
        """A SyncGroup: a follower waits for the leader's assignment; the leader's is
        written (a Persist with :class:`AssignmentWritten`) before anyone gets it."""
        group = self.group
        error, member = self._check_member(member_id, instance, generation)
        if error != ErrorCode.NONE or member is None:
            return self._step(SyncResult(error))
        if (protocol_type is not None and protocol_type != group.protocol_type) or \
                (protocol is not None and protocol != group.protocol):
            return self._step(SyncResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL))
        self._arm_session(member, now)
        if group.state == GroupState.PREPARING_REBALANCE:
            return self._step(SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
        self._synced(member_id)
        if group.state == GroupState.STABLE:
            return self._step(SyncResult(ErrorCode.NONE, group.protocol_type, group.protocol,
                                         member.assignment))
        member.syncing = True
        if member_id == group.leader:
            if self._assignments_too_large(assignments):
                # as Kafka, whose storeGroup fails MESSAGE_TOO_LARGE, answered
                # UNKNOWN_SERVER_ERROR: the members syncing get it and rejoin
                self._assignment_written(group.generation, ErrorCode.UNKNOWN_SERVER_ERROR,
                                         now)
                return self._step(Waiting(member_id))
            for each in group.members.values():
                group.set_assignment(each, assignments.get(each.member_id, b""))
            self._out.append(Persist(AssignmentWritten(group.generation)))
        return self._step(Waiting(member_id))

    def heartbeat(self, member_id: str, instance: str | None, generation: int,
                  now: int) -> Step[ErrorCode]:
        """A Heartbeat: the member's session starts again; REBALANCE_IN_PROGRESS tells it
        to rejoin."""
        error, member = self._check_member(member_id, instance, generation)
        if error != ErrorCode.NONE or member is None:
            return self._step(error)
        self._arm_session(member, now)
        if self.group.state == GroupState.PREPARING_REBALANCE:
            return self._step(ErrorCode.REBALANCE_IN_PROGRESS)
        return self._step(ErrorCode.NONE)

    def leave(self, leaving: Iterable[tuple[str, str | None]],
              now: int) -> Step[LeaveResult]:
        """A LeaveGroup for each (member id, group instance id); a Dead group (its deletion
        being written) answers the whole request COORDINATOR_NOT_AVAILABLE, as Kafka: the
        client retries."""
        group = self.group
        if group.state == GroupState.DEAD:
            return self._step(LeaveResult(ErrorCode.COORDINATOR_NOT_AVAILABLE))
        results = []
        for member_id, instance in leaving:
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
                del group.pending[member_id]
                self._out.append(Cancel(Timer(TimerKind.PENDING, member_id)))
                results.append(ErrorCode.NONE)
                self._maybe_complete_join(now)
                continue
            member = group.members.get(member_id)
            if member is None:
                results.append(ErrorCode.UNKNOWN_MEMBER_ID)
                continue
            log.info("member %s left group %s", member_id, group.group_id,
                     extra=self._fields())
            self._member_left(member, now)
            results.append(ErrorCode.NONE)
        return self._step(LeaveResult(ErrorCode.NONE, tuple(results)))

    def commit_check(self, member_id: str, instance: str | None, generation: int,
                     now: int) -> Step[ErrorCode]:
        """Whether an OffsetCommit may commit for the group (a generation below zero: a
        group that only stores offsets); a member that commits is heard from."""
        error, member = self._validate_commit(member_id, instance, generation,
                                              transactional=False)
        if error == ErrorCode.NONE and self.group.state == GroupState.COMPLETING_REBALANCE:
            return self._step(ErrorCode.REBALANCE_IN_PROGRESS)
        if error == ErrorCode.NONE and member is not None:
            self._arm_session(member, now)
        return self._step(error)

    def txn_commit_check(self, member_id: str, instance: str | None,
                         generation: int) -> ErrorCode:
        """Whether a TxnOffsetCommit may commit: the member is checked when the request
        names one (a member id, instance id or generation: from v3), else anyone may."""
        return self._validate_commit(member_id, instance, generation, transactional=True)[0]

    def _validate_commit(self, member_id: str, instance: str | None, generation: int,
                         transactional: bool) -> tuple[ErrorCode, Member | None]:
        """Kafka's validateOffsetCommit: COORDINATOR_NOT_AVAILABLE while the group is
        Dead; an Empty group takes a commit of generation below zero from anyone (a group
        that only stores offsets, or the admin client); else a request naming a member is
        checked (instance, member, generation), and one naming none commits only if
        transactional (TxnOffsetCommit below v3 names none)."""
        group = self.group
        if group.state == GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, None
        if generation < 0 and group.state == GroupState.EMPTY:
            return ErrorCode.NONE, None
        if transactional and generation < 0 and not member_id and instance is None:
            return ErrorCode.NONE, None
        return self._check_member(member_id, instance, generation)

    # -- inputs: time and the driver ---------------------------------------------------

    def timer_fired(self, timer: Timer, now: int) -> Step[None]:
        """A timer the driver armed went off."""
        if timer.kind == TimerKind.SESSION:
            self._session_expired(timer.member_id, now)
        elif timer.kind == TimerKind.PENDING:
            self._pending_expired(timer.member_id, now)
        else:
            self.group.rebalance_deadline = None
            if self.group.delaying:
                self._initial_delay_over(now)
            elif self.group.state == GroupState.PREPARING_REBALANCE:
                self._complete_join(now)
            else:
                self._sync_expired(now)
        return self._step(None)

    def persisted(self, followup: Followup, error: ErrorCode, now: int) -> Step[None]:
        """A write with a followup settled (``error`` NONE) or failed."""
        if isinstance(followup, AssignmentWritten):
            self._assignment_written(followup.generation, error, now)
        else:
            self._static_rejoin_written(followup, error, now)
        return self._step(None)

    def loaded(self, now: int) -> Step[None]:
        """The group came back from the log: its members' sessions start now."""
        for member in self.group.members.values():
            self._arm_session(member, now)
        return self._step(None)

    def release(self) -> Step[None]:
        """This broker stops coordinating the group: waiting joins and syncs are answered
        NOT_COORDINATOR and no timer fires any more; the state stays as it is."""
        self._cancel_timers()
        for member in self.group.members.values():
            self._answer_waiting(member, ErrorCode.NOT_COORDINATOR)
        return self._step(None)

    def delete(self) -> Step[None]:
        """The (empty) group is deleted: Dead, and no timer fires any more."""
        self.group.state = GroupState.DEAD
        self._cancel_timers()
        return self._step(None)

    def undeleted(self) -> Step[None]:
        """The deletion's write failed: the group is Empty again (a member id handed out
        with MEMBER_ID_REQUIRED is forgotten, its timer gone: that member joins anew)."""
        self.group.state = GroupState.EMPTY
        self.group.pending.clear()
        return self._step(None)

    # -- JoinGroup -----------------------------------------------------------------------

    def _refused_join(self, request: JoinRequest, new_member_id: str) -> JoinResult | None:
        """The answer to a JoinGroup the group's bounds refuse, or None.

        ``groupMaxSize`` (Kafka's ``group.max.size`` and ``acceptJoiningMember``): a join
        that would add a member or a pending member id to a group holding that many
        (members and pending ids: Kafka counts pending members too) gets
        GROUP_MAX_SIZE_REACHED and no member id; a known member, a pending id joining with
        it and a static member's new id (which replaces its old one) add none. Unlike
        Kafka, an Empty group is bounded too: its pending ids are what fills it.

        ``groupMetadataMaxBytes``: a join that would grow the members' bytes in the group's
        record (:attr:`Group.member_bytes`, the member it replaces taken out) over the
        bound gets UNKNOWN_SERVER_ERROR, what Kafka answers once the group record cannot
        be stored (its ``storeGroup``, MESSAGE_TOO_LARGE); refused here, the group is not
        left to fail every assignment of it, and nothing of the metadata is kept."""
        group = self.group
        instance = request.group_instance_id
        replaced: Member | None = None
        if request.member_id:
            replaced = group.members.get(request.member_id)
            if replaced is None and request.member_id not in group.pending:
                return None  # UNKNOWN_MEMBER_ID, as the join itself answers
            adds = False
        elif instance is not None and instance in group.static_members:
            replaced = group.members[group.static_members[instance]]
            adds = False
        else:
            adds = True
        if adds and group.size() >= self.max_size:
            group.refused_full += 1
            if group.refused_full % FULL_REFUSALS_LOGGED_EVERY == 1:  # cheap requests: a
                # flood of them logs one line per thousand
                log.warning("group %s is full: %d members and pending member ids "
                            "(groupMaxSize %d); %d JoinGroup(s) refused "
                            "GROUP_MAX_SIZE_REACHED so far", group.group_id, group.size(),
                            self.max_size, group.refused_full, extra=self._fields())
            return JoinResult(ErrorCode.GROUP_MAX_SIZE_REACHED, "")
        member_id = request.member_id or new_member_id
        weight = record_bytes(member_id, instance, request.client_id, request.client_host,
                              request.protocols,
                              replaced.assignment if replaced is not None else b"")
        before = replaced.record_bytes() if replaced is not None else 0
        total = group.member_bytes + weight - before
        if weight > before and total > self.metadata_max_bytes:  # a join that does not
            # grow the group passes: a group over a bound lowered since can still shrink
            log.warning("group %s: a JoinGroup whose member weighs %d bytes would take the "
                        "group's members to %d bytes (groupMetadataMaxBytes %d); refused "
                        "UNKNOWN_SERVER_ERROR", group.group_id, weight, total,
                        self.metadata_max_bytes, extra=self._fields())
            return JoinResult(ErrorCode.UNKNOWN_SERVER_ERROR, request.member_id)
        return None

    def _assignments_too_large(self, assignments: dict[str, bytes]) -> bool:
        """Whether the leader's ``assignments`` would take the group's members over
        ``groupMetadataMaxBytes`` (one bounded log line if so)."""
        group = self.group
        total = group.member_bytes + sum(
            len(assignments.get(m.member_id, b"")) - len(m.assignment)
            for m in group.members.values())
        if total <= self.metadata_max_bytes:
            return False
        log.warning("group %s: the leader's assignment for generation %d would take the "
                    "group's members to %d bytes (groupMetadataMaxBytes %d); the SyncGroup "
                    "is answered UNKNOWN_SERVER_ERROR and the group rebalances",
                    group.group_id, group.generation, total, self.metadata_max_bytes,
                    extra=self._fields())
        return True

    def _join_new(self, request: JoinRequest, member_id: str,
                  now: int) -> JoinResult | Waiting:
        group = self.group
        instance = request.group_instance_id
        if instance is not None and instance in group.static_members:
            return self._replace_static(member_id, request, now)
        if instance is None and request.require_known_member:
            deadline = now + request.session_timeout_ms
            group.pending[member_id] = deadline
            self._out.append(Arm(Timer(TimerKind.PENDING, member_id), deadline))
            return JoinResult(ErrorCode.MEMBER_ID_REQUIRED, member_id)
        return self._await_join(self._new_member(member_id, request), now)

    def _replace_static(self, member_id: str, request: JoinRequest,
                        now: int) -> JoinResult | Waiting:
        """A static member rejoined with a new member id: the old id is fenced."""
        group = self.group
        assert request.group_instance_id is not None
        old = group.members[group.static_members[request.group_instance_id]]
        awaited = old.member_id in group.awaiting_sync
        self._remove_member(old, ErrorCode.FENCED_INSTANCE_ID)
        member = self._new_member(member_id, request)
        if awaited:  # the new id owes the SyncGroup the old one did
            group.awaiting_sync.add(member_id)
        group.set_assignment(member, old.assignment)
        old_leader = None
        if group.leader == old.member_id:
            group.leader = member_id
            if not request.can_skip_assignment:
                old_leader = old.member_id
        log.info("static member %s of group %s is now %s", request.group_instance_id,
                 group.group_id, member_id, extra=self._fields())
        if group.state == GroupState.STABLE and group.choose_protocol() == group.protocol:
            # As Kafka: no rebalance when the group's protocol would not change; once the
            # new id is written, a leader gets the members back but skips the assignment
            # (from v9; below, it is told its old id leads, and acts as a follower). Its
            # JoinGroup counts as joined at once (Kafka registers it): a rebalance another
            # member starts meanwhile waits for no other JoinGroup of it, and answers it.
            group.set_joining(member, True)
            self._out.append(Persist(StaticRejoinWritten(member_id, old, old_leader)))
            return Waiting(member_id)
        return self._await_join(member, now)

    def _join_known(self, request: JoinRequest, now: int) -> JoinResult | Waiting:
        group = self.group
        member_id = request.member_id
        instance = request.group_instance_id
        if instance is not None and group.static_members.get(instance, member_id) != member_id:
            return JoinResult(ErrorCode.FENCED_INSTANCE_ID, member_id)
        if group.pending.pop(member_id, None) is not None:
            self._out.append(Cancel(Timer(TimerKind.PENDING, member_id)))
            return self._await_join(self._new_member(member_id, request), now)
        member = group.members.get(member_id)
        if member is None:
            return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id)
        unchanged = member.protocols == list(request.protocols)
        group.set_protocols(member, list(request.protocols))
        member.session_timeout_ms = request.session_timeout_ms
        member.rebalance_timeout_ms = request.rebalance_timeout_ms
        if group.state == GroupState.STABLE and unchanged and member_id != group.leader:
            self._arm_session(member, now)
            return self._join_result(member_id)
        if group.state == GroupState.COMPLETING_REBALANCE and unchanged:
            # the members' list only for the leader: O(members) per rejoin of each
            # follower would make a rebalance O(members^2)
            return self._join_result(
                member_id, group.everyone() if member_id == group.leader else ())
        return self._await_join(member, now)

    def _new_member(self, member_id: str, request: JoinRequest) -> Member:
        group = self.group
        member = Member(member_id, request.group_instance_id, request.client_id,
                        request.client_host, request.rebalance_timeout_ms,
                        request.session_timeout_ms, request.protocol_type,
                        list(request.protocols))
        group.add_member(member)
        if request.group_instance_id is not None:
            group.static_members[request.group_instance_id] = member_id
        if group.protocol_type is None or len(group.members) == 1:
            group.protocol_type = request.protocol_type
        return member

    def _await_join(self, member: Member, now: int) -> Waiting:
        self.group.set_joining(member, True)
        self._disarm_session(member)
        if self.group.state == GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(now)
        else:
            self._prepare_rebalance(now)
        return Waiting(member.member_id)

    def _static_rejoin_written(self, written: StaticRejoinWritten, error: ErrorCode,
                               now: int) -> None:
        """A static member's new id settled. Only a JoinGroup still waiting for it in the
        Stable group is answered here: a member fenced or gone since was answered then, and
        once the group left Stable the rebalance answers (or answered) it, and writes the
        group again."""
        group = self.group
        member_id = written.member_id
        member = group.members.get(member_id)
        if member is None or not member.joining or group.state != GroupState.STABLE:
            return
        group.set_joining(member, False)
        if error != ErrorCode.NONE:
            self._unreplace_static(member, written.replaced, error, now)
            return
        self._arm_session(member, now)
        leader = member_id == group.leader
        if leader and written.old_leader is not None:
            result = dataclasses.replace(self._join_result(member_id),
                                         leader=written.old_leader)
        else:
            result = dataclasses.replace(
                self._join_result(member_id, self.group.everyone() if leader else ()),
                skip_assignment=leader)
        self._out.append(AnswerJoin(member_id, result))

    def _unreplace_static(self, new: Member, old: Member, error: ErrorCode, now: int) -> None:
        """The write of a static member's new id failed: as Kafka, the member it replaced
        comes back (its id, protocols and timeouts, its session started again), so memory
        agrees with the log, and the JoinGroup is answered with the error and no member
        id (the client joins again as a new member)."""
        group = self.group
        assert old.group_instance_id is not None
        log.warning("group %s: the new member id %s of static member %s could not be "
                    "written (%s); it is %s again", group.group_id, new.member_id,
                    old.group_instance_id, error.name, old.member_id, extra=self._fields())
        awaited = new.member_id in group.awaiting_sync
        self._disarm_session(new)
        group.remove_member(new.member_id)
        group.add_member(old)
        group.static_members[old.group_instance_id] = old.member_id
        if awaited:
            group.awaiting_sync.add(old.member_id)
        if group.leader == new.member_id:
            group.leader = old.member_id
        self._arm_session(old, now)
        self._out.append(AnswerJoin(new.member_id, JoinResult(
            error, "", group.generation, group.protocol_type, group.protocol,
            group.leader or "")))

    # -- SyncGroup -----------------------------------------------------------------------

    def _assignment_written(self, generation: int, error: ErrorCode, now: int) -> None:
        """The leader's assignment for ``generation`` settled. As Kafka's storeGroup
        callback, only while the group is still CompletingRebalance at that generation: a
        write of an older one (whose SyncGroups were answered when the group left it)
        changes nothing, so the members syncing in the current one keep waiting."""
        group = self.group
        if group.state != GroupState.COMPLETING_REBALANCE or group.generation != generation:
            return
        if error != ErrorCode.NONE:  # as Kafka: the members rejoin
            self._finish_sync(error, now)
            self._prepare_rebalance(now)
        else:
            group.state = GroupState.STABLE
            self._finish_sync(ErrorCode.NONE, now)

    def _finish_sync(self, error: ErrorCode, now: int) -> None:
        group = self.group
        for member in group.members.values():
            if member.syncing:
                member.syncing = False
                self._arm_session(member, now)
                self._out.append(AnswerSync(member.member_id, SyncResult(
                    error, group.protocol_type, group.protocol,
                    member.assignment if not error else b"")))
