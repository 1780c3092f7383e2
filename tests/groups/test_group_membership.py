"""The membership state machine (``broker_core.groups.membership``), every rebalance
transition driven by hand: no broker, no event loop, no sleeping. A small driver here plays
the coordinator's part (it keeps the armed timers, fires them when the clock passes, and
records the answers and writes) and checks after every step that the machine's idea of its
timers matches what it asked for."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

from broker_core.errors import ErrorCode
from broker_core.groups import offsets_topic
from broker_core.groups.effects import (
    REBALANCE_TIMER,
    AnswerJoin,
    AnswerSync,
    Arm,
    AssignmentWritten,
    Cancel,
    JoinRequest,
    Persist,
    StaticRejoinWritten,
    Step,
    Timer,
    TimerKind,
    Waiting,
)
from broker_core.groups.membership import GroupMembership
from broker_core.groups.model import Group, GroupState, JoinResult, LeaveResult, SyncResult

_R = TypeVar("_R")
E = ErrorCode
SESSION_MS = 10_000
REBALANCE_MS = 30_000
RANGE = [("range", b"meta")]


def protocol_counts(group: Group) -> dict[str, int]:
    """How many members list each protocol name, counted from the members themselves."""
    counts: dict[str, int] = {}
    for member in group.members.values():
        for name in set(member.protocol_names()):
            counts[name] = counts.get(name, 0) + 1
    return counts


@dataclass
class Driver:
    """The coordinator's part, by hand: the clock, the timers, the answers, the writes."""

    initial_delay_ms: int = 0
    max_size: int = 1_000
    metadata_max_bytes: int = 1 << 20
    now: int = 1_000
    group: Group = field(default_factory=lambda: Group("g", "__consumer_offsets", 0))
    timers: dict[Timer, int] = field(default_factory=dict)
    joins: dict[str, JoinResult] = field(default_factory=dict)
    syncs: dict[str, SyncResult] = field(default_factory=dict)
    writes: list[Persist] = field(default_factory=list)

    def state(self) -> GroupState:
        """The group's state (a call, so that type checkers do not narrow it)."""
        return self.group.state

    @property
    def machine(self) -> GroupMembership:
        return GroupMembership(self.group, self.initial_delay_ms, max_size=self.max_size,
                               metadata_max_bytes=self.metadata_max_bytes)

    def apply(self, step: Step[_R]) -> _R:
        for effect in step.effects:
            if isinstance(effect, Arm):
                self.timers[effect.timer] = effect.at
            elif isinstance(effect, Cancel):
                assert effect.timer in self.timers, f"cancelled {effect.timer}, not armed"
                del self.timers[effect.timer]
            elif isinstance(effect, AnswerJoin):
                assert effect.member_id not in self.joins, "answered twice"
                self.joins[effect.member_id] = effect.result
            elif isinstance(effect, AnswerSync):
                assert effect.member_id not in self.syncs, "answered twice"
                self.syncs[effect.member_id] = effect.result
            else:
                self.writes.append(effect)
        self._check_timers()
        return step.reply

    def _check_timers(self) -> None:
        group = self.group
        assert self.timers.get(REBALANCE_TIMER) == group.rebalance_deadline
        for member in group.members.values():
            timer = Timer(TimerKind.SESSION, member.member_id)
            assert self.timers.get(timer) == member.session_deadline
        pending = {t.member_id: at for t, at in self.timers.items()
                   if t.kind == TimerKind.PENDING}
        assert pending == group.pending
        sessions = {t.member_id for t in self.timers if t.kind == TimerKind.SESSION}
        assert sessions <= set(group.members)
        assert group.protocol_counts == protocol_counts(group)
        # the running counts equal what they count, after every step
        assert group.awaiting_join == sum(m.joining for m in group.members.values())
        assert group.member_bytes == sum(m.record_bytes() for m in group.members.values())

    def advance(self, ms: int) -> None:
        """Move the clock on, firing each timer that comes due, in time order."""
        until = self.now + ms
        while True:
            due = sorted(((at, t.kind.value, t.member_id), t) for t, at in self.timers.items()
                         if at <= until)
            if not due:
                break
            (at, _, _), timer = due[0]
            self.now = max(self.now, at)
            del self.timers[timer]
            self.apply(self.machine.timer_fired(timer, self.now))
        self.now = until

    # -- inputs ------------------------------------------------------------------------

    def join(self, member_id: str = "", new_id: str = "", instance: str | None = None,
             protocols: list[tuple[str, bytes]] | None = None, require_known: bool = False,
             rebalance_ms: int = REBALANCE_MS, session_ms: int = SESSION_MS,
             can_skip: bool = True) -> JoinResult | Waiting:
        self.joins.pop(member_id or new_id, None)
        request = JoinRequest(member_id, instance, "client", "/127.0.0.1", session_ms,
                              rebalance_ms, "consumer",
                              RANGE if protocols is None else protocols, require_known,
                              can_skip)
        return self.apply(self.machine.join(request, new_id, self.now))

    def sync(self, member_id: str, generation: int | None = None, instance: str | None = None,
             assignments: dict[str, bytes] | None = None) -> SyncResult | Waiting:
        self.syncs.pop(member_id, None)
        gen = self.group.generation if generation is None else generation
        return self.apply(self.machine.sync(member_id, instance, gen, None, None,
                                            assignments or {}, self.now))

    def heartbeat(self, member_id: str, generation: int | None = None,
                  instance: str | None = None) -> ErrorCode:
        gen = self.group.generation if generation is None else generation
        return self.apply(self.machine.heartbeat(member_id, instance, gen, self.now))

    def leave(self, *leaving: tuple[str, str | None]) -> list[ErrorCode]:
        """Each member's answer (the request as a whole answered NONE)."""
        result = self.apply(self.machine.leave(leaving, self.now))
        assert result.error == E.NONE, result
        return list(result.members)

    def written(self, error: ErrorCode = E.NONE) -> None:
        """The last write with a followup settled (or failed with ``error``)."""
        followup = self.writes.pop().followup
        assert followup is not None
        self.apply(self.machine.persisted(followup, error, self.now))

    # -- scenarios ---------------------------------------------------------------------

    def stable(self, *members: str) -> None:
        """Bring the group to Stable with ``members`` (the first one leads)."""
        for member in members:
            assert self.join(new_id=member) == Waiting(member)
        self.advance(self.initial_delay_ms)
        for member in members:  # those answered by an earlier round rejoin
            if not self.group.members[member].joining:
                self.join(member)
        assert self.state() == GroupState.COMPLETING_REBALANCE
        assert self.group.leader == members[0]
        for member in members[1:]:
            assert self.sync(member) == Waiting(member)
        leader = members[0]
        assert self.sync(leader, assignments={m: m.encode() for m in members}) == Waiting(leader)
        self.written()
        assert self.state() == GroupState.STABLE
        assert all(self.syncs[m].error == E.NONE for m in members)


