"""The registry a cluster shares, as the storage engine keeps it: brokers and partition owners.

A broker registers (its id, rack and the addresses of its listeners) with a lease that it
renews by heartbeat; a broker whose lease ran out is dead. Every partition has at most one
owner, recorded with an **epoch** (the fencing token) that grows on every change of owner.
A shared engine (PostgreSQL) keeps these where every broker sees them and checks the epoch
in the same transaction as each write to a partition, so a broker that lost a partition
(paused, cut off) can never write to it again. A single-process engine (files, memory) has
one broker, which owns every partition at epoch 0 (:class:`SoloCluster`).

Liveness is judged by the database's clock, never by the brokers' clocks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .errors import StorageError

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class ListenerAddress:
    """One listener of a broker: the address clients are told (advertised) and the one it
    binds (where a proxy in front of it forwards)."""

    name: str
    security_protocol: str
    host: str
    port: int
    bind_host: str
    bind_port: int


@dataclass(frozen=True, slots=True)
class BrokerRecord:
    """A registered broker."""

    broker_id: int
    rack: str | None
    listeners: tuple[ListenerAddress, ...]

    def listener(self, name: str) -> ListenerAddress | None:
        """The broker's listener called ``name``, if it has one."""
        return next((found for found in self.listeners if found.name == name), None)


@dataclass(frozen=True, slots=True)
class PartitionOwner:
    """Who owns a partition (None: nobody yet) and the epoch of that ownership."""

    broker_id: int | None
    epoch: int


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The live brokers (by id) and every partition's owner, read in one snapshot."""

    live: Mapping[int, BrokerRecord]
    owners: Mapping[TopicPartition, PartitionOwner]


