"""This broker's part in the cluster: its registration, its lease, and the partitions it owns.

``ClusterService`` registers the broker in the storage's registry, renews its lease every
``heartbeat_ms`` and, at the same pace, *reconciles*: it reads the live brokers and every
partition's owner, hands the partitions that now belong elsewhere (``placement``) to their
broker at once, claims the ones that belong here and have no live owner, and drops the
ones another broker took. What it owns it tells the engine (``on_gained`` / ``on_lost``),
which loads or forgets producer and coordinator state.

:meth:`leader` is the one answer to "which broker serves this partition" that Metadata,
FindCoordinator, the coordinators and the request checks all use. A partition that nobody
live owns is answered with the broker it belongs to, which claims it on its next
reconcile or at the first request that reaches it (:meth:`acquire`).

Every write to a shared engine carries the epoch of the claim (``storage.cluster``), so a
broker that stalled past its lease writes nothing after another took over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from broker_core.cluster.placement import preferred
from broker_core.cluster.slots import BrokerSlots
from broker_core.storage import KeyValueStore, StorageError, TopicInfo
from broker_core.storage.cluster import (
    BrokerIdInUse,
    BrokerRecord,
    ClusterStore,
    ClusterView,
    TopicPartition,
)

log = logging.getLogger(__name__)

_ON_DEMAND_REFRESH_S = 0.1
"""A request for a partition this broker does not own rereads the registry at most this often."""


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Membership settings (``brokerSessionTimeoutMs``, ``brokerHeartbeatIntervalMs``)."""

    session_timeout_ms: int = 6000
    heartbeat_ms: int = 1000


@dataclass(frozen=True, slots=True)
class Leader:
    """Who serves a partition, at which leader epoch."""

    broker_id: int
    epoch: int


@dataclass
class _Listeners:
    gained: list[Callable[[TopicPartition, int], None]] = field(default_factory=list)
    lost: list[Callable[[TopicPartition], None]] = field(default_factory=list)