def test_empty_to_stable_through_every_state() -> None:
    d = Driver()
    assert d.state() == GroupState.EMPTY
    assert d.join(new_id="a") == Waiting("a")
    # the only member has joined: the join phase ends at once, the rebalance timer with it
    assert d.state() == GroupState.COMPLETING_REBALANCE
    result = d.joins["a"]
    assert (result.error, result.generation, result.leader, result.protocol) == \
        (E.NONE, 1, "a", "range")
    assert result.members == (("a", None, b"meta"),)
    assert d.timers[REBALANCE_TIMER] == d.now + REBALANCE_MS
    assert d.timers[Timer(TimerKind.SESSION, "a")] == d.now + SESSION_MS
    assert d.sync("a", assignments={"a": b"part-0"}) == Waiting("a")
    assert REBALANCE_TIMER not in d.timers  # everyone synced
    assert d.writes == [Persist(AssignmentWritten(1))]
    assert d.state() == GroupState.COMPLETING_REBALANCE  # until the write settles
    assert "a" not in d.syncs
    d.written()
    assert d.state() == GroupState.STABLE
    assert d.syncs["a"] == SyncResult(E.NONE, "consumer", "range", b"part-0")


def test_initial_delay_waits_for_more_members_and_is_bounded() -> None:
    d = Driver(initial_delay_ms=3_000)
    assert d.join(new_id="a", rebalance_ms=7_000) == Waiting("a")
    assert d.state() == GroupState.PREPARING_REBALANCE and d.group.delaying
    assert d.timers[REBALANCE_TIMER] == d.now + 3_000
    d.advance(1_000)
    assert d.join(new_id="b", rebalance_ms=7_000) == Waiting("b")
    d.advance(2_000)  # a member arrived during the delay: wait once more
    assert d.state() == GroupState.PREPARING_REBALANCE
    assert d.joins == {}
    d.advance(3_000)  # nobody new: the join phase ends
    assert d.state() == GroupState.COMPLETING_REBALANCE
    assert set(d.joins) == {"a", "b"} and d.joins["a"].generation == 1
    assert not d.group.delaying and d.timers[REBALANCE_TIMER] == d.now + 7_000  # the sync bound


def test_initial_delay_never_exceeds_the_rebalance_timeout() -> None:
    d = Driver(initial_delay_ms=3_000)
    start = d.now
    d.join(new_id="m0", rebalance_ms=5_000)
    d.advance(2_500)
    d.join(new_id="m1", rebalance_ms=5_000)
    d.advance(2_400)  # the delay was extended once, by what the rebalance timeout leaves
    d.join(new_id="m2", rebalance_ms=5_000)
    assert d.state() == GroupState.PREPARING_REBALANCE
    d.advance(100)  # members still arriving, but the rebalance timeout is reached
    assert d.now - start == 5_000
    assert d.state() == GroupState.COMPLETING_REBALANCE
    assert d.group.generation == 1 and set(d.joins) == {"m0", "m1", "m2"}


def test_joins_during_preparing_rebalance_make_one_generation() -> None:
    d = Driver()
    d.stable("a", "b")
    gen = d.group.generation
    assert d.join(new_id="c") == Waiting("c")  # a new member: rebalance
    assert d.state() == GroupState.PREPARING_REBALANCE
    assert d.heartbeat("a") == E.REBALANCE_IN_PROGRESS
    assert d.join("a") == Waiting("a")
    assert d.state() == GroupState.PREPARING_REBALANCE  # b has not rejoined yet
    assert d.join("b") == Waiting("b")
    assert d.state() == GroupState.COMPLETING_REBALANCE
    assert {m: r.generation for m, r in d.joins.items()} == {"a": gen + 1, "b": gen + 1,
                                                             "c": gen + 1}
    assert d.joins["a"].leader == "a" and len(d.joins["a"].members) == 3
    assert d.joins["b"].members == ()  # only the leader learns the members


def test_join_during_completing_rebalance_restarts_it() -> None:
    d = Driver()
    d.stable("a")
    d.join(new_id="b")
    d.join("a")
    assert d.state() == GroupState.COMPLETING_REBALANCE
    assert d.sync("b") == Waiting("b")
    assert d.join(new_id="c") == Waiting("c")  # a newcomer before the leader synced
    assert d.state() == GroupState.PREPARING_REBALANCE
    assert d.syncs["b"].error == E.REBALANCE_IN_PROGRESS
    assert all(m.assignment == b"" for m in d.group.members.values())


def test_known_member_rejoins_in_completing_rebalance_without_a_new_round() -> None:
    d = Driver()
    d.join(new_id="a")
    assert d.state() == GroupState.COMPLETING_REBALANCE
    result = d.join("a")  # a retry of the same join: answered at once, with the members
    assert isinstance(result, JoinResult)
    assert (result.error, result.generation, result.members) == \
        (E.NONE, 1, (("a", None, b"meta"),))
    assert d.state() == GroupState.COMPLETING_REBALANCE


def test_rejoin_in_stable_follower_unchanged_leader_or_changed_rebalances() -> None:
    d = Driver()
    d.stable("a", "b")
    follower = d.join("b")  # unchanged follower: its current generation, no rebalance
    assert isinstance(follower, JoinResult) and follower.generation == d.group.generation
    assert follower.members == ()
    assert d.state() == GroupState.STABLE
    assert d.join("a") == Waiting("a")  # the leader rejoining means a new assignment
    assert d.state() == GroupState.PREPARING_REBALANCE
    d = Driver()
    d.stable("a", "b")
    assert d.join("b", protocols=[("range", b"new")]) == Waiting("b")  # changed metadata
    assert d.state() == GroupState.PREPARING_REBALANCE


def test_leader_leaves_in_stable_and_another_member_leads() -> None:
    d = Driver()
    d.stable("a", "b")
    gen = d.group.generation
    assert d.leave(("a", None)) == [E.NONE]
    assert d.state() == GroupState.PREPARING_REBALANCE
    assert Timer(TimerKind.SESSION, "a") not in d.timers
    assert d.heartbeat("b") == E.REBALANCE_IN_PROGRESS
    d.join("b")
    assert d.state() == GroupState.COMPLETING_REBALANCE
    assert d.joins["b"].leader == "b" and d.group.generation == gen + 1


def test_leader_leaves_before_syncing_and_followers_rejoin() -> None:
    d = Driver()
    d.stable("a")
    d.join(new_id="b")
    d.join("a")
    assert d.state() == GroupState.COMPLETING_REBALANCE and d.group.leader == "a"
    d.sync("b")
    assert d.leave(("a", None)) == [E.NONE]
    assert d.syncs["b"].error == E.REBALANCE_IN_PROGRESS
    assert d.state() == GroupState.PREPARING_REBALANCE


