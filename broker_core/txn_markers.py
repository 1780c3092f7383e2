"""How the transaction coordinator ends a transaction in the partitions and groups it
touched: a marker written into each partition, the pending offsets of each group settled.

Here when this broker serves the partition (or the group's ``__consumer_offsets``
partition); through its owner otherwise, by a request queued in the shared storage
(``cluster.markers``), which the owner carries out at its fenced epoch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from broker_core.appends import AppendPath
from broker_core.cluster.markers import MarkerRelay
from broker_core.codec.batch_header import read_header
from broker_core.codec.markers import marker_batch
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.groups.coordinator import GroupCoordinator
from broker_core.partition_producers import PartitionProducers
from broker_core.producer_states import ProducerStates
from broker_core.storage import PartitionStore, Storage, StorageError
from broker_core.storage.cluster import MarkerRequest
from broker_core.storage_faults import WriteKind


class TxnMarkers:
    """Marker writes and group offset endings, here or through the partition's owner."""

    def __init__(self, logs: Storage, appends: AppendPath, producers: ProducerStates,
                 groups: GroupCoordinator, serves: Callable[[str, int], int | None],
                 owned: Callable[[tuple[str, int]], bool]) -> None:
        self._logs = logs
        self._appends = appends
        self._producers = producers
        self._groups = groups
        self._serves = serves
        self.relay = MarkerRelay(logs.cluster, logs.feed, owned,
                                 lambda key: self._logs.partition(*key) is not None,
                                 self._write_own_marker, self._end_own_group_txn)

    def start(self) -> None:
        """Carry out the requests other brokers queue for this one (a shared storage)."""
        if self._logs.cluster.shared:
            self.relay.start()

    def write_marker(self, internal: str, index: int, producer_id: int, epoch: int,
                     commit: bool) -> asyncio.Future[None] | None:
        """Write a transaction marker into a partition (through its owner when that is
        another broker); return what to await before the marker counts as written."""
        try:
            if self._logs.cluster.shared and self._logs.partition(internal, index) is not None \
                    and self._serves(internal, index) is None:
                return self.relay.request(
                    MarkerRequest(internal, index, producer_id, epoch, commit))
            return self._write_own_marker(internal, index, producer_id, epoch, commit)
        except (StorageError, OSError) as exc:  # the database is away: tried again later
            raise KafkaApiError(ErrorCode.NOT_COORDINATOR,
                                f"cannot write a marker to {internal}-{index}: {exc}") from None

    async def end_group_txn(self, topic: str, group_id: str, producer_id: int,
                            commit: bool) -> None:
        """End a transaction's pending offsets of a group: here when this broker coordinates
        the group, through the group's coordinator otherwise (NOT_COORDINATOR when the
        database cannot take the request: the transaction coordinator tries again)."""
        partition = self._groups.place(topic, group_id)
        if self._logs.cluster.shared and self._serves(topic, partition) is None:
            await self.relay.request(MarkerRequest(topic, partition, producer_id, -1,
                                                   commit, group_id))
            return
        await self._groups.complete_txn(topic, group_id, producer_id, commit)

    async def _end_own_group_txn(self, topic: str, group_id: str, producer_id: int,
                                 commit: bool) -> bool:
        """The relay's side of :meth:`end_group_txn`, once the group's partition is loaded."""
        if self._groups.serving_error(topic, group_id) != ErrorCode.NONE:
            return False
        await self._groups.complete_txn(topic, group_id, producer_id, commit)
        return True

    def _write_own_marker(self, internal: str, index: int, producer_id: int, epoch: int,
                          commit: bool) -> asyncio.Future[None] | None:
        """Write a marker into a partition this broker owns; return what to await."""
        partition = self._logs.partition(internal, index)
        if partition is None:  # the topic was deleted meanwhile: nothing to mark
            return None
        return self.write_here(MarkerRequest(internal, index, producer_id, epoch, commit),
                               partition, self._producers.get(internal, index, partition),
                               ErrorCode.NOT_COORDINATOR)

    def write_here(self, marker: MarkerRequest, partition: PartitionStore,
                   state: PartitionProducers, code: ErrorCode, coordinator_epoch: int = 0,
                   generation: int | None = None) -> asyncio.Future[None] | None:
        """Append ``marker`` to ``partition`` (its partition, this broker's, whose producer
        state is ``state``) and apply it to that state; return what to await before it
        counts as written. A failed write raises KafkaApiError ``code``; ``generation`` is
        the partition's commit generation ``state`` was judged at (see
        :meth:`AppendPath.append`)."""
        key = (marker.topic, marker.partition)
        now = int(time.time() * 1000)
        batch = marker_batch(marker.producer_id, marker.producer_epoch, marker.commit, now,
                             coordinator_epoch)
        offset, durable = self._appends.append(
            key, partition, batch, read_header(batch), WriteKind.RECORDS, code,
            f"a transaction marker to {key[0]}-{key[1]}", generation)
        state.end_transaction(marker.producer_id, marker.producer_epoch, marker.commit,
                              offset, now)
        return durable
