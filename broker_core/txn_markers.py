"""How the transaction coordinator ends a transaction in the partitions and groups it
touched: a marker written into each partition, the pending offsets of each group settled.

Here when this broker serves the partition (or the group's ``__consumer_offsets``
partition); through its owner otherwise, by a request queued in the shared storage
(``cluster.markers``), which the owner carries out at its fenced epoch.

Every request carries the coordinator epoch (the epoch of the coordinator's claim on the
``__transaction_state`` partition holding the transactional id) and the producer epoch;
the partition, or the group, refuses one that a later coordinator or producer epoch
fenced (:meth:`PartitionProducers.check_marker`, :meth:`GroupOffsets.complete_txn`), so a
coordinator that lost the id cannot end the producer's next transaction.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace

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

    def write_marker(self, marker: MarkerRequest) -> asyncio.Future[None] | None:
        """Write a transaction marker into a partition (through its owner when that is
        another broker); return what to await before the marker counts as written
        (KafkaApiError: refused here, nothing written)."""
        internal, index = marker.topic, marker.partition
        try:
            if self._logs.cluster.shared and self._logs.partition(internal, index) is not None \
                    and self._serves(internal, index) is None:
                return self.relay.request(marker)
            return self._write_own_marker(marker)
        except (StorageError, OSError) as exc:  # the database is away: tried again later
            raise KafkaApiError(ErrorCode.NOT_COORDINATOR,
                                f"cannot write a marker to {internal}-{index}: {exc}") from None

    async def end_group_txn(self, marker: MarkerRequest) -> None:
        """End a transaction's pending offsets of a group (``marker.group_id``, its
        ``topic``; the partition is found here): here when this broker coordinates the
        group, through the group's coordinator otherwise (NOT_COORDINATOR when the
        database cannot take the request: the transaction coordinator tries again)."""
        assert marker.group_id is not None
        partition = self._groups.place(marker.topic, marker.group_id)
        marker = replace(marker, partition=partition)
        if self._logs.cluster.shared and self._serves(marker.topic, partition) is None:
            await self.relay.request(marker)
            return
        await self._groups.end_txn(marker)

    async def _end_own_group_txn(self, marker: MarkerRequest) -> bool:
        """The relay's side of :meth:`end_group_txn`, once the group's partition is loaded."""
        assert marker.group_id is not None
        if self._groups.serving_error(marker.topic, marker.group_id) != ErrorCode.NONE:
            return False
        await self._groups.end_txn(marker)
        return True

    def _write_own_marker(self, marker: MarkerRequest) -> asyncio.Future[None] | None:
        """Write a marker into a partition this broker owns; return what to await."""
        partition = self._logs.partition(marker.topic, marker.partition)
        if partition is None:  # the topic was deleted meanwhile: nothing to mark
            return None
        return self.write_here(marker, partition,
                               self._producers.get(marker.topic, marker.partition, partition),
                               ErrorCode.NOT_COORDINATOR)

    def write_here(self, marker: MarkerRequest, partition: PartitionStore,
                   state: PartitionProducers, code: ErrorCode,
                   generation: int | None = None) -> asyncio.Future[None] | None:
        """Append ``marker`` to ``partition`` (its partition, this broker's, whose producer
        state is ``state``) and apply it to that state; return what to await before it
        counts as written. A marker that a later coordinator or producer epoch fenced is
        refused (KafkaApiError TRANSACTION_COORDINATOR_FENCED or INVALID_PRODUCER_EPOCH,
        nothing written); a failed write raises KafkaApiError ``code``; ``generation`` is
        the partition's commit generation ``state`` was judged at (see
        :meth:`AppendPath.append`)."""
        state.check_marker(marker.producer_id, marker.producer_epoch, marker.coordinator_epoch)
        key = (marker.topic, marker.partition)
        now = int(time.time() * 1000)
        batch = marker_batch(marker.producer_id, marker.producer_epoch, marker.commit, now,
                             marker.coordinator_epoch)
        offset, durable = self._appends.append(
            key, partition, batch, read_header(batch), WriteKind.RECORDS, code,
            f"a transaction marker to {key[0]}-{key[1]}", generation)
        state.end_transaction(marker.producer_id, marker.producer_epoch, marker.commit,
                              offset, now, marker.coordinator_epoch)
        return durable
