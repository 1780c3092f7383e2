"""What this broker serves in the cluster, as the request handlers ask it.

The engine's side of ``cluster.service``: joining the cluster; the leader epoch this broker
serves a partition at (:meth:`Leadership.serves`, :meth:`Leadership.leader_error`), which
never waits for the database (a partition that belongs here but is not claimed yet is
claimed in the background, the request gets the retriable answer); the claims a request
that needs its partitions waits for, without holding the event loop
(:meth:`Leadership.ready`); where a client reaches the other brokers on its listener
(:meth:`Leadership.endpoint_of`, :meth:`Leadership.brokers_for`); and what gaining or
losing a partition does to the engine's state: producer state rebuilt at first use, a
coordinator's partition replayed or forgotten, parked fetches answered.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from broker_core import naming
from broker_core.cluster.service import ClusterService
from broker_core.context import Endpoint, RequestContext
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.producer_states import ProducerStates
from broker_core.storage import Storage
from broker_core.storage.cluster import BrokerRecord, TopicPartition
from broker_core.system_topics import StateCoordinator
from broker_core.waiters import AppendWaiters


class Leadership:
    """Leader epochs, endpoints and ownership changes, on the cluster's registry."""

    def __init__(self, broker_id: int, system_namespace: str, logs: Storage,
                 cluster: ClusterService, producers: ProducerStates,
                 waiters: AppendWaiters) -> None:
        self.broker_id = broker_id
        self._system_namespace = system_namespace
        self._logs = logs
        self.cluster = cluster
        self._producers = producers
        self._waiters = waiters
        self.coordinators: Mapping[str, StateCoordinator] = {}
        """The coordinators by the name of the system topic holding their state."""
        cluster.ownership.on_gained(self._gained)
        cluster.ownership.on_lost(self._lost)

    async def join(self, me: BrokerRecord) -> None:
        """Join the cluster as ``me`` (this broker with its listeners) and take this
        broker's share of the partitions (every partition, on a storage of its own)."""
        self.cluster.me = me
        await self.cluster.join()
        self.cluster.start()

    def _coordinator_of(self, internal: str) -> StateCoordinator | None:
        """The coordinator whose state a system topic holds, if it is one."""
        if not naming.in_system_namespace(internal, self._system_namespace):
            return None
        return self.coordinators.get(internal.rsplit("/", 1)[-1])

    def _gained(self, key: TopicPartition, epoch: int) -> None:
        """This broker owns a partition now: its producer state is rebuilt from the log at
        first use, a coordinator replays it (its writes carry ``epoch``: the coordinator
        epoch of its transaction markers)."""
        self._producers.invalidate(*key)
        coordinator = self._coordinator_of(key[0])
        if coordinator is not None:
            coordinator.load_partition(*key, epoch)

    def _lost(self, key: TopicPartition) -> None:
        """Another broker owns a partition now: forget its state; parked fetches answer."""
        self._producers.invalidate(*key)
        coordinator = self._coordinator_of(key[0])
        if coordinator is not None:
            coordinator.unload_partition(*key)
        self._waiters.notify(key)

    def serves(self, internal: str, index: int) -> int | None:
        """The leader epoch this broker serves a partition at, or None (another broker, or
        this one once its claim is done)."""
        epoch = self.cluster.ownership.owned.get((internal, index))
        if epoch is not None:
            return epoch
        topic = self._logs.topic(internal)
        return None if topic is None else self.cluster.acquire(internal, index,
                                                               topic.num_partitions)

    async def ready(self, wanted: Iterable[TopicPartition]) -> None:
        """Before a request that reads or writes ``wanted``: claim the ones that belong here
        and are not claimed yet, waiting (a bounded time) without holding the event loop."""
        missing = [(internal, index) for internal, index in wanted
                   if (internal, index) not in self.cluster.ownership.owned]
        if not missing:
            return
        counts = {internal: topic.num_partitions for internal in {k[0] for k in missing}
                  if (topic := self._logs.topic(internal)) is not None}
        await self.cluster.claimed((internal, index, counts[internal])
                                   for internal, index in missing if internal in counts)

    async def ready_named(self, ctx: RequestContext,
                          topics: Iterable[tuple[str, Iterable[int]]]) -> None:
        """:meth:`ready` for the partitions a request names: (topic name as the client
        knows it, partition indexes). Names that are no valid topic name are left for the
        request to refuse."""
        owned = self.cluster.ownership.owned
        missing: list[TopicPartition] = []
        for name, indexes in topics:
            try:
                internal = naming.to_internal(name, ctx.home)
            except KafkaApiError:
                continue
            missing += [(internal, index) for index in indexes
                        if (internal, index) not in owned]
        if missing:  # the usual case has none: no wait
            await self.ready(missing)

    def leader_error(self, internal: str, index: int, requested_epoch: int) -> ErrorCode:
        """Whether this broker serves the partition at the leader epoch a client names
        (-1: any): NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH (the client's is older),
        UNKNOWN_LEADER_EPOCH (newer), or NONE."""
        epoch = self.serves(internal, index)
        if epoch is None:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if requested_epoch < 0 or requested_epoch == epoch:
            return ErrorCode.NONE
        return ErrorCode.FENCED_LEADER_EPOCH if requested_epoch < epoch \
            else ErrorCode.UNKNOWN_LEADER_EPOCH

    def endpoint_of(self, ctx: RequestContext, broker_id: int) -> Endpoint | None:
        """Where the caller reaches broker ``broker_id``: the address it advertises for the
        listener the caller came in on (None: not live, or no such listener there)."""
        if broker_id == self.broker_id:
            return ctx.advertised
        record = self.cluster.view.live.get(broker_id)
        found = record.listener(ctx.listener) if record is not None else None
        return None if found is None else Endpoint(found.host, found.port)

    def brokers_for(self, ctx: RequestContext) -> list[tuple[BrokerRecord, Endpoint]]:
        """The live brokers the caller can reach on its listener, by id."""
        found = [(record, self.endpoint_of(ctx, record.broker_id))
                 for record in self.cluster.live_brokers()]
        return [(record, endpoint) for record, endpoint in found if endpoint is not None]
