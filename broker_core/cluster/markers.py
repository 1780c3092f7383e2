"""Transaction markers for partitions another broker owns: queued in the shared storage.

Kafka's transaction coordinator sends WriteTxnMarkers to each partition's leader. Here the
brokers share a database, so the coordinator queues the request there
(:meth:`MarkerRelay.request`, a future that resolves once the marker is written) and the
partition's owner writes it (:meth:`MarkerRelay.serve`, polled every ``interval_s``) and
removes the request. The transaction's pending offsets of a consumer group are ended the
same way by the owner of the group's ``__consumer_offsets`` partition (Kafka writes a marker
there). Only the owner writes, at its fenced epoch, so the marker lands
exactly where the partition's producer state expects it; a marker written twice (the owner
died between writing and removing) ends nothing the second time, as in Kafka.

A request for a partition whose owner died waits for the next owner; one for a partition
that no longer exists (its topic deleted) is dropped. The poll for queued requests runs in
a worker thread, so that its round trip never holds up the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from broker_core.errors import KafkaApiError
from broker_core.storage import StorageError
from broker_core.storage.cluster import ClusterStore, MarkerRequest, TopicPartition

log = logging.getLogger(__name__)

WriteMarker = Callable[[str, int, int, int, bool], "asyncio.Future[None] | None"]
EndGroupTxn = Callable[[str, str, int, bool], Awaitable[bool]]
"""Ends a producer's pending offsets of a group (topic, group id, producer id, commit);
False while the group's partition is not ready here (asked again later)."""

_BACKOFF_S = 1.0
"""The pause after a round that met a database error."""


class MarkerRelay:
    """Queues marker writes for other brokers and writes the ones queued for this one."""

    def __init__(self, store: ClusterStore, owned: Callable[[TopicPartition], bool],
                 exists: Callable[[TopicPartition], bool], write: WriteMarker,
                 end_group_txn: EndGroupTxn, interval_s: float = 0.05) -> None:
        self._store = store
        self._owned = owned
        self._exists = exists
        self._write = write
        self._end_group_txn = end_group_txn
        self._interval_s = interval_s
        self._waiting: dict[int, tuple[TopicPartition, asyncio.Future[None]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._failing: set[int] = set()

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

    def request(self, wanted: MarkerRequest) -> asyncio.Future[None]:
        """Queue a request for the owner of its partition; resolved once it is done.
        OSError when the database cannot take it."""
        (marker,) = self._store.request_markers([wanted])
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[marker] = ((wanted.topic, wanted.partition), waiter)
        return waiter

    async def _run(self) -> None:
        pause = self._interval_s
        while True:
            await asyncio.sleep(pause)
            try:
                await self.serve()
                self._follow()
                pause = self._interval_s
            except (StorageError, OSError) as exc:  # the database is away: back off
                log.debug("marker relay: %s", exc)
                pause = _BACKOFF_S

    async def serve(self) -> None:
        """Carry out the queued requests of partitions this broker owns."""
        done: list[int] = []
        # off the event loop: on a shared database this poll is a round trip, every
        # ``interval_s``, that would hold up every request meanwhile
        pending = await asyncio.to_thread(self._store.pending_markers)
        self._failing.intersection_update(marker for marker, _ in pending)  # gone: forgotten
        try:
            for marker, wanted in pending:
                if self._owned((wanted.topic, wanted.partition)) \
                        and await self._carry_out(marker, wanted):
                    done.append(marker)
        finally:  # what was carried out is never carried out again
            self._store.markers_done(done)

    async def _carry_out(self, marker: int, wanted: MarkerRequest) -> bool:
        """Write the marker, or end the group's pending offsets; False to try again later
        (one warning per request that keeps failing)."""
        try:
            if wanted.group_id is not None:
                return await self._end_group_txn(wanted.topic, wanted.group_id,
                                                 wanted.producer_id, wanted.commit)
            durable = self._write(wanted.topic, wanted.partition, wanted.producer_id,
                                  wanted.producer_epoch, wanted.commit)
            if durable is not None:
                await durable
        except (KafkaApiError, StorageError, OSError) as exc:
            if marker not in self._failing:
                self._failing.add(marker)
                log.warning("could not carry out a queued transaction end on %s-%d (tried "
                            "again): %s", wanted.topic, wanted.partition, exc)
            return False
        self._failing.discard(marker)
        return True

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
