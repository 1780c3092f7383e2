"""The in-memory state of consumer groups: groups, members and committed offsets.

Plain data, no I/O: :mod:`broker_core.groups.membership` changes the membership fields,
:mod:`broker_core.groups.offsets` the offsets (as Kafka's ``GroupMetadata`` holds both).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from broker_core.errors import ErrorCode

CONSUMER_PROTOCOL = "consumer"
"""The protocol type of Kafka's consumers, whose metadata is a ConsumerProtocolSubscription."""


class GroupState(Enum):
    """Group states of Kafka's classic group protocol, named as DescribeGroups names them."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """One committed offset of a group."""

    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int
    position: int = field(default=-1, compare=False)
    """Where its record is in the group's log, as :meth:`Group.next_position` numbers the
    group's offset records (Kafka compares the records' log offsets): of a plain and a
    transactional offset of one partition, the later record wins."""
    expire_timestamp: int | None = None
    """When it expires (ms), set by a commit with a retention of its own (OffsetCommit
    v2-v4's ``retention_time_ms``, as Kafka keeps it); None: by the broker's retention."""


@dataclass(frozen=True, slots=True)
class TxnFence:
    """What a group keeps of a producer's transaction ends: the highest producer epoch and
    coordinator epoch that ended one of its transactions here (-1: unknown), and when the
    last end was accepted (ms: the end record's own time at a replay, see
    :func:`broker_core.groups.offsets_topic.replay`)."""

    producer_epoch: int = -1
    coordinator_epoch: int = -1
    ended_ms: int = -1


MemberList = tuple[tuple[str, str | None, bytes], ...]
"""What a group's leader learns of each member: id, instance id and protocol metadata."""


@dataclass(frozen=True, slots=True)
class JoinResult:
    """What a JoinGroup call answers."""

    error: ErrorCode
    member_id: str
    generation: int = -1
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str = ""
    members: MemberList = ()
    skip_assignment: bool = False


@dataclass(frozen=True, slots=True)
class SyncResult:
    """What a SyncGroup call answers."""

    error: ErrorCode
    protocol_type: str | None = None
    protocol: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class LeaveResult:
    """What a LeaveGroup call answers: an error for the whole request (then no member is
    answered, as Kafka answers a Dead group COORDINATOR_NOT_AVAILABLE) or one per member."""

    error: ErrorCode
    members: tuple[ErrorCode, ...] = ()


@dataclass(eq=False)
class Member:
    """One member of a group."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    """Changed only by :meth:`Group.set_assignment` while the member is in a group (which
    keeps :attr:`Group.member_bytes`)."""
    joining: bool = False
    """A JoinGroup of the member waits for the rebalance to complete. Changed only by
    :meth:`Group.set_joining` (which keeps :attr:`Group.awaiting_join`)."""
    syncing: bool = False
    """A SyncGroup of the member waits for the leader's assignment."""
    session_deadline: int | None = None
    """When the member's session ends (ms) unless it is heard from; None: not armed."""

    def protocol_names(self) -> list[str]:
        """The member's protocols, most preferred first."""
        return [name for name, _ in self.protocols]

    def metadata_for(self, protocol: str) -> bytes:
        """The member's metadata for ``protocol``."""
        return next(meta for name, meta in self.protocols if name == protocol)

    def record_bytes(self) -> int:
        """What the member weighs in its group's record (:func:`record_bytes`)."""
        return record_bytes(self.member_id, self.group_instance_id, self.client_id,
                            self.client_host, self.protocols, self.assignment)


def record_bytes(member_id: str, group_instance_id: str | None, client_id: str,
                 client_host: str, protocols: list[tuple[str, bytes]],
                 assignment: bytes) -> int:
    """The bytes of a member that its group's record holds, before their encoding: its ids,
    client id and host (characters), its protocols' names and metadata, and its
    assignment. What ``groupMetadataMaxBytes`` bounds for a group's members together
    (:attr:`Group.member_bytes`); the record written is about 4/3 of it (base64) plus a
    few hundred bytes of JSON per member."""
    return (len(member_id) + len(group_instance_id or "") + len(client_id)
            + len(client_host) + sum(len(name) + len(meta) for name, meta in protocols)
            + len(assignment))


_NO_FENCE = TxnFence()


@dataclass(eq=False)
class Group:
    """A consumer group and its committed offsets."""

    group_id: str
    topic: str
    partition: int
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    """Changed only by :meth:`add_member`, :meth:`remove_member`, :meth:`set_protocols`
    and :meth:`clear_members`, which keep :attr:`protocol_counts`, :attr:`member_bytes`
    and :attr:`awaiting_join`."""
    member_bytes: int = 0
    """The members' :meth:`Member.record_bytes` summed: what ``groupMetadataMaxBytes``
    bounds, checked in O(one member) at each JoinGroup and SyncGroup."""
    refused_full: int = 0
    """JoinGroups refused GROUP_MAX_SIZE_REACHED (what their log lines count)."""
    awaiting_join: int = 0
    """How many members have a JoinGroup waiting (:attr:`Member.joining`; Kafka's
    ``numMembersAwaitingJoin``): :meth:`all_joined` in O(1), not O(members)."""
    protocol_counts: dict[str, int] = field(default_factory=dict)
    """How many members support each protocol name (Kafka's GroupMetadata keeps the same
    count, ``supportedProtocols``): a join is checked in O(its protocols), not O(members x
    protocols)."""
    static_members: dict[str, str] = field(default_factory=dict)
    pending: dict[str, int] = field(default_factory=dict)
    """Member ids handed out with MEMBER_ID_REQUIRED, and when each lapses (ms)."""
    offsets: dict[tuple[str, int], CommittedOffset] = field(default_factory=dict)
    """Changed by :meth:`install` (and by deletions)."""
    pending_txn: dict[int, dict[tuple[str, int], CommittedOffset]] = field(default_factory=dict)
    txn_fences: dict[int, TxnFence] = field(default_factory=dict)
    """By producer id, the highest producer epoch and coordinator epoch that ended a
    transaction of the producer here: an end below either is refused
    (:meth:`GroupOffsets.complete_txn`), as a partition refuses a fenced marker. Forgotten
    once it cannot matter any more (:meth:`forget_txn_fences`)."""
    positions: int = 0
    """How many offset records (plain or transactional) of the group were appended, in
    the order of its log partition, or replayed from it: the next one's position."""
    committing: dict[tuple[str, int], int] = field(default_factory=dict)
    """Partitions with an offset commit (plain or transactional) whose write is under way,
    and how many: the group has offsets for expiry's purpose (as Kafka's ``hasOffsets``
    counts pending commits), and expiry leaves these partitions alone (as Kafka skips
    ``pendingOffsetCommits``: a tombstone appended after the commit's record would delete
    on replay the offset the commit is about to acknowledge)."""
    unsettled: list[dict[tuple[str, int], CommittedOffset]] = field(default_factory=list)
    """The offsets of each plain OffsetCommit whose write is under way (the commit's own
    dict, kept once the write settles): a tombstone appended after the commit's record
    takes its partition out of it once it settles (as Kafka's ``removeOffsets`` clears
    ``pendingOffsetCommits``), so memory agrees with the log's order."""
    awaiting_sync: set[str] = field(default_factory=set)
    """Members of the current generation that have not sent their SyncGroup yet (Kafka's
    ``pendingSyncMembers``): those still here when the rebalance timer fires after the
    join phase are removed and the group rebalances."""
    rebalance_deadline: int | None = None
    """When the rebalance timer fires (ms): the end of the initial delay while
    ``delaying``, the join phase's timeout in PreparingRebalance, and after it the bound
    on the members' SyncGroups (while :attr:`awaiting_sync`); None: not armed."""
    initial_delay_ms: int = 0
    delaying: bool = False
    delay_members_before: int = 0
    """How many members the group had when the current initial delay began."""
    state_timestamp: int = 0
    record: tuple[bytes, bytes] | None = None
    """The last group record appended to the log (or replayed from it): what a compaction
    keeps, not the live membership (as Kafka, which writes one only when a generation's
    assignment is stored, when the group empties and at a static member's rejoin, so a
    restart comes back to the last finished generation); None: none written."""

    def all_joined(self) -> bool:
        """Whether every member has a JoinGroup waiting (and none is still pending)."""
        return not self.pending and self.awaiting_join == len(self.members)

    def size(self) -> int:
        """Members and pending member ids: what ``groupMaxSize`` bounds (as Kafka counts
        pending members in ``group.max.size``)."""
        return len(self.members) + len(self.pending)

    def unused(self) -> bool:
        """Whether the group holds nothing and wrote nothing: no member, no pending member
        id, no offsets, transaction fence or group record (created by a join that was
        refused, or whose pending member ids all lapsed): forgetting it loses nothing."""
        return (self.state == GroupState.EMPTY and not self.members and not self.pending
                and not self.has_offsets() and not self.txn_fences and self.record is None
                and self.generation == 0)

    def has_offsets(self) -> bool:
        """Whether the group holds offsets: committed, pending in a transaction, or being
        written (an acknowledged commit must not land in a group expiry dropped)."""
        return bool(self.offsets or self.pending_txn or self.committing)

    def next_position(self) -> int:
        """The position of the group's next offset record (taken as it is appended, or
        replayed)."""
        self.positions += 1
        return self.positions

    def install(self, tp: tuple[str, int], committed: CommittedOffset) -> None:
        """Make ``committed`` the offset of ``tp``, unless the offset there has a later
        record (Kafka's ``olderThan``: a transaction's offset committed after a plain
        OffsetCommit that followed its TxnOffsetCommit leaves the plain one)."""
        current = self.offsets.get(tp)
        if current is None or current.position < committed.position:
            self.offsets[tp] = committed

    def fence_txn(self, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                  ended_ms: int) -> None:
        """Remember that a transaction end of these epochs was accepted for the producer at
        ``ended_ms``."""
        known = self.txn_fences.get(producer_id, _NO_FENCE)
        self.txn_fences[producer_id] = TxnFence(
            max(known.producer_epoch, producer_epoch),
            max(known.coordinator_epoch, coordinator_epoch), max(known.ended_ms, ended_ms))

    def txn_fenced(self, producer_id: int, producer_epoch: int) -> bool:
        """Whether an end of a later producer epoch of the producer was accepted here (-1:
        unknown, not judged): its transaction ended, and what the older epoch sends now is
        a zombie's, whose offsets no end would ever settle."""
        fence = self.txn_fences.get(producer_id)
        return fence is not None and 0 <= producer_epoch < fence.producer_epoch

    def forget_txn_fences(self, now: int, expiration_ms: int) -> int:
        """Forget the fences of the producers with no transactional offsets pending here
        whose last end was accepted more than ``expiration_ms`` (the broker's
        ``transactionalIdExpirationMs``) before ``now``, as a partition forgets an idle
        producer (Kafka's ``removeExpiredProducers``); return how many.

        Safe because a fence only refuses the end sent by a transaction coordinator that
        lost the producer's transactional id before the fenced end was accepted. After
        that long idle here, either the transactional id expired at its coordinator,
        which gives a re-initialised id a new producer id and never hands this one out
        again (:class:`~broker_core.transactions.producer_ids.ProducerIdAllocator`), so
        no transaction of it can have offsets pending here again and a late end settles
        nothing; or the id lived on through transactions that did not touch this group,
        and a stale end would have been in flight for longer than the expiration: the
        bound Kafka's partitions accept as well when they forget a producer's coordinator
        epoch after ``producer.id.expiration.ms``. Every broker that replays the group's
        log reads the same end times (:func:`broker_core.groups.offsets_topic.replay`),
        so it forgets the same fences."""
        doomed = [pid for pid, fence in self.txn_fences.items()
                  if now - fence.ended_ms > expiration_ms and pid not in self.pending_txn]
        for pid in doomed:
            del self.txn_fences[pid]
        return len(doomed)

    def settle_txn(self, producer_id: int, commit: bool, ended_ms: int,
                   producer_epoch: int = -1, coordinator_epoch: int = -1) -> None:
        """A transaction ended at ``ended_ms`` (at these epochs, -1 unknown): its pending
        offsets become committed (those with no later record of their partition), or are
        dropped."""
        self.fence_txn(producer_id, producer_epoch, coordinator_epoch, ended_ms)
        pending = self.pending_txn.pop(producer_id, {})
        if commit:
            for tp, committed in pending.items():
                self.install(tp, committed)

    def everyone(self) -> MemberList:
        """What the leader learns of the members, for the group's protocol."""
        protocol = self.protocol or ""
        return tuple((m.member_id, m.group_instance_id, m.metadata_for(protocol))
                     for m in self.members.values())

    def max_rebalance_timeout_ms(self) -> int:
        """The longest rebalance timeout among the members."""
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def add_member(self, member: Member) -> None:
        """Add ``member`` (in place of one with its id, if any)."""
        self.remove_member(member.member_id)
        self.members[member.member_id] = member
        self._count(member, 1)

    def remove_member(self, member_id: str) -> Member | None:
        """Remove the member ``member_id``; the member (its :attr:`Member.joining` as it
        was, for the caller to answer), or None when there was none."""
        member = self.members.pop(member_id, None)
        self.awaiting_sync.discard(member_id)
        if member is not None:
            self._count(member, -1)
        return member

    def set_protocols(self, member: Member, protocols: list[tuple[str, bytes]]) -> None:
        """A member of the group rejoined with ``protocols``."""
        assert self.members.get(member.member_id) is member
        self._count(member, -1)
        member.protocols = protocols
        self._count(member, 1)

    def set_assignment(self, member: Member, assignment: bytes) -> None:
        """The member's assignment is ``assignment`` now."""
        if self.members.get(member.member_id) is member:
            self.member_bytes += len(assignment) - len(member.assignment)
        member.assignment = assignment

    def set_joining(self, member: Member, joining: bool) -> None:
        """Whether a JoinGroup of the member waits (for a member no longer in the group,
        only its flag changes: :meth:`remove_member` took it out of the count)."""
        if member.joining != joining and self.members.get(member.member_id) is member:
            self.awaiting_join += 1 if joining else -1
        member.joining = joining

    def clear_members(self) -> None:
        """No members any more."""
        self.members.clear()
        self.protocol_counts.clear()
        self.awaiting_sync.clear()
        self.member_bytes = 0
        self.awaiting_join = 0

    def _count(self, member: Member, step: int) -> None:
        self.member_bytes += step * member.record_bytes()
        if member.joining:
            self.awaiting_join += step
        counts = self.protocol_counts
        for name in dict.fromkeys(member.protocol_names()):  # a name listed twice counts once
            left = counts.get(name, 0) + step
            if left:
                counts[name] = left
            else:
                del counts[name]

    def supports(self, protocol_type: str, protocols: list[str]) -> bool:
        """Whether a joiner with these protocols fits the group (one of them is supported
        by every member)."""
        if not self.members:
            return bool(protocols) and bool(protocol_type)
        if protocol_type != self.protocol_type:
            return False
        everyone = len(self.members)
        return any(self.protocol_counts.get(name) == everyone for name in protocols)

    def choose_protocol(self) -> str:
        """The protocol all members support that most members prefer (ties: first listed)."""
        everyone = len(self.members)
        candidates = {name for name, count in self.protocol_counts.items() if count == everyone}
        votes: dict[str, int] = {}
        for member in self.members.values():
            preferred = next(p for p in member.protocol_names() if p in candidates)
            votes[preferred] = votes.get(preferred, 0) + 1
        return max(votes, key=lambda name: votes[name])

    def subscribed_topics(self) -> set[str] | None:
        """Topics the members subscribe to, as their JoinGroup's metadata for the group's
        protocol names them (Kafka's ``subscribedTopics``); None when unknown: not the
        consumer protocol, or a subscription that cannot be read."""
        if self.protocol_type != CONSUMER_PROTOCOL or self.protocol is None or not self.members:
            return None if self.members else set()
        from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription

        topics: set[str] = set()
        for member in self.members.values():
            try:
                subscription = ConsumerProtocolSubscription.decode(
                    member.metadata_for(self.protocol))
            except Exception:  # undecodable metadata: assume nothing is safe to delete
                return None
            topics.update(subscription.topics)
        return topics