@dataclass(frozen=True, slots=True)
class MarkerRequest:
    """A transaction coordinator's request that a partition's owner write a marker or, with
    ``group_id``, that the owner of a ``__consumer_offsets`` partition end the transaction's
    pending offsets of that group."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    commit: bool
    group_id: str | None = None
    coordinator_epoch: int = -1
    """The epoch of the coordinator's claim on the transactional id's state partition:
    the partition (or group) refuses a request that a later coordinator epoch fenced. -1:
    unknown (a request queued by a broker from before it was carried), not judged."""


@dataclass(frozen=True, slots=True)
class Renewal:
    """What a heartbeat tells: whether the lease was renewed, and a stamp of the registry
    read with it (the live brokers, every partition's owner and epoch, the topic and
    key-value change counters): an equal stamp means nothing a reconcile reads changed in
    between. None when the engine has no such stamp (then compare nothing). With it, what
    the other brokers publish of their connections (the tenant quota ``max_connections``
    counts a tenant's connections on every broker)."""

    renewed: bool
    stamp: str | None = None
    elsewhere: Mapping[str, int] = field(default_factory=dict)
    """The live connections per tenant the other live brokers published with their
    latest heartbeats, summed (empty on a single-process engine)."""


class BrokerIdInUse(StorageError):
    """Another live process is registered under this broker id."""


class NotOwner(StorageError):
    """This broker does not own the partition (any more): the write is refused."""


class ClusterStore(Protocol):
    """Membership and ownership in the engine; every call is one short transaction."""

    @property
    def shared(self) -> bool:
        """Whether other brokers may share the storage (ownership matters)."""
        ...

    def begin(self) -> None:
        """A broker runs on this storage: from now on only the partitions it claimed are
        written (a tool or a test that never calls this writes unfenced)."""
        ...

    def register(self, me: BrokerRecord, session_timeout_ms: int) -> None:
        """Register this broker with a fresh lease; BrokerIdInUse while another live
        process holds the id."""
        ...

    def heartbeat(self, session_timeout_ms: int,
                  connections: Mapping[str, int] | None = None,
                  silence_ms: int | None = None) -> Renewal:
        """Renew the lease (not renewed when it had run out: this broker was declared dead
        and must give up what it owned, then register again) and publish ``connections``,
        this broker's live connections per tenant; the registry's stamp and the other
        brokers' published connections, read in the same round trip. ``silence_ms``: when
        the registry heard no heartbeat of any broker for that long (it was away, not the
        brokers), the leases that ran out during that silence are renewed first, this
        broker's among them (None: never)."""
        ...

    def reserve_connection(self, tenant: str, count: int, cap: int) -> bool:
        """Publish ``count`` as this broker's connections of ``tenant`` (with one it is
        about to admit) if, with the other live brokers' published connections of the
        tenant, that stays within ``cap``; atomic against every broker's reservation for
        the tenant. Whether it was published (False: the connection is refused)."""
        ...

    def deregister(self) -> None:
        """Leave the cluster now (a clean shutdown)."""
        ...

    def view(self) -> ClusterView:
        """The live brokers and every partition's owner."""
        ...

    def claim(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Take the partitions that nobody live owns (or that were handed to this broker),
        each at a new epoch, their state read afresh; return the ones taken and their
        epochs. Nothing is taken while this broker's own lease has run out."""
        ...

    def hand_over(self, moves: Mapping[TopicPartition, tuple[int, int]]
                  ) -> list[TopicPartition]:
        """Give partitions this broker owned (and no longer writes: :meth:`drop` first) to
        other brokers: partition -> (the epoch it was owned at, broker id). Each moves at a
        new epoch unless its owner changed meanwhile; return the ones given."""
        ...

    def drop(self, partitions: Iterable[TopicPartition]) -> None:
        """Stop writing to the partitions (ownership was lost); nothing is stored."""
        ...

    def request_markers(self, requests: Sequence[MarkerRequest]) -> list[int]:
        """Queue marker writes for the partitions' owners; return their request ids."""
        ...

    def pending_markers(self) -> list[tuple[int, MarkerRequest]]:
        """Every queued marker write, oldest first."""
        ...

    def markers_done(self, ids: Sequence[int]) -> None:
        """Remove queued marker writes (written, or their partition is gone)."""
        ...

    def markers_left(self, ids: Sequence[int]) -> set[int]:
        """Which of ``ids`` are still queued."""
        ...


class SoloCluster:
    """The registry of a single-process engine: this broker, owner of everything at epoch 0."""

    def __init__(self, partitions: Callable[[], Sequence[TopicPartition]]) -> None:
        self._partitions = partitions
        self._me: BrokerRecord | None = None
        self._markers: dict[int, MarkerRequest] = {}
        self._next_marker = 1

    @property
    def shared(self) -> bool:
        return False

    def begin(self) -> None:
        """Nothing to fence: one process owns this storage."""

    def register(self, me: BrokerRecord, session_timeout_ms: int) -> None:
        self._me = me

    def heartbeat(self, session_timeout_ms: int,
                  connections: Mapping[str, int] | None = None,
                  silence_ms: int | None = None) -> Renewal:
        return Renewal(True)

    def reserve_connection(self, tenant: str, count: int, cap: int) -> bool:
        return count <= cap  # the one broker: its own count is all there is

    def deregister(self) -> None:
        self._me = None

    def view(self) -> ClusterView:
        if self._me is None:
            return ClusterView({}, {})
        me = self._me.broker_id
        return ClusterView({me: self._me},
                           {tp: PartitionOwner(me, 0) for tp in self._partitions()})

    def claim(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: 0 for tp in partitions} if self._me is not None else {}

    def hand_over(self, moves: Mapping[TopicPartition, tuple[int, int]]
                  ) -> list[TopicPartition]:
        del moves
        return []

    def drop(self, partitions: Iterable[TopicPartition]) -> None:
        del partitions

    def request_markers(self, requests: Sequence[MarkerRequest]) -> list[int]:
        first = self._next_marker
        self._next_marker += len(requests)
        self._markers.update(zip(range(first, self._next_marker), requests, strict=True))
        return list(range(first, self._next_marker))

    def pending_markers(self) -> list[tuple[int, MarkerRequest]]:
        return sorted(self._markers.items())

    def markers_done(self, ids: Sequence[int]) -> None:
        for marker in ids:
            self._markers.pop(marker, None)

    def markers_left(self, ids: Sequence[int]) -> set[int]:
        return {marker for marker in ids if marker in self._markers}
