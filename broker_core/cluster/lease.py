"""This broker's registration in the cluster's registry and its lease.

:class:`Lease` registers the broker (waiting out the lease of a previous process of the
same id) and takes its slot (``slots``); each heartbeat of the cluster service renews the
lease (:meth:`Lease.renew`), which also publishes this broker's live connections per
tenant (``connections``, set by the edge) and reads the other live brokers'
(``elsewhere``). A login of a tenant with a ``max_connections`` publishes its count at
once, under a lock per tenant in the registry (:meth:`Lease.reserve_connection`), so that
the cap holds over the cluster even for logins arriving on several brokers at the same
moment. Statements run in the cluster service's thread (``worker``), never on the loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from broker_core.cluster.reconcile import ClusterConfig
from broker_core.cluster.slots import BrokerSlots
from broker_core.cluster.worker import Worker
from broker_core.storage import KeyValueStore
from broker_core.storage.cluster import BrokerIdInUse, BrokerRecord, ClusterStore, Renewal

log = logging.getLogger(__name__)


class Lease:
    """This broker's registration, slot and lease, and the connection counts published
    with it."""

    def __init__(self, store: ClusterStore, config: ClusterConfig, kv: KeyValueStore,
                 worker: Worker) -> None:
        self.store = store
        self.config = config
        self._worker = worker
        self.slots = BrokerSlots(kv)
        self.slot = 0
        """This broker's slot (``slots``), taken when it registers: its partition of a
        pinned topic."""
        self.renewed_at = 0.0
        """When the lease was last renewed (``time.monotonic``: when the renewal was sent)."""
        self.connections: Callable[[], Mapping[str, int]] = dict
        """This broker's live connections per tenant, published with each heartbeat (the
        edge sets it)."""
        self.elsewhere: Mapping[str, int] = {}
        """The other live brokers' connections per tenant, as of their latest heartbeats
        (read with this broker's last one)."""

    async def reserve_connection(self, tenant: str, count: int, cap: int) -> bool:
        """Whether this broker may hold ``count`` connections of ``tenant`` (one more than
        it admitted) under a ``max_connections`` of ``cap`` over the whole cluster; on a
        shared registry published at once (``ClusterStore.reserve_connection``), in the
        service's thread after the heartbeats submitted before it, so that no heartbeat
        publishes a count older than the reservation after it. StorageError or OSError
        when the registry cannot be reached."""
        if not self.store.shared:
            return count <= cap
        return await self._worker.run(
            lambda: self.store.reserve_connection(tenant, count, cap))

    def fresh(self) -> bool:
        """Whether the lease was renewed within the session timeout (always true on a
        registry of one broker, which no other broker shares)."""
        if not self.store.shared:
            return True
        return (time.monotonic() - self.renewed_at) * 1000 <= self.config.session_timeout_ms

    async def register(self, me: BrokerRecord) -> None:
        """Register as ``me`` (waiting out the lease of this id's previous process, if it
        was killed) and take a slot. BrokerIdInUse if the id stays taken for longer than a
        session."""
        deadline = time.monotonic() + self.config.session_timeout_ms / 1000 + 1
        announced = False
        while True:
            try:
                self.slot = await self._worker.run(lambda: self._register(me))
                break
            except BrokerIdInUse as exc:
                if time.monotonic() >= deadline:
                    raise
                if not announced:
                    log.info("waiting for the previous registration of broker %d to expire: %s",
                             me.broker_id, exc)
                    announced = True
                await asyncio.sleep(self.config.heartbeat_ms / 1000)
        self.renewed_at = time.monotonic()

    async def register_again(self, me: BrokerRecord) -> None:
        """Register as ``me`` again after the lease ran out (the slot may change)."""
        self.slot = await self._worker.run(lambda: self._register(me))

    async def renew(self) -> Renewal:
        """Renew the lease, publishing ``connections`` (read here, on the event loop) and
        reading ``elsewhere``."""
        connections = dict(self.connections())
        renewal = await self._worker.run(lambda: self._heartbeat(connections))
        self.elsewhere = renewal.elsewhere
        return renewal

    def _heartbeat(self, connections: Mapping[str, int]) -> Renewal:
        return self.store.heartbeat(self.config.session_timeout_ms, connections,
                                    self.config.silence_ms)

    def _register(self, me: BrokerRecord) -> int:
        """Register with a fresh lease and take this broker's slot among the brokers live
        now (after a lease that ran out, its old slot may have gone to another broker);
        return the slot (in the worker: the caller keeps it, on the event loop)."""
        self.store.register(me, self.config.session_timeout_ms)
        return self.slots.take(me.broker_id, list(self.store.view().live))
