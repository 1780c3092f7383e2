"""The vocabulary between the membership state machine and its driver: the JoinGroup input,
the timers the machine uses, and the effects it asks the driver to carry out.

The machine (:mod:`broker_core.groups.membership`) never waits, sleeps or writes; it
returns effects, and the driver (:mod:`broker_core.groups.coordinator`) answers the
waiting requests, arms the timers and writes the group's record, feeding back what
happened (a timer fired, a write settled) as further inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar

from broker_core.groups.model import JoinResult, Member, SyncResult

_R = TypeVar("_R")


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
    can_skip_assignment: bool = True
    """The request may be told to skip the assignment (JoinGroup v9+, KIP-814)."""


class TimerKind(Enum):
    """The timers of a group."""

    SESSION = "session"
    """A member's session: it ends unless the member is heard from."""
    PENDING = "pending"
    """A member id handed out with MEMBER_ID_REQUIRED lapses unless it joins with it."""
    REBALANCE = "rebalance"
    """The group's one rebalance timer: the initial delay, then the join phase's timeout."""


@dataclass(frozen=True, slots=True)
class Timer:
    """One timer of a group (``member_id`` empty for the rebalance timer)."""

    kind: TimerKind
    member_id: str = ""


REBALANCE_TIMER = Timer(TimerKind.REBALANCE)


@dataclass(frozen=True, slots=True)
class Arm:
    """Make ``timer`` fire at ``at`` (ms, the clock the inputs carry), replacing the time it
    was armed for, if any."""

    timer: Timer
    at: int


@dataclass(frozen=True, slots=True)
class Cancel:
    """``timer`` must not fire."""

    timer: Timer


@dataclass(frozen=True, slots=True)
class AnswerJoin:
    """Answer the waiting JoinGroup of ``member_id``."""

    member_id: str
    result: JoinResult


@dataclass(frozen=True, slots=True)
class AnswerSync:
    """Answer the waiting SyncGroup of ``member_id``."""

    member_id: str
    result: SyncResult


@dataclass(frozen=True, slots=True)
class AssignmentWritten:
    """Report back: the leader's assignment for ``generation`` was written (or not)."""

    generation: int


@dataclass(frozen=True, slots=True)
class StaticRejoinWritten:
    """Report back: a static member's new member id was written (or not)."""

    member_id: str
    replaced: Member
    """The member the new id replaced, as it was: put back if the write fails (as Kafka),
    so memory agrees with the log."""
    old_leader: str | None = None
    """When the member led and its JoinGroup cannot skip the assignment (below v9): the
    leader id it is told (its old member id, as Kafka), so that it acts as a follower."""


Followup = AssignmentWritten | StaticRejoinWritten


@dataclass(frozen=True, slots=True)
class Persist:
    """Write the group's record as it is now. With ``followup``, the request that caused it
    waits for the write to settle and the driver reports the outcome through
    ``GroupMembership.persisted``; without, nothing waits (a failure is only logged)."""

    followup: Followup | None = None


Effect = Arm | Cancel | AnswerJoin | AnswerSync | Persist


@dataclass(frozen=True, slots=True)
class Waiting:
    """The caller is answered later, by an AnswerJoin or AnswerSync for ``member_id``
    (possibly among this very step's effects)."""

    member_id: str


@dataclass(frozen=True, slots=True)
class Step(Generic[_R]):
    """The outcome of one input: the caller's reply and the effects to carry out, in order."""

    reply: _R
    effects: list[Effect]