class ClusterService:
    """Membership, ownership and the one ownership function of this broker."""

    def __init__(self, store: ClusterStore, me: BrokerRecord, config: ClusterConfig,
                 topics: Callable[[], Sequence[TopicInfo]], kv: KeyValueStore) -> None:
        self.store = store
        self.pinned_topics: set[str] = set()
        """Topics with a partition per broker: partition ``i`` on the broker holding slot
        ``i`` while it is live (``placement``): the audit topic, which every broker writes."""
        self._slots = BrokerSlots(kv)
        self.slot = 0
        """This broker's slot (``slots``), taken when it registers: its partition of a
        pinned topic."""
        self._holders: dict[int, int] = {}
        """slot -> broker id, as last read."""
        self.me = me
        self.config = config
        self._topics = topics
        self.owned: dict[TopicPartition, int] = {}
        """Partitions this broker writes, with the epoch of its claim."""
        self.view = ClusterView({me.broker_id: me}, {})
        self._viewed_at = 0.0
        self._renewed_at = 0.0
        self._listeners = _Listeners()
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._claims_failing = False

    # -- what the rest of the broker asks ---------------------------------------------

    def on_gained(self, callback: Callable[[TopicPartition, int], None]) -> None:
        """Call ``callback(partition, epoch)`` for each partition this broker takes."""
        self._listeners.gained.append(callback)

    def on_lost(self, callback: Callable[[TopicPartition], None]) -> None:
        """Call ``callback(partition)`` for each partition this broker gives up."""
        self._listeners.lost.append(callback)

    def live_brokers(self) -> list[BrokerRecord]:
        """The live brokers, by id (this one always among them while it runs)."""
        live = dict(self.view.live)
        live[self.me.broker_id] = self.me
        return [live[b] for b in sorted(live)]

    def _pinned(self, topic: str) -> dict[int, int] | None:
        """slot -> broker id for a pinned topic (this broker at its own slot), else None."""
        if topic not in self.pinned_topics:
            return None
        return {**self._holders, self.slot: self.me.broker_id}

    def controller_id(self) -> int:
        """The broker named as controller: the live broker with the lowest id."""
        return min(b.broker_id for b in self.live_brokers())

    def leader(self, topic: str, partition: int, num_partitions: int) -> Leader | None:
        """Which broker serves ``partition`` of ``topic`` now: this one if it owns it, its
        owner if that owner is live, otherwise the broker it belongs to."""
        key = (topic, partition)
        epoch = self.owned.get(key)
        if epoch is not None:
            return Leader(self.me.broker_id, epoch)
        owner = self.view.owners.get(key)
        if owner is not None and owner.broker_id is not None \
                and owner.broker_id in self.view.live and owner.broker_id != self.me.broker_id:
            return Leader(owner.broker_id, owner.epoch)
        target = preferred(topic, partition, num_partitions,
                           [b.broker_id for b in self.live_brokers()], self._pinned(topic))
        return None if target is None else Leader(target, owner.epoch if owner else 0)

    def acquire(self, topic: str, partition: int, num_partitions: int) -> int | None:
        """The epoch this broker serves the partition at, claiming it first when it belongs
        here and has no live owner; None when another broker serves it."""
        key = (topic, partition)
        epoch = self.owned.get(key)
        if epoch is not None:
            return epoch
        if time.monotonic() - self._viewed_at >= _ON_DEMAND_REFRESH_S:
            try:
                self._read_view()
            except (StorageError, OSError):
                self._viewed_at = time.monotonic()  # not again at once: the loop would stall
                if self._claims_failing:
                    return None
        found = self.leader(topic, partition, num_partitions)
        owner = self.view.owners.get(key)
        handed_here = owner is not None and owner.broker_id == self.me.broker_id
        if found is None or (found.broker_id != self.me.broker_id and not handed_here):
            return None
        try:
            self._claim([key])
        except (StorageError, OSError) as exc:
            if not self._claims_failing:  # once per outage
                log.warning("cannot claim partitions (e.g. %s-%d) until the registry answers "
                            "again: %s", topic, partition, exc)
            self._claims_failing = True
        return self.owned.get(key)

    # -- life cycle ----------------------------------------------------------------------

    async def join(self) -> None:
        """Register (waiting out the lease of this id's previous process, if it was killed)
        and take this broker's share of the partitions. BrokerIdInUse if the id stays
        taken for longer than a session."""
        deadline = time.monotonic() + self.config.session_timeout_ms / 1000 + 1
        announced = False
        while True:
            try:
                self._register()
                break
            except BrokerIdInUse as exc:
                if time.monotonic() >= deadline:
                    raise
                if not announced:
                    log.info("waiting for the previous registration of broker %d to expire: %s",
                             self.me.broker_id, exc)
                    announced = True
                await asyncio.sleep(self.config.heartbeat_ms / 1000)
        self._renewed_at = time.monotonic()
        self.reconcile()
        if self.store.shared:
            log.info("joined the cluster as broker %d: %d live brokers, %d partitions owned here",
                     self.me.broker_id, len(self.view.live), len(self.owned))

    def start(self) -> None:
        """Heartbeat and reconcile in the background (a shared registry only)."""
        if self.store.shared:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def leave(self) -> None:
        """Stop heartbeating; hand every owned partition to the broker it belongs to among
        the others, and deregister, so that they move at once instead of at lease expiry."""
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if not self.store.shared:
            return
        try:
            self._read_view()
            others = [b for b in self.view.live if b != self.me.broker_id]
            counts = self._partition_counts()
            moves = {}
            for key in self.owned:
                target = preferred(key[0], key[1], counts.get(key[0], key[1] + 1), others,
                                   self._pinned(key[0]))
                if target is not None:
                    moves[key] = target
            given = self._hand_over(moves)
            self._lose(list(self.owned))
            self.store.deregister()
            log.info("left the cluster: %d partitions handed over", given)
        except (StorageError, OSError) as exc:
            log.warning("could not hand over partitions at shutdown (they move when the "
                        "lease expires): %s", exc)

    async def _run(self) -> None:
        interval = self.config.heartbeat_ms / 1000
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), interval)
                return
            try:
                await self._tick_off_loop()
            except (StorageError, OSError) as exc:
                self._unreachable(exc)
            except Exception:
                log.exception("cluster reconcile failed")

    async def _tick_off_loop(self) -> None:
        """One heartbeat and one reconcile, the regular statements (the heartbeat, the
        registry read) in a worker thread: a database that stops answering does not hold
        the event loop for them. Claims and hand-overs, which change what this broker
        serves, stay on it."""
        self._renewed(await asyncio.to_thread(self.store.heartbeat,
                                              self.config.session_timeout_ms))
        view = await asyncio.to_thread(self._registry)
        self.view, self._viewed_at = view, time.monotonic()
        self._reconcile_with_view()

    def _renewed(self, renewed: bool) -> None:
        """After a heartbeat: a lease that had run out gives up everything and registers
        again."""
        if not renewed:
            log.warning("broker %d's lease ran out (paused or cut off): giving up %d "
                        "partitions and registering again", self.me.broker_id, len(self.owned))
            self._lose(list(self.owned))
            self._register()
        self._renewed_at = time.monotonic()

    def _unreachable(self, exc: BaseException) -> None:
        """The registry cannot be reached: once the lease must have run out, stop serving
        what others may have taken meanwhile."""
        silent_s = time.monotonic() - self._renewed_at
        if self.owned and silent_s * 1000 > self.config.session_timeout_ms:
            log.warning("registry unreachable for %.1f s (%s): giving up %d partitions",
                        silent_s, exc, len(self.owned))
            self._lose(list(self.owned))

    # -- reconciling ---------------------------------------------------------------------

    def _read_view(self) -> None:
        self.view = self._registry()
        self._viewed_at = time.monotonic()

    def _registry(self) -> ClusterView:
        """The registry as stored now, the slot map read with it."""
        view = self.store.view()
        self._holders = self._slots.read()
        return view

    def _register(self) -> None:
        """Register with a fresh lease and take this broker's slot among the brokers live
        now (after a lease that ran out, its old slot may have gone to another broker)."""
        self.store.register(self.me, self.config.session_timeout_ms)
        self.slot = self._slots.take(self.me.broker_id, list(self.store.view().live))

    def _partition_counts(self) -> dict[str, int]:
        return {t.name: t.num_partitions for t in self._topics()}

    def reconcile(self) -> None:
        """Drop what others took, hand over what belongs elsewhere, claim what belongs here."""
        self._read_view()
        self._reconcile_with_view()

    def _reconcile_with_view(self) -> None:
        """:meth:`reconcile` on the registry as last read."""
        me = self.me.broker_id
        owners = self.view.owners
        # another broker's claim moved the epoch past ours; a registry read older than
        # a claim of ours (from a request meanwhile) shows a lower epoch: not taken
        taken = [key for key, epoch in self.owned.items()
                 if (found := owners.get(key)) is not None and (
                     found.epoch > epoch or (found.epoch == epoch and found.broker_id != me))]
        self._lose(taken)
        live = [b.broker_id for b in self.live_brokers()]
        counts = self._partition_counts()
        moves: dict[TopicPartition, int] = {}
        wanted: list[TopicPartition] = []
        for key, owner in owners.items():
            count = counts.get(key[0])
            if count is None:
                continue
            target = preferred(key[0], key[1], count, live, self._pinned(key[0]))
            if key in self.owned:
                if target is not None and target != me:
                    moves[key] = target
            elif owner.broker_id == me or (target == me and (
                    owner.broker_id is None or owner.broker_id not in self.view.live)):
                wanted.append(key)
        if moves:
            self._hand_over(moves)
        if wanted:
            self._claim(wanted)

    def _hand_over(self, moves: dict[TopicPartition, int]) -> int:
        """Give owned partitions to their brokers; return how many were given."""
        held = {key: (self.owned[key], target) for key, target in moves.items()
                if key in self.owned}
        self._lose(list(held))  # stop serving first: nothing is written after this
        given = self.store.hand_over(held)
        if given:
            log.info("handed %d partitions to other brokers", len(given))
        return len(given)

    def _claim(self, wanted: list[TopicPartition]) -> None:
        taken = self.store.claim(wanted)
        if self._claims_failing:
            self._claims_failing = False
            log.info("the registry answers again: claiming partitions")
        for key, epoch in sorted(taken.items()):
            self.owned[key] = epoch
            for gained in self._listeners.gained:
                gained(key, epoch)
        if taken and self.store.shared:
            log.info("took %d partitions (e.g. %s-%d at epoch %d)", len(taken),
                     *min(taken), taken[min(taken)])

    def forget_topic(self, topic: str) -> None:
        """A topic was deleted: its partitions are owned by nobody any more."""
        self._lose([key for key in self.owned if key[0] == topic])

    def _lose(self, keys: list[TopicPartition]) -> None:
        if not keys:
            return
        self.store.drop(keys)
        for key in keys:
            if self.owned.pop(key, None) is not None:
                for lost in self._listeners.lost:
                    lost(key)
