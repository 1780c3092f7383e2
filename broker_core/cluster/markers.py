"""Transaction markers for partitions another broker owns: queued in the shared storage.

Kafka's transaction coordinator sends WriteTxnMarkers to each partition's leader. Here the
brokers share a database, so the coordinator queues the request there
(:meth:`MarkerRelay.request`, a future that resolves once the marker is written) and the
partition's owner writes it (:meth:`MarkerRelay.serve`, polled every ``interval_s``) and
removes the request. Only the owner writes, at its fenced epoch, so the marker lands
exactly where the partition's producer state expects it; a marker written twice (the owner
died between writing and removing) ends nothing the second time, as in Kafka.

A request for a partition whose owner died waits for the next owner; one for a partition
that no longer exists (its topic deleted) is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from broker_core.errors import KafkaApiError
from broker_core.storage import StorageError
from broker_core.storage.cluster import ClusterStore, MarkerRequest, TopicPartition

log = logging.getLogger(__name__)

WriteMarker = Callable[[str, int, int, int, bool], "asyncio.Future[None] | None"]


class MarkerRelay:
    """Queues marker writes for other brokers and writes the ones queued for this one."""

    def __init__(self, store: ClusterStore, owned: Callable[[TopicPartition], bool],
                 exists: Callable[[TopicPartition], bool], write: WriteMarker,
                 interval_s: float = 0.05) -> None:
        self._store = store
        self._owned = owned
        self._exists = exists
        self._write = write
        self._interval_s = interval_s
        self._waiting: dict[int, tuple[TopicPartition, asyncio.Future[None]]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Serve and follow queued markers in the background."""
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop; markers still awaited fail (the coordinator's next owner completes them)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for _, waiter in self._waiting.values():
            if not waiter.done():
                waiter.cancel()
        self._waiting.clear()

    def request(self, topic: str, partition: int, producer_id: int, epoch: int,
                commit: bool) -> asyncio.Future[None]:
        """Queue a marker for the owner of ``partition``; resolved once it is written."""
        (marker,) = self._store.request_markers(
            [MarkerRequest(topic, partition, producer_id, epoch, commit)])
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[marker] = ((topic, partition), waiter)
        return waiter

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.serve()
                self._follow()
            except (StorageError, OSError) as exc:  # the database is away: next round
                log.debug("marker relay: %s", exc)

    async def serve(self) -> None:
        """Write the queued markers of partitions this broker owns."""
        done: list[int] = []
        for marker, wanted in self._store.pending_markers():
            key = (wanted.topic, wanted.partition)
            if not self._owned(key):
                continue
            try:
                durable = self._write(wanted.topic, wanted.partition, wanted.producer_id,
                                      wanted.producer_epoch, wanted.commit)
                if durable is not None:
                    await durable
            except (KafkaApiError, OSError) as exc:  # retried at the next round
                log.warning("could not write a queued marker to %s-%d: %s", *key, exc)
                continue
            done.append(marker)
        self._store.markers_done(done)

    def _follow(self) -> None:
        """Resolve the futures of this broker's requests that were served."""
        if not self._waiting:
            return
        left = self._store.markers_left(list(self._waiting))
        gone = [m for m, (key, _) in self._waiting.items()
                if m in left and not self._exists(key)]
        self._store.markers_done(gone)
        for marker in [m for m in self._waiting if m not in left or m in gone]:
            _, waiter = self._waiting.pop(marker)
            if not waiter.done():
                waiter.set_result(None)