def test_last_member_leaving_empties_the_group_and_writes_it() -> None:
    d = Driver()
    d.stable("a")
    d.writes.clear()
    assert d.leave(("a", None)) == [E.NONE]
    assert d.state() == GroupState.EMPTY
    assert d.group.generation == 2 and d.group.leader is None and d.group.protocol is None
    assert d.writes == [Persist()]  # no followup: nothing waits for it
    assert d.timers == {}
    assert d.join(new_id="b") == Waiting("b")  # Empty again: a new first rebalance
    assert d.joins["b"].generation == 3


def test_session_expiry_in_stable() -> None:
    d = Driver()
    d.stable("a", "b")
    d.advance(SESSION_MS - 1)
    assert d.heartbeat("a") == E.NONE
    d.advance(1)  # b was not heard from
    assert "b" not in d.group.members
    assert d.state() == GroupState.PREPARING_REBALANCE
    assert d.heartbeat("b") == E.UNKNOWN_MEMBER_ID


def test_session_expiry_in_completing_rebalance() -> None:
    d = Driver()
    d.stable("a")
    d.join(new_id="b")
    d.join("a")
    assert d.state() == GroupState.COMPLETING_REBALANCE
    d.sync("a", assignments={"a": b"x", "b": b"y"})  # the leader's write is in flight
    d.advance(SESSION_MS // 2)
    assert d.heartbeat("a") == E.NONE
    d.advance(SESSION_MS // 2)  # b never synced nor heartbeated
    assert "b" not in d.group.members
    assert d.syncs["a"].error == E.REBALANCE_IN_PROGRESS
    assert d.state() == GroupState.PREPARING_REBALANCE
    d.written()  # the assignment of the old generation settles: nothing more happens
    assert d.state() == GroupState.PREPARING_REBALANCE


def test_session_expiry_in_preparing_rebalance_completes_the_join() -> None:
    d = Driver()
    d.stable("a", "b")
    gen = d.group.generation
    d.advance(SESSION_MS // 2)
    d.join("a")  # the leader rejoins; b never does and its session ends first
    assert d.state() == GroupState.PREPARING_REBALANCE
    d.advance(SESSION_MS // 2)
    assert "b" not in d.group.members
    assert d.state() == GroupState.COMPLETING_REBALANCE
    assert d.joins["a"].generation == gen + 1
    assert d.joins["a"].members == (("a", None, b"meta"),)


def test_a_joining_member_has_no_session_timer() -> None:
    d = Driver()
    d.stable("a", "b")
    d.join("a")
    assert Timer(TimerKind.SESSION, "a") not in d.timers
    assert Timer(TimerKind.SESSION, "b") in d.timers


def test_rebalance_timeout_drops_members_that_did_not_rejoin() -> None:
    d = Driver()
    d.stable("a", "b", "c")
    gen = d.group.generation
    d.join(new_id="d")
    d.join("a")
    for _ in range(REBALANCE_MS // 5_000):  # b and c heartbeat, so their sessions last
        for member in ("b", "c"):
            assert d.heartbeat(member) == E.REBALANCE_IN_PROGRESS
        d.advance(5_000)
    assert set(d.group.members) == {"a", "d"}
    assert d.state() == GroupState.COMPLETING_REBALANCE
    assert d.group.generation == gen + 1
    assert d.heartbeat("b") == E.UNKNOWN_MEMBER_ID


def test_rebalance_timeout_with_nobody_rejoining_empties_the_group() -> None:
    d = Driver()
    assert d.join(new_id="a", session_ms=10 * REBALANCE_MS) == Waiting("a")
    d.sync("a", assignments={"a": b""})
    d.written()
    d.writes.clear()
    d.join(new_id="b")
    assert d.leave(("b", None)) == [E.NONE]  # b leaves; a never rejoins
    assert d.joins["b"] == JoinResult(E.UNKNOWN_MEMBER_ID, "b")
    assert d.state() == GroupState.PREPARING_REBALANCE
    d.advance(REBALANCE_MS)
    assert d.state() == GroupState.EMPTY and d.group.members == {}
    assert d.writes == [Persist()]


def test_member_id_required_then_join_with_it() -> None:
    d = Driver()
    first = d.join(new_id="a", require_known=True)
    assert first == JoinResult(E.MEMBER_ID_REQUIRED, "a")
    assert d.group.pending == {"a": d.now + SESSION_MS} and d.group.members == {}
    assert d.join("a") == Waiting("a")
    assert d.group.pending == {} and d.state() == GroupState.COMPLETING_REBALANCE


def test_a_pending_member_that_never_joins_lapses() -> None:
    d = Driver()
    d.stable("a")
    d.join(new_id="p", require_known=True)
    d.join("a")  # a rebalance; the pending member holds it up until it lapses
    assert d.state() == GroupState.PREPARING_REBALANCE
    d.advance(SESSION_MS)
    assert d.group.pending == {} and d.state() == GroupState.COMPLETING_REBALANCE
    assert d.join("p") == JoinResult(E.UNKNOWN_MEMBER_ID, "p")


def test_a_pending_member_may_leave() -> None:
    d = Driver()
    d.join(new_id="p", require_known=True)
    assert d.leave(("p", None)) == [E.NONE]
    assert d.group.pending == {} and d.timers == {}


def static_pair(d: Driver, session_ms: int = SESSION_MS) -> None:
    """Static members a1 (instance i-a, the leader) and b1 (i-b), Stable."""
    d.join(new_id="a1", instance="i-a", session_ms=session_ms)
    d.join(new_id="b1", instance="i-b", session_ms=session_ms)
    d.join("a1", instance="i-a", session_ms=session_ms)
    d.sync("b1", instance="i-b")
    d.sync("a1", instance="i-a", assignments={"a1": b"A", "b1": b"B"})
    d.written()
    assert d.state() == GroupState.STABLE


def test_static_member_replaced_without_a_rebalance() -> None:
    d = Driver()
    static_pair(d)
    gen = d.group.generation
    # the leader restarts: same instance, new member id, same protocols
    a1 = d.group.members["a1"]
    assert d.join(new_id="a2", instance="i-a") == Waiting("a2")
    assert d.writes == [Persist(StaticRejoinWritten("a2", a1))]
    assert d.state() == GroupState.STABLE and d.group.leader == "a2"
    assert d.group.members["a2"].assignment == b"A"
    assert "a2" not in d.joins  # answered once the new member id is written
    d.written()
    result = d.joins["a2"]
    assert (result.error, result.generation, result.skip_assignment) == (E.NONE, gen, True)
    assert {m for m, _, _ in result.members} == {"a2", "b1"}
    # the old member id is fenced
    assert d.heartbeat("a1", instance="i-a") == E.FENCED_INSTANCE_ID
    assert d.heartbeat("a1") == E.UNKNOWN_MEMBER_ID
    assert d.join("a1", instance="i-a") == JoinResult(E.FENCED_INSTANCE_ID, "a1")
    assert d.sync("a1", instance="i-a") == SyncResult(E.FENCED_INSTANCE_ID)
    assert d.heartbeat("a2", instance="i-a") == E.NONE


def test_static_leader_replaced_below_v9_is_answered_as_a_follower() -> None:
    # As Kafka when the JoinGroup cannot skip the assignment (below v9): the rejoined
    # leader gets no members and its old id as the leader, so it only syncs.
    d = Driver()
    static_pair(d)
    gen = d.group.generation
    a1 = d.group.members["a1"]
    assert d.join(new_id="a2", instance="i-a", can_skip=False) == Waiting("a2")
    assert d.writes == [Persist(StaticRejoinWritten("a2", a1, "a1"))]
    d.written()
    result = d.joins["a2"]
    assert (result.error, result.generation, result.leader, result.members,
            result.skip_assignment) == (E.NONE, gen, "a1", (), False)
    assert d.group.leader == "a2" and d.state() == GroupState.STABLE
    assert d.sync("a2", instance="i-a") == SyncResult(E.NONE, "consumer", "range", b"A")


def test_static_follower_replaced_is_not_told_to_skip() -> None:
    d = Driver()
    static_pair(d)
    d.join(new_id="b2", instance="i-b")
    d.written()
    assert d.joins["b2"].skip_assignment is False and d.joins["b2"].members == ()


def test_a_static_rejoin_whose_write_fails_is_undone() -> None:
    # As Kafka (updateStaticMemberAndRebalance): the member the new id replaced comes
    # back with its protocols and timeouts and its session, and the JoinGroup is answered
    # with the error and no member id; memory agrees with the log again.
    d = Driver()
    static_pair(d)
    gen = d.group.generation
    d.advance(SESSION_MS // 2)
    assert d.join(new_id="b2", instance="i-b", protocols=[("range", b"new")],
                  session_ms=2 * SESSION_MS, rebalance_ms=2 * REBALANCE_MS) == Waiting("b2")
    assert d.heartbeat("b1", instance="i-b") == E.FENCED_INSTANCE_ID  # while it is written
    d.written(E.NOT_COORDINATOR)
    assert d.joins["b2"] == JoinResult(E.NOT_COORDINATOR, "", gen, "consumer", "range", "a1")
    assert set(d.group.members) == {"a1", "b1"} and d.state() == GroupState.STABLE
    assert d.group.static_members == {"i-a": "a1", "i-b": "b1"}
    b1 = d.group.members["b1"]
    assert (b1.protocols, b1.session_timeout_ms, b1.rebalance_timeout_ms, b1.assignment) == \
        (RANGE, SESSION_MS, REBALANCE_MS, b"B")
    assert d.timers[Timer(TimerKind.SESSION, "b1")] == d.now + SESSION_MS  # heard from anew
    assert d.heartbeat("b1", instance="i-b") == E.NONE
    assert d.heartbeat("b2") == E.UNKNOWN_MEMBER_ID
    assert d.sync("b1", instance="i-b") == SyncResult(E.NONE, "consumer", "range", b"B")
    # the leader's failed rejoin gives the lead back to its old id
    assert d.join(new_id="a2", instance="i-a") == Waiting("a2")
    assert d.group.leader == "a2"
    d.written(E.NOT_COORDINATOR)
    assert d.joins["a2"] == JoinResult(E.NOT_COORDINATOR, "", gen, "consumer", "range", "a1")
    assert d.group.leader == "a1" and set(d.group.members) == {"a1", "b1"}
    assert d.join("a1", instance="i-a") == Waiting("a1")  # the old id leads a rebalance
    assert d.state() == GroupState.PREPARING_REBALANCE


def test_static_member_with_a_changed_protocol_rebalances() -> None:
    d = Driver()
    d.join(new_id="a1", instance="i-a", protocols=[("range", b""), ("roundrobin", b"")])
    d.sync("a1", assignments={"a1": b"A"})
    d.written()
    assert d.group.protocol == "range"
    assert d.join(new_id="a2", instance="i-a",
                  protocols=[("roundrobin", b"m")]) == Waiting("a2")
    assert d.writes == []  # no shortcut: a full rebalance, whose join answers a2
    assert d.state() == GroupState.COMPLETING_REBALANCE
    assert d.joins["a2"].protocol == "roundrobin" and d.joins["a2"].generation == 2


def test_static_member_with_changed_metadata_of_the_same_protocol_keeps_the_group() -> None:
    d = Driver()
    static_pair(d)
    assert d.join(new_id="b2", instance="i-b",
                  protocols=[("range", b"other")]) == Waiting("b2")
    assert d.state() == GroupState.STABLE  # the chosen protocol stays: no rebalance
    d.written()
    assert d.joins["b2"].error == E.NONE


def test_static_member_replaced_while_joining_fences_the_waiting_join() -> None:
    d = Driver()
    d.stable("a")
    d.join(new_id="s1", instance="i-s")  # waits for a to rejoin
    assert d.join(new_id="s2", instance="i-s") == Waiting("s2")
    assert d.joins["s1"] == JoinResult(E.FENCED_INSTANCE_ID, "s1")
    d.join("a")
    assert set(d.group.members) == {"a", "s2"}


def test_static_leave_checks_the_instance() -> None:
    d = Driver()
    d.join(new_id="a1", instance="i-a")
    assert d.leave(("other", "i-a"), ("", "i-x")) == \
        [E.FENCED_INSTANCE_ID, E.UNKNOWN_MEMBER_ID]
    assert d.leave(("", "i-a")) == [E.NONE]  # by instance alone
    assert d.group.static_members == {} and d.state() == GroupState.EMPTY


def test_sync_from_a_follower_before_the_leader() -> None:
    d = Driver()
    d.stable("a")
    d.join(new_id="b")
    d.join("a")
    assert d.sync("b") == Waiting("b")
    assert "b" not in d.syncs
    assert d.heartbeat("b") == E.NONE  # heartbeats are fine while assignments are made
    d.sync("a", assignments={"a": b"A", "b": b"B"})
    d.written()
    assert d.syncs["b"] == SyncResult(E.NONE, "consumer", "range", b"B")
    assert d.syncs["a"].assignment == b"A"
    assert d.sync("b") == SyncResult(E.NONE, "consumer", "range", b"B")  # once Stable


def test_a_failed_assignment_write_makes_the_members_rejoin() -> None:
    d = Driver()
    d.stable("a")
    d.join(new_id="b")
    d.join("a")
    d.sync("b")
    d.sync("a", assignments={"a": b"A", "b": b"B"})
    d.written(E.NOT_COORDINATOR)
    assert d.syncs["a"] == d.syncs["b"] == SyncResult(E.NOT_COORDINATOR, "consumer", "range")
    assert d.state() == GroupState.PREPARING_REBALANCE
    assert d.heartbeat("a") == E.REBALANCE_IN_PROGRESS


def test_sync_errors() -> None:
    d = Driver()
    d.stable("a")
    gen = d.group.generation
    assert d.sync("x") == SyncResult(E.UNKNOWN_MEMBER_ID)
    assert d.sync("a", generation=7) == SyncResult(E.ILLEGAL_GENERATION)
    assert d.apply(d.machine.sync("a", None, gen, "connect", None, {}, d.now)) == \
        SyncResult(E.INCONSISTENT_GROUP_PROTOCOL)
    assert d.apply(d.machine.sync("a", None, gen, None, "sticky", {}, d.now)) == \
        SyncResult(E.INCONSISTENT_GROUP_PROTOCOL)
    d.join(new_id="b")
    assert d.sync("a") == SyncResult(E.REBALANCE_IN_PROGRESS)


def test_heartbeat_errors_in_each_state() -> None:
    d = Driver()
    assert d.heartbeat("a") == E.UNKNOWN_MEMBER_ID  # Empty
    d.join(new_id="s1", instance="i-s")
    assert d.state() == GroupState.COMPLETING_REBALANCE
    assert d.heartbeat("s1") == E.NONE
    assert d.heartbeat("s1", generation=0) == E.ILLEGAL_GENERATION
    assert d.heartbeat("x", instance="i-s") == E.FENCED_INSTANCE_ID
    d.sync("s1", assignments={"s1": b""})
    d.written()
    assert d.heartbeat("s1") == E.NONE  # Stable
    assert d.heartbeat("nobody") == E.UNKNOWN_MEMBER_ID
    d.join(new_id="b")
    assert d.state() == GroupState.PREPARING_REBALANCE
    assert d.heartbeat("s1") == E.REBALANCE_IN_PROGRESS
    assert d.heartbeat("s1", generation=0) == E.ILLEGAL_GENERATION
    assert d.heartbeat("b") == E.REBALANCE_IN_PROGRESS  # joined, waiting, generation 1
    d.leave(("s1", "i-s"), ("b", None))
    d.apply(d.machine.delete())  # Dead while its deletion is written: retry, as Kafka
    assert d.heartbeat("s1") == E.COORDINATOR_NOT_AVAILABLE
    assert d.sync("s1") == SyncResult(E.COORDINATOR_NOT_AVAILABLE)


def test_join_errors() -> None:
    d = Driver()
    d.stable("a")
    assert d.join(new_id="b", protocols=[("other", b"")]) == \
        JoinResult(E.INCONSISTENT_GROUP_PROTOCOL, "")
    assert d.join("ghost") == JoinResult(E.UNKNOWN_MEMBER_ID, "ghost")
    d.group.state = GroupState.DEAD
    assert d.join(new_id="c") == JoinResult(E.COORDINATOR_NOT_AVAILABLE, "")


def test_commit_checks_per_state() -> None:
    d = Driver()
    check = d.machine.commit_check
    assert d.apply(check("", None, -1, d.now)) == E.NONE  # a group that only stores offsets
    d.join(new_id="a")
    assert d.apply(check("a", None, 1, d.now)) == E.REBALANCE_IN_PROGRESS  # Completing
    d.sync("a", assignments={"a": b""})
    d.written()
    d.advance(5_000)
    assert d.apply(check("a", None, 1, d.now)) == E.NONE
    assert d.timers[Timer(TimerKind.SESSION, "a")] == d.now + SESSION_MS  # heard from
    assert d.apply(check("a", None, 0, d.now)) == E.ILLEGAL_GENERATION
    assert d.apply(check("", None, -1, d.now)) == E.UNKNOWN_MEMBER_ID  # it has members
    assert d.apply(check("x", None, 1, d.now)) == E.UNKNOWN_MEMBER_ID
    d.join(new_id="b")
    assert d.apply(check("a", None, 1, d.now)) == E.NONE  # Preparing: still this generation
    assert d.machine.txn_commit_check("", None, -1) == E.NONE
    assert d.machine.txn_commit_check("a", None, 0) == E.ILLEGAL_GENERATION
    assert d.machine.txn_commit_check("a", None, 1) == E.NONE
    d.leave(("a", None), ("b", None))
    d.apply(d.machine.delete())
    assert d.apply(check("a", None, 1, d.now)) == E.COORDINATOR_NOT_AVAILABLE


def test_release_answers_the_waiting_and_stops_every_timer() -> None:
    d = Driver()
    d.stable("a", "b")
    d.join(new_id="c", require_known=True)  # a pending member id
    d.join(new_id="d")
    d.join("a")
    assert d.state() == GroupState.PREPARING_REBALANCE
    d.apply(d.machine.release())
    assert d.joins["a"] == JoinResult(E.NOT_COORDINATOR, "a")
    assert d.joins["d"] == JoinResult(E.NOT_COORDINATOR, "d")
    assert d.timers == {}


def test_release_answers_waiting_syncs() -> None:
    d = Driver()
    d.stable("a")
    d.join(new_id="b")
    d.join("a")
    d.sync("b")
    d.apply(d.machine.release())
    assert d.syncs["b"] == SyncResult(E.NOT_COORDINATOR)


def test_the_group_keeps_a_count_of_its_members_protocols() -> None:
    """A join is checked against a count of each protocol's members (Kafka's
    supportedProtocols), kept through joins, rejoins with other protocols, leaves, static
    replacement and a restore from the log (the driver checks it after every step): a
    join's cost is its own protocols, not every member's."""
    d = Driver()
    both = [("range", b""), ("roundrobin", b""), ("range", b"twice")]
    d.join(new_id="a", instance="i-a", protocols=both)
    d.join(new_id="b", protocols=[("roundrobin", b"")])
    assert d.group.protocol_counts == {"range": 1, "roundrobin": 2}
    assert d.join(new_id="c", protocols=[("range", b"")]) == \
        JoinResult(E.INCONSISTENT_GROUP_PROTOCOL, "")
    assert d.join("b", protocols=[("range", b""), ("roundrobin", b"")]) == Waiting("b")
    assert d.group.protocol_counts == {"range": 2, "roundrobin": 2}
    assert d.join(new_id="c", protocols=[("range", b"")]) == Waiting("c")
    assert d.join(new_id="a2", instance="i-a", protocols=[("range", b"")]) == Waiting("a2")
    assert set(d.group.members) == {"a2", "b", "c"}  # a fenced, its protocols uncounted
    assert d.group.protocol_counts == {"range": 3, "roundrobin": 1}
    assert d.leave(("b", None)) == [E.NONE]
    assert d.group.protocol_counts == {"range": 2}
    key, value = offsets_topic.group_record(d.group)
    record = offsets_topic.decode(key, value)
    assert isinstance(record, offsets_topic.GroupRecord) and record.value is not None
    restored = Driver()
    restored.join(new_id="x", protocols=[("sticky", b"")])  # replaced by the restore
    offsets_topic.restore_group(restored.group, record.value)
    assert restored.group.protocol_counts == protocol_counts(restored.group) == {"range": 2}


def test_a_group_restored_from_the_log_starts_its_sessions() -> None:
    d = Driver()
    d.stable("a", "b")
    key, value = offsets_topic.group_record(d.group)
    record = offsets_topic.decode(key, value)
    assert isinstance(record, offsets_topic.GroupRecord) and record.value is not None
    restored = Driver(now=d.now + 60_000)
    offsets_topic.restore_group(restored.group, record.value)
    assert restored.state() == GroupState.STABLE and restored.timers == {}
    restored.apply(restored.machine.loaded(restored.now))
    assert restored.timers == {Timer(TimerKind.SESSION, m): restored.now + SESSION_MS
                               for m in ("a", "b")}
    restored.advance(SESSION_MS // 2)
    assert restored.heartbeat("a") == E.NONE
    restored.advance(SESSION_MS // 2)
    assert set(restored.group.members) == {"a"}
    assert restored.state() == GroupState.PREPARING_REBALANCE


def test_after_the_initial_delay_the_join_phase_waits_for_pending_members() -> None:
    d = Driver(initial_delay_ms=3_000)
    d.join(new_id="p", require_known=True)  # told to come back with its id
    d.join(new_id="a")
    d.advance(3_000)
    assert d.state() == GroupState.PREPARING_REBALANCE and not d.group.delaying
    assert d.timers[REBALANCE_TIMER] == d.now + REBALANCE_MS
    assert d.join("p") == Waiting("p")
    assert d.state() == GroupState.COMPLETING_REBALANCE and set(d.joins) == {"a", "p"}


def test_leave_of_unknown_members_and_of_a_dead_group() -> None:
    d = Driver()
    d.stable("a")
    assert d.leave(("x", None), ("a", None)) == [E.UNKNOWN_MEMBER_ID, E.NONE]
    d.apply(d.machine.delete())  # Dead while its deletion is written: the whole request
    # is answered COORDINATOR_NOT_AVAILABLE (retried), no member, as Kafka
    assert d.apply(d.machine.leave([("a", None), ("x", "i-x")], d.now)) == \
        LeaveResult(E.COORDINATOR_NOT_AVAILABLE)


def test_a_member_waiting_for_its_assignment_outlives_its_session() -> None:
    d = Driver()
    d.stable("a")
    d.join(new_id="b", session_ms=2_000)
    d.join("a")
    assert d.sync("b") == Waiting("b")
    for _ in range(5):  # the leader heartbeats; b only waits, past its session
        d.advance(2_000)
        assert d.heartbeat("a") == E.NONE
    assert "b" in d.group.members and "b" not in d.syncs
    d.sync("a", assignments={"a": b"A", "b": b"B"})
    d.written()
    assert d.syncs["b"] == SyncResult(E.NONE, "consumer", "range", b"B")
    assert d.timers[Timer(TimerKind.SESSION, "b")] == d.now + 2_000  # its session again
    d.advance(2_000)
    assert "b" not in d.group.members


def test_members_that_never_sync_are_removed_after_the_rebalance_timeout() -> None:
    d = Driver()
    d.stable("a", "b", "c")
    gen = d.group.generation
    for member in ("a", "b", "c"):
        d.join(member, session_ms=REBALANCE_MS * 2)
    assert d.state() == GroupState.COMPLETING_REBALANCE
    assert d.sync("b", gen + 1) == Waiting("b")  # a (the leader) and c never sync
    d.advance(REBALANCE_MS - 1)
    assert d.state() == GroupState.COMPLETING_REBALANCE
    d.advance(1)
    assert set(d.group.members) == {"b"}
    assert d.syncs["b"].error == E.REBALANCE_IN_PROGRESS
    assert d.state() == GroupState.PREPARING_REBALANCE
    d.join("b")
    assert d.joins["b"].generation == gen + 2 and d.joins["b"].leader == "b"


def test_the_sync_bound_covers_followers_after_the_leader_synced() -> None:
    d = Driver()
    d.stable("a")
    d.join(new_id="b", session_ms=REBALANCE_MS * 2)
    d.join("a", session_ms=REBALANCE_MS * 2)
    d.sync("a", assignments={"a": b"A", "b": b"B"})
    d.written()
    assert d.state() == GroupState.STABLE
    assert d.timers[REBALANCE_TIMER] > d.now  # b has not synced yet
    d.advance(REBALANCE_MS)
    assert set(d.group.members) == {"a"}
    assert d.state() == GroupState.PREPARING_REBALANCE


def test_rebalance_timeout_keeps_static_members_that_did_not_rejoin() -> None:
    d = Driver()
    static_pair(d, session_ms=3 * REBALANCE_MS)
    gen = d.group.generation
    d.join(new_id="c")  # a dynamic newcomer; b1 (static) is restarting and silent
    d.join("a1", instance="i-a", session_ms=3 * REBALANCE_MS)
    d.advance(REBALANCE_MS)
    assert set(d.group.members) == {"a1", "b1", "c"}
    assert d.group.static_members == {"i-a": "a1", "i-b": "b1"}
    assert d.state() == GroupState.COMPLETING_REBALANCE
    assert d.joins["a1"].generation == gen + 1 and d.joins["a1"].leader == "a1"
    assert {m for m, _, _ in d.joins["a1"].members} == {"a1", "b1", "c"}


def test_a_static_leader_that_did_not_rejoin_is_replaced_as_leader() -> None:
    d = Driver()
    static_pair(d, session_ms=3 * REBALANCE_MS)
    d.join(new_id="c")
    d.join("b1", instance="i-b", session_ms=3 * REBALANCE_MS)  # a1 (static leader) is silent
    d.advance(REBALANCE_MS)
    assert d.state() == GroupState.COMPLETING_REBALANCE
    assert d.group.leader == "b1" and "a1" in d.group.members
    assert {m for m, _, _ in d.joins["b1"].members} == {"a1", "b1", "c"}
    assert d.joins["c"].leader == "b1"


def test_only_absent_static_members_keep_the_join_phase_open_until_their_sessions_end(
        ) -> None:
    d = Driver()
    static_pair(d, session_ms=3 * REBALANCE_MS)
    gen = d.group.generation
    d.join(new_id="c", session_ms=REBALANCE_MS // 2)  # c gives up: leaves
    d.leave(("c", None))
    d.advance(REBALANCE_MS)  # nobody rejoined: no generation of absent members
    assert d.state() == GroupState.PREPARING_REBALANCE and d.group.generation == gen
    d.advance(2 * REBALANCE_MS)  # their sessions end
    assert d.state() == GroupState.EMPTY and d.group.members == {}


def test_a_static_member_replaced_before_it_synced_still_owes_its_sync() -> None:
    d = Driver()
    d.stable("a")
    d.join(new_id="b1", instance="i-b", session_ms=3 * REBALANCE_MS)
    d.join("a", session_ms=3 * REBALANCE_MS)
    d.sync("a", assignments={"a": b"A", "b1": b"B"})
    d.written()
    assert d.state() == GroupState.STABLE
    d.join(new_id="b2", instance="i-b", session_ms=3 * REBALANCE_MS)  # b1 restarted
    d.written()
    assert d.joins["b2"].error == E.NONE and d.state() == GroupState.STABLE
    d.advance(REBALANCE_MS)  # b2 never synced either
    assert set(d.group.members) == {"a"}
    assert d.state() == GroupState.PREPARING_REBALANCE


def test_a_failed_write_of_an_older_generation_leaves_the_current_one_alone() -> None:
    # As Kafka's storeGroup callback, which acts only while the group is still
    # CompletingRebalance at the generation written: the followers of the next
    # generation are not answered with the old write's error.
    d = Driver()
    d.stable("a")
    d.join(new_id="b")
    d.join("a")
    gen = d.group.generation
    d.sync("b")
    d.sync("a", assignments={"a": b"A", "b": b"B"})
    stale = d.writes.pop()  # generation gen's assignment, in flight
    assert stale == Persist(AssignmentWritten(gen))
    d.join(new_id="c")  # a newcomer: b's sync of generation gen is told to rejoin
    assert d.syncs.pop("b").error == E.REBALANCE_IN_PROGRESS
    d.join("a")
    d.join("b")
    assert d.state() == GroupState.COMPLETING_REBALANCE and d.group.generation == gen + 1
    assert d.sync("b") == Waiting("b") and d.sync("c") == Waiting("c")
    assert stale.followup is not None
    d.apply(d.machine.persisted(stale.followup, E.NOT_COORDINATOR, d.now))
    assert "b" not in d.syncs and "c" not in d.syncs  # still waiting for the leader
    assert d.state() == GroupState.COMPLETING_REBALANCE and d.group.generation == gen + 1
    d.apply(d.machine.persisted(stale.followup, E.NONE, d.now))  # nor when it succeeds
    assert "b" not in d.syncs and d.state() == GroupState.COMPLETING_REBALANCE
    d.sync("a", assignments={"a": b"A", "b": b"B", "c": b"C"})
    d.written()
    assert d.state() == GroupState.STABLE
    assert {m: r.assignment for m, r in d.syncs.items()} == {"a": b"A", "b": b"B", "c": b"C"}


def static_trio(d: Driver) -> None:
    """Static members a1 (instance i-a, the leader) and b1 (i-b), dynamic c, Stable."""
    static_pair(d)
    d.join(new_id="c")
    d.join("a1", instance="i-a")
    d.join("b1", instance="i-b")
    d.sync("b1", instance="i-b")
    d.sync("c")
    d.sync("a1", instance="i-a", assignments={"a1": b"A", "b1": b"B", "c": b"C"})
    d.written()
    assert d.state() == GroupState.STABLE and set(d.group.members) == {"a1", "b1", "c"}


def test_a_static_rejoin_being_written_counts_as_joined_in_a_rebalance() -> None:
    # As Kafka, which registers the JoinGroup of a static member that rejoins a Stable
    # group at once: a rebalance another member starts while the new member id is being
    # written counts it as joined and answers it with the new generation; the write's
    # outcome, once the group has left Stable, answers nothing.
    d = Driver()
    static_trio(d)
    gen = d.group.generation
    assert d.join(new_id="b2", instance="i-b") == Waiting("b2")
    write = d.writes.pop()
    assert write.followup is not None
    assert d.join("c", protocols=[("range", b"other")]) == Waiting("c")  # a rebalance
    assert d.state() == GroupState.PREPARING_REBALANCE  # a1 has not rejoined yet
    d.apply(d.machine.persisted(write.followup, E.NOT_COORDINATOR, d.now))
    assert "b2" not in d.joins and set(d.group.members) == {"a1", "b2", "c"}
    assert d.join("a1", instance="i-a") == Waiting("a1")  # b2 counts as joined
    assert d.state() == GroupState.COMPLETING_REBALANCE and d.group.generation == gen + 1
    assert (d.joins["b2"].error, d.joins["b2"].generation) == (E.NONE, gen + 1)
    assert {m for m, _, _ in d.joins["a1"].members} == {"a1", "b2", "c"}
    # the same with a write that succeeds after the rebalance completed
    d = Driver()
    static_trio(d)
    gen = d.group.generation
    d.join(new_id="b2", instance="i-b")
    write = d.writes.pop()
    assert write.followup is not None
    d.join("a1", instance="i-a")  # the leader rejoins: a rebalance
    d.join("c")
    assert d.state() == GroupState.COMPLETING_REBALANCE
    assert (d.joins["b2"].error, d.joins["b2"].generation) == (E.NONE, gen + 1)
    d.apply(d.machine.persisted(write.followup, E.NONE, d.now))  # not answered twice
    assert d.state() == GroupState.COMPLETING_REBALANCE and d.group.generation == gen + 1


def test_a_static_leader_rejoin_being_written_survives_a_protocol_change() -> None:
    # The static leader rejoins (its new id being written) and the other member rejoins
    # without the group's protocol: the rebalance counts the leader as joined and picks the
    # new protocol; the write settling afterwards does not look the old protocol up in the
    # members' metadata (it raised StopIteration).
    both = [("range", b"r"), ("roundrobin", b"rr")]
    d = Driver()
    d.join(new_id="a1", instance="i-a", protocols=both)
    d.join(new_id="b", protocols=both)
    d.join("a1", instance="i-a", protocols=both)
    d.sync("b")
    d.sync("a1", instance="i-a", assignments={"a1": b"A", "b": b"B"})
    d.written()
    assert d.state() == GroupState.STABLE and d.group.protocol == "range"
    gen = d.group.generation
    assert d.join(new_id="a2", instance="i-a", protocols=both) == Waiting("a2")
    write = d.writes.pop()
    assert write.followup is not None
    assert d.join("b", protocols=[("roundrobin", b"rr")]) == Waiting("b")
    d.apply(d.machine.persisted(write.followup, E.NONE, d.now))
    assert d.state() == GroupState.COMPLETING_REBALANCE and d.group.generation == gen + 1
    assert d.group.protocol == "roundrobin" and d.group.leader == "a2"
    assert d.joins["a2"].generation == d.joins["b"].generation == gen + 1
    assert d.joins["a2"].members == (("b", None, b"rr"), ("a2", "i-a", b"rr"))


def test_txn_commit_checks_as_kafka() -> None:
    # Kafka's validateOffsetCommit (GroupCoordinator.scala, ClassicGroup.java): a request
    # naming a static instance alone is checked too; an Empty group takes a generation
    # below zero from anyone (as OffsetCommit); a Dead group is COORDINATOR_NOT_AVAILABLE.
    d = Driver()
    static_pair(d)
    check = d.machine.txn_commit_check
    assert check("", "i-a", -1) == E.FENCED_INSTANCE_ID  # i-a is a1
    assert check("", "i-x", -1) == E.UNKNOWN_MEMBER_ID
    assert check("a1", "i-a", -1) == E.ILLEGAL_GENERATION
    assert check("a1", "i-a", d.group.generation) == E.NONE
    assert check("", None, -1) == E.NONE  # below v3: no member named
    d.leave(("a1", "i-a"), ("b1", "i-b"))
    assert d.state() == GroupState.EMPTY
    assert check("a1", "i-a", -1) == E.NONE  # a group that only stores offsets
    assert d.apply(d.machine.commit_check("a1", "i-a", -1, d.now)) == E.NONE  # the same
    assert check("a1", None, d.group.generation) == E.UNKNOWN_MEMBER_ID
    d.apply(d.machine.delete())
    assert check("", None, -1) == check("a1", None, 1) == E.COORDINATOR_NOT_AVAILABLE


# -- the group's bounds and running counts ---------------------------------------------------

def test_the_counts_of_members_awaiting_join_and_of_their_bytes_stay_right() -> None:
    """``awaiting_join`` and ``member_bytes`` (checked against what they count after every
    step, by the driver, in every test of this module) across joins, a rejoin with other
    metadata, a leave, a session expiry and a static member's replacement."""
    d = Driver()
    d.stable("a", "b", "c")
    assert d.group.awaiting_join == 0 and not d.group.all_joined()
    d.join(new_id="s1", instance="i-s")  # a rebalance: s1 waits, the others are asked
    assert d.group.awaiting_join == 1 and not d.group.all_joined()
    d.join("a", protocols=[("range", b"longer metadata")])
    d.join("b")
    assert d.group.awaiting_join == 3
    d.leave(("b", None))  # a waiting member leaves: answered, no longer counted
    assert d.group.awaiting_join == 2
    d.advance(SESSION_MS)  # c's session ended: dropped, the join phase over
    assert set(d.group.members) == {"a", "s1"} and d.group.awaiting_join == 0
    d.sync("s1", instance="i-s")
    d.sync("a", assignments={"a": b"A" * 100, "s1": b"S"})
    d.written()
    assert d.state() == GroupState.STABLE
    weight = d.group.member_bytes
    d.join(new_id="s2", instance="i-s")  # replaces s1 without a rebalance, while written
    assert d.group.awaiting_join == 1 and set(d.group.members) == {"a", "s2"}
    assert d.group.member_bytes == weight  # the same ids' lengths, the assignment carried
    d.written()
    assert d.group.awaiting_join == 0
    d.advance(SESSION_MS)  # both sessions end
    assert d.group.members == {} and d.group.member_bytes == 0
    assert d.group.awaiting_join == 0


def test_group_max_size_counts_pending_member_ids() -> None:
    d = Driver(max_size=2)
    assert d.join(new_id="p1", require_known=True) == JoinResult(E.MEMBER_ID_REQUIRED, "p1")
    assert d.join(new_id="p2", require_known=True) == JoinResult(E.MEMBER_ID_REQUIRED, "p2")
    # full of pending ids, even Empty: a third id is refused, with no member id
    assert d.join(new_id="p3", require_known=True) == JoinResult(E.GROUP_MAX_SIZE_REACHED, "")
    assert d.join(new_id="p3") == JoinResult(E.GROUP_MAX_SIZE_REACHED, "")
    assert set(d.group.pending) == {"p1", "p2"}
    # a pending id joining with it adds nobody
    assert d.join("p1", require_known=True) == Waiting("p1")
    d.advance(SESSION_MS)  # p2 lapses: room again
    assert d.group.pending == {}
    assert d.join(new_id="s1", instance="i-s") == Waiting("s1")
    assert d.join(new_id="x") == JoinResult(E.GROUP_MAX_SIZE_REACHED, "")
    # a static member's new id replaces its old one: accepted in a full group
    assert d.join(new_id="s2", instance="i-s") == Waiting("s2")
    assert set(d.group.members) == {"p1", "s2"}


def test_a_join_over_the_metadata_bound_is_refused_and_nothing_kept() -> None:
    d = Driver(metadata_max_bytes=200)
    big = [("range", b"x" * 300)]
    assert d.join(new_id="a", protocols=big) == JoinResult(E.UNKNOWN_SERVER_ERROR, "")
    assert d.group.members == {} and d.timers == {}
    assert d.join(new_id="a", protocols=big, require_known=True) == \
        JoinResult(E.UNKNOWN_SERVER_ERROR, "")
    assert d.group.pending == {}
    d.stable("a")
    # a member rejoining with more than fits keeps what it had, and the group its state
    assert d.join("a", protocols=big) == JoinResult(E.UNKNOWN_SERVER_ERROR, "a")
    assert d.group.members["a"].protocols == RANGE and d.state() == GroupState.STABLE
    # a second member that would take the group over the bound
    assert d.join(new_id="b", protocols=[("range", b"y" * 175)]) == \
        JoinResult(E.UNKNOWN_SERVER_ERROR, "")
    assert d.join(new_id="b") == Waiting("b")


def test_a_group_over_a_lowered_metadata_bound_still_takes_joins_that_do_not_grow_it(
) -> None:
    d = Driver()
    d.stable("a", "b")
    d.metadata_max_bytes = d.group.member_bytes - 1  # lowered since (a restart, say)
    joined = d.join("b")  # a follower with the same metadata: answered, not refused
    assert isinstance(joined, JoinResult) and joined.error == E.NONE
    assert d.join("a", protocols=[("range", b"more metadata")]) == \
        JoinResult(E.UNKNOWN_SERVER_ERROR, "a")
    assert d.join("a") == Waiting("a")  # the leader, unchanged: it rebalances


def test_a_leader_assignment_over_the_metadata_bound_is_refused_as_kafka() -> None:
    """As Kafka's storeGroup failing MESSAGE_TOO_LARGE: the SyncGroups waiting are answered
    UNKNOWN_SERVER_ERROR, nothing is written, and the group rebalances."""
    d = Driver(metadata_max_bytes=300)
    d.stable("a")
    d.join(new_id="b")
    d.join("a")
    assert d.state() == GroupState.COMPLETING_REBALANCE
    d.writes.clear()
    assert d.sync("b") == Waiting("b")
    assert d.sync("a", assignments={"a": b"A" * 200, "b": b"B" * 200}) == Waiting("a")
    assert d.syncs["a"] == d.syncs["b"] == SyncResult(E.UNKNOWN_SERVER_ERROR,
                                                      "consumer", "range")
    assert d.writes == [] and d.state() == GroupState.PREPARING_REBALANCE
    assert all(m.assignment == b"" for m in d.group.members.values())
    # the same group with an assignment that fits goes on
    d.join("a")
    d.join("b")
    d.sync("b")
    d.sync("a", assignments={"a": b"A", "b": b"B"})
    d.written()
    assert d.state() == GroupState.STABLE and d.syncs["b"].assignment == b"B"
