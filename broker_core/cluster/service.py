"""This broker's part in the cluster: its registration, its lease, and the partitions it owns.

``ClusterService`` registers the broker in the storage's registry, renews its lease every
``heartbeat_ms`` and *reconciles*: it reads the live brokers and every partition's owner,
hands the partitions that now belong elsewhere (``placement``) to their broker at once,
claims the ones that belong here and have no live owner, and drops the ones another
broker took. What it owns is kept in ``ownership`` (:mod:`broker_core.cluster.ownership`),
which tells the rest of the broker; the registration and the lease are ``lease``'s
(:mod:`broker_core.cluster.lease`).

A reconcile follows a heartbeat when something it reads changed since the last one: the
heartbeat reads the registry's stamp in the same round trip (``Renewal``), and this
broker's own side (what it owns, its topics' partition counts) is compared too; at least
every ``FULL_RECONCILE_EVERY`` heartbeats it runs anyway. The storage's change feed
(``REGISTRY``: a broker registered or left, a partition changed owner) starts one at
once, at most one per ``_FOLLOW_GAP_S``. The heartbeat itself keeps its pace: it is the
failure detector.

:meth:`leader` is the one answer to "which broker serves this partition" that Metadata,
FindCoordinator, the coordinators and the request checks all use. A partition that nobody
live owns is answered with the broker it belongs to, which claims it on its next
reconcile or as soon as a request needs it (:meth:`acquire` starts the claim, a request
that can wait awaits it: :meth:`claimed`).

Every statement on a shared registry runs in the service's own thread (``worker``), never
on the event loop, and its result is applied on the loop: a database that is slow or stops
answering holds no request that does not need it. Every write to a shared engine carries
the epoch of the claim (``storage.cluster``), so a broker that stalled past its lease
writes nothing after another took over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence

from broker_core.cluster.lease import Lease
from broker_core.cluster.ownership import OwnedPartitions
from broker_core.cluster.placement import preferred
from broker_core.cluster.reconcile import ClusterConfig, Leader, plan_reconcile
from broker_core.cluster.worker import Worker
from broker_core.storage import KeyValueStore, StorageError, TopicInfo
from broker_core.storage.cluster import (
    BrokerRecord,
    ClusterStore,
    ClusterView,
    TopicPartition,
)
from broker_core.storage.feed import NO_FEED, REGISTRY, ChangeFeed
from broker_core.wakeup import Wakeup

__all__ = ["CLAIM_WAIT_S", "FULL_RECONCILE_EVERY", "ClusterConfig", "ClusterService", "Leader"]

log = logging.getLogger(__name__)

_ON_DEMAND_REFRESH_S = 0.1
"""A request for a partition this broker does not own rereads the registry at most this often."""
FULL_RECONCILE_EVERY = 30
"""Heartbeats at most between two reconciles, even when no stamp moved (a safety net)."""
_FOLLOW_GAP_S = 0.1
"""The least time between two reconciles started by the change feed (a burst of changes
is taken in together)."""
CLAIM_WAIT_S = 2.0
"""How long a request waits for the claim of a partition it needs (:meth:`claimed`); past
it (the registry slow or away) it gets the retriable answer of a broker that does not
serve the partition."""


class ClusterService:
    """Membership, ownership and the one ownership function of this broker."""

    def __init__(self, store: ClusterStore, me: BrokerRecord, config: ClusterConfig,
                 topics: Callable[[], Sequence[TopicInfo]], kv: KeyValueStore,
                 feed: ChangeFeed = NO_FEED) -> None:
        self.store = store
        self._feed = feed
        self.pinned_topics: set[str] = set()
        """Topics with a partition per broker: partition ``i`` on the broker holding slot
        ``i`` while it is live (``placement``): the audit topic, which every broker writes."""
        self._holders: dict[int, int] = {}
        """slot -> broker id, as last read."""
        self.me = me
        self.config = config
        self._topics = topics
        self.ownership = OwnedPartitions(store)
        self.view = ClusterView({me.broker_id: me}, {})
        self._live_key: tuple[ClusterView, int] | None = None
        self._live_cached: tuple[int, ...] = ()
        self._viewed_at = 0.0
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._claims_failing = False
        self._joined = False
        self._worker = Worker(f"edge-cluster-{me.broker_id}")
        self.lease = Lease(store, config, kv, self._worker)
        self._busy = asyncio.Lock()
        """Held by whatever reads the registry and acts on it (a reconcile, an on-demand
        claim): their statements and the updates they make never interleave."""
        self._asked: dict[TopicPartition, int] = {}
        """Partitions requests asked for (with their topic's partition count), not claimed
        yet."""
        self._asking: asyncio.Task[None] | None = None
        self._following: asyncio.Task[None] | None = None
        self._reconciled: tuple[str, int, tuple[tuple[str, int], ...]] | None = None
        """The stamps the last reconcile after a heartbeat saw (None: reconcile next)."""
        self._skipped = 0
        """Heartbeats since that reconcile."""

    # -- what the rest of the broker asks ---------------------------------------------

    def registered(self) -> bool:
        """Whether this broker is a member now: it joined, has not begun to leave, and its
        lease was renewed within the session timeout (always true once joined on a
        registry of one broker, which no other broker shares)."""
        if not self._joined or self._stopping.is_set():
            return False
        return self.lease.fresh()

    def live_brokers(self) -> list[BrokerRecord]:
        """The live brokers, by id (this one always among them while it runs)."""
        live = dict(self.view.live)
        live[self.me.broker_id] = self.me
        return [live[b] for b in sorted(live)]

    def _live_ids(self) -> tuple[int, ...]:
        """The live brokers' ids, computed once per registry read (a Metadata answer asks
        for each of 10,000 partitions)."""
        key = (self.view, self.me.broker_id)
        if self._live_key is None or self._live_key[0] is not key[0] \
                or self._live_key[1] != key[1]:
            self._live_key = key
            self._live_cached = tuple(b.broker_id for b in self.live_brokers())
        return self._live_cached

    def _pinned(self, topic: str) -> dict[int, int] | None:
        """slot -> broker id for a pinned topic (this broker at its own slot), else None."""
        if topic not in self.pinned_topics:
            return None
        return {**self._holders, self.lease.slot: self.me.broker_id}

    def controller_id(self) -> int:
        """The broker named as controller: the live broker with the lowest id."""
        return min(b.broker_id for b in self.live_brokers())

    def leader(self, topic: str, partition: int, num_partitions: int) -> Leader | None:
        """Which broker serves ``partition`` of ``topic`` now: this one if it owns it, its
        owner if that owner is live, otherwise the broker it belongs to, at the epoch its
        claim will carry (a shared registry moves the epoch up on every claim: a client
        told the old one would be fenced by the claim it is sent to trigger). While this
        broker's lease has run out (cut off from the registry, it gave its partitions up
        and can claim none), that is one of the others: the one they place it on, as they
        see this broker gone."""
        key = (topic, partition)
        epoch = self.ownership.owned.get(key)
        if epoch is not None:
            return Leader(self.me.broker_id, epoch)
        owner = self.view.owners.get(key)
        if owner is not None and owner.broker_id is not None \
                and owner.broker_id in self.view.live and owner.broker_id != self.me.broker_id:
            return Leader(owner.broker_id, owner.epoch)
        candidates = self._live_ids()
        if not self.lease.fresh():
            candidates = tuple(b for b in candidates if b != self.me.broker_id)
        target = preferred(topic, partition, num_partitions, candidates, self._pinned(topic))
        if target is None:
            return None
        epoch = owner.epoch if owner is not None else 0
        return Leader(target, epoch + 1 if self.store.shared else epoch)

    def acquire(self, topic: str, partition: int, num_partitions: int) -> int | None:
        """The epoch this broker serves the partition at, or None. On a shared registry a
        partition that belongs here (or may: a registry read older than
        ``_ON_DEMAND_REFRESH_S``) and has no live owner is claimed in the background, and
        None is answered meanwhile (a retriable error for the request that asked)."""
        key = (topic, partition)
        epoch = self.ownership.owned.get(key)
        if epoch is not None:
            return epoch
        if not self.store.shared:  # one process: nothing to ask a database
            self._claimed(self.store.claim([key]))
            return self.ownership.owned.get(key)
        self._ask(key, num_partitions)
        return None

    async def claimed(self, wanted: Iterable[tuple[str, int, int]]) -> None:
        """Before a request that needs them: claim the partitions (topic, partition, the
        topic's partition count) that the registry as last read gives to this broker and
        that it does not own yet, waiting at most ``CLAIM_WAIT_S`` (then the request
        answers as a broker that does not serve them)."""
        task = None
        for topic, partition, count in wanted:
            key = (topic, partition)
            if key in self.ownership.owned or not self.store.shared:
                continue
            asked = self._ask(key, count)
            if asked is not None and self._claimable(key, count):  # others: not waited for
                task = asked
        if task is not None:  # neither its end (say, cancelled at shutdown) nor a timeout raise
            await asyncio.wait([task], timeout=CLAIM_WAIT_S)

    def _claimable(self, key: TopicPartition, count: int) -> bool:
        """Whether the registry as last read gives ``key`` to this broker: it belongs here
        and nobody live owns it, or it was handed here."""
        found = self.leader(key[0], key[1], count)
        owner = self.view.owners.get(key)
        handed_here = owner is not None and owner.broker_id == self.me.broker_id
        return found is not None and (found.broker_id == self.me.broker_id or handed_here)

    def _ask(self, key: TopicPartition, count: int) -> asyncio.Task[None] | None:
        """Have ``key`` claimed in the background if it may belong here; the task doing it."""
        if not self._joined or self._stopping.is_set():
            return None
        if not self._claimable(key, count) \
                and time.monotonic() - self._viewed_at < _ON_DEMAND_REFRESH_S:
            return None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop: nothing can run in the background
            return None
        self._asked[key] = count
        if self._asking is None or self._asking.done():
            self._asking = loop.create_task(self._claim_asked())
        return self._asking

    async def _claim_asked(self) -> None:
        """Claim what requests asked for and belongs here, rereading the registry first when
        the last read is older than ``_ON_DEMAND_REFRESH_S``; until nothing is asked."""
        while self._asked and not self._stopping.is_set():
            async with self._busy:
                asked, self._asked = self._asked, {}
                try:
                    if time.monotonic() - self._viewed_at >= _ON_DEMAND_REFRESH_S:
                        await self._read_view()
                    wanted = [key for key, count in asked.items()
                              if key not in self.ownership.owned and self._claimable(key, count)]
                    if wanted:
                        await self._claim(wanted)
                except (StorageError, OSError):
                    self._viewed_at = time.monotonic()  # requests retry; not again at once
                    return
                except Exception:
                    log.exception("claiming partitions asked for failed")
                    return

    # -- life cycle ----------------------------------------------------------------------

    async def join(self) -> None:
        """Register (waiting out the lease of this id's previous process, if it was killed)
        and take this broker's share of the partitions. BrokerIdInUse if the id stays
        taken for longer than a session."""
        await self.lease.register(self.me)
        self._joined = True
        async with self._busy:
            await self._read_view()
            await self._reconcile_with_view()
        if self.store.shared:
            log.info("joined the cluster as broker %d: %d live brokers, %d partitions owned here",
                     self.me.broker_id, len(self.view.live), len(self.ownership.owned))

    def start(self) -> None:
        """Heartbeat and reconcile in the background (a shared registry only), and
        reconcile when the change feed tells of a change of the registry."""
        if self.store.shared:
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._run())
            self._following = loop.create_task(self._follow(Wakeup(self._feed, REGISTRY)))

    async def leave(self) -> None:
        """Stop heartbeating; hand every owned partition to the broker it belongs to among
        the others, and deregister, so that they move at once instead of at lease expiry
        (waiting at most a session for the registry)."""
        self._stopping.set()
        for task in (self._task, self._following, self._asking):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        try:
            if self.store.shared:
                await asyncio.wait_for(self._hand_everything_over(),
                                       self.config.session_timeout_ms / 1000)
        except (StorageError, OSError, TimeoutError) as exc:
            log.warning("could not hand over partitions at shutdown (they move when the "
                        "lease expires): %s", exc or "the registry does not answer")
        finally:
            self._worker.close()

    async def _hand_everything_over(self) -> None:
        await self._read_view()
        others = [b for b in self.view.live if b != self.me.broker_id]
        counts = self._partition_counts()
        moves = {}
        for key in self.ownership.owned:
            target = preferred(key[0], key[1], counts.get(key[0], key[1] + 1), others,
                               self._pinned(key[0]))
            if target is not None:
                moves[key] = target
        given = await self._hand_over(moves)
        self.ownership.lose(list(self.ownership.owned))
        await self._worker.run(self.store.deregister)
        log.info("left the cluster: %d partitions handed over", given)

    async def _run(self) -> None:
        """Start a heartbeat and reconcile every ``heartbeat_ms``; one still under way when
        the next is due means the registry does not answer."""
        interval = self.config.heartbeat_ms / 1000
        tick: asyncio.Task[None] | None = None
        try:
            while not self._stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), interval)
                    return
                if tick is not None and not tick.done():
                    self._unreachable("the registry does not answer")
                    continue
                tick = asyncio.get_running_loop().create_task(self._tick())
        finally:
            if tick is not None:
                tick.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await tick

    async def _tick(self) -> None:
        """One heartbeat, and a reconcile if something changed."""
        try:
            sent = time.monotonic()
            renewal = await self.lease.renew()
            async with self._busy:
                if not renewal.renewed:
                    log.warning("broker %d's lease ran out (paused or cut off): giving up %d "
                                "partitions and registering again", self.me.broker_id,
                                len(self.ownership.owned))
                    self.ownership.lose(list(self.ownership.owned))
                    await self.lease.register_again(self.me)
                self.lease.renewed_at = sent
                stamps = None if renewal.stamp is None or not renewal.renewed else (
                    renewal.stamp, self.ownership.moves,
                    tuple(sorted(self._partition_counts().items())))
                if stamps is not None and stamps == self._reconciled \
                        and self._skipped < FULL_RECONCILE_EVERY:
                    self._skipped += 1
                    return
                self._reconciled, self._skipped = None, 0
                await self._read_view()
                await self._reconcile_with_view()
                self._reconciled = stamps
        except (StorageError, OSError) as exc:
            self._unreachable(exc)
        except Exception:
            log.exception("cluster reconcile failed")

    async def _follow(self, wakeup: Wakeup) -> None:
        """Reconcile when the change feed tells of a change of the registry (the
        heartbeats see the changes it does not tell of)."""
        while not self._stopping.is_set():
            await wakeup.wait(None, None)
            try:
                async with self._busy:
                    await self._read_view()
                    await self._reconcile_with_view()
            except (StorageError, OSError) as exc:  # the heartbeat judges the registry
                log.debug("reconcile on a registry change: %s", exc)
            except Exception:
                log.exception("cluster reconcile failed")
            await asyncio.sleep(_FOLLOW_GAP_S)

    def _unreachable(self, exc: BaseException | str) -> None:
        """The registry cannot be reached: once the lease must have run out, stop serving
        what others may have taken meanwhile."""
        silent_s = time.monotonic() - self.lease.renewed_at
        if self.ownership.owned and silent_s * 1000 > self.config.session_timeout_ms:
            log.warning("registry unreachable for %.1f s (%s): giving up %d partitions",
                        silent_s, exc, len(self.ownership.owned))
            self.ownership.lose(list(self.ownership.owned))

    # -- reconciling ---------------------------------------------------------------------

    async def _read_view(self) -> None:
        view, holders = await self._worker.run(self._registry)
        self.view, self._holders, self._viewed_at = view, holders, time.monotonic()

    def _registry(self) -> tuple[ClusterView, dict[int, int]]:
        """The registry as stored now, and the slot map read with it (in the worker)."""
        return self.store.view(), self.lease.slots.read()

    def _partition_counts(self) -> dict[str, int]:
        return {t.name: t.num_partitions for t in self._topics()}

    async def _reconcile_with_view(self) -> None:
        """On the registry as last read: drop what others took, hand over what belongs
        elsewhere, claim what belongs here."""
        plan = plan_reconcile(self.me.broker_id, self.ownership.owned, self.view,
                              [b.broker_id for b in self.live_brokers()],
                              self._partition_counts(), self._pinned)
        self.ownership.lose(plan.taken)
        if plan.moves:
            await self._hand_over(plan.moves)
        if plan.wanted:
            await self._claim(plan.wanted)

    async def _hand_over(self, moves: dict[TopicPartition, int]) -> int:
        """Give owned partitions to their brokers; return how many were given."""
        held = {key: (self.ownership.owned[key], target) for key, target in moves.items()
                if key in self.ownership.owned}
        self.ownership.lose(list(held))  # stop serving first: nothing is written after this
        given = await self._worker.run(lambda: self.store.hand_over(held))
        if given:
            log.info("handed %d partitions to other brokers", len(given))
        return len(given)

    async def _claim(self, wanted: list[TopicPartition]) -> None:
        """Claim ``wanted`` (one warning per outage when the registry cannot be reached)."""
        try:
            taken = await self._worker.run(lambda: self.store.claim(wanted))
        except (StorageError, OSError) as exc:
            if not self._claims_failing:
                log.warning("cannot claim partitions (e.g. %s-%d) until the registry answers "
                            "again: %s", *wanted[0], exc)
            self._claims_failing = True
            raise
        self._claimed(taken)

    def _claimed(self, taken: dict[TopicPartition, int]) -> None:
        """Serve what was claimed from now on."""
        if self._claims_failing:
            self._claims_failing = False
            log.info("the registry answers again: claiming partitions")
        self.ownership.claimed(taken)
