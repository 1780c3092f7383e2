"""What a reconcile does, decided on the registry as last read (no I/O): which owned
partitions another broker took, which owned ones now belong elsewhere (``placement``),
and which to claim. :class:`~broker_core.cluster.service.ClusterService` acts on it.

Also the plain values of membership: the service's settings (:class:`ClusterConfig`) and
its answer to "who serves this partition" (:class:`Leader`); both are importable from
:mod:`broker_core.cluster.service` too."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from broker_core.cluster.placement import preferred
from broker_core.storage.cluster import ClusterView, TopicPartition


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Membership settings (``brokerSessionTimeoutMs``, ``brokerHeartbeatIntervalMs``)."""

    session_timeout_ms: int = 6000
    heartbeat_ms: int = 1000

    @property
    def silence_ms(self) -> int:
        """No heartbeat from any broker reached the registry for this long: the registry
        itself was away (the database stopped, failed over or cut off), not the brokers,
        so the leases that ran out meanwhile are renewed, not judged dead (as a new Kafka
        controller gives every broker a fresh session). Half a session, and well above a
        heartbeat interval, which is the registry's usual silence while any broker runs."""
        return max(self.session_timeout_ms // 2, 3 * self.heartbeat_ms)


@dataclass(frozen=True, slots=True)
class Leader:
    """Who serves a partition, at which leader epoch."""

    broker_id: int
    epoch: int


@dataclass
class ReconcilePlan:
    """The three outcomes of one reconcile."""

    taken: list[TopicPartition] = field(default_factory=list)
    """Owned partitions another broker's claim took: stop serving them."""
    moves: dict[TopicPartition, int] = field(default_factory=dict)
    """Owned partitions that belong to another live broker now, with that broker."""
    wanted: list[TopicPartition] = field(default_factory=list)
    """Partitions to claim: ours by record, or ours by placement with no live owner."""


def plan_reconcile(me: int, owned: Mapping[TopicPartition, int], view: ClusterView,
                   live: Sequence[int], counts: Mapping[str, int],
                   pinned: Callable[[str], dict[int, int] | None]) -> ReconcilePlan:
    """The plan for broker ``me`` owning ``owned`` (with its claim epochs), given ``view``,
    the ``live`` broker ids (``me`` among them), each topic's partition count and the slot
    map of pinned topics (``pinned``)."""
    owners = view.owners
    # another broker's claim moved the epoch past ours; a registry read older than
    # a claim of ours (from a request meanwhile) shows a lower epoch: not taken
    plan = ReconcilePlan(taken=[
        key for key, epoch in owned.items()
        if (found := owners.get(key)) is not None and (
            found.epoch > epoch or (found.epoch == epoch and found.broker_id != me))])
    still_owned = set(owned) - set(plan.taken)
    for key, owner in owners.items():
        count = counts.get(key[0])
        if count is None:
            continue
        target = preferred(key[0], key[1], count, live, pinned(key[0]))
        if key in still_owned:
            if target is not None and target != me:
                plan.moves[key] = target
        elif owner.broker_id == me or (target == me and (
                owner.broker_id is None or owner.broker_id not in view.live)):
            plan.wanted.append(key)
    return plan
