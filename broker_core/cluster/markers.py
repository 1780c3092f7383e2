"""Transaction markers for partitions another broker owns: queued in the shared storage.

Kafka's transaction coordinator sends WriteTxnMarkers to each partition's leader. Here the
brokers share a database, so the coordinator queues the request there
(:meth:`MarkerRelay.request`, a future that resolves once the marker is written) and the
partition's owner writes it (:meth:`MarkerRelay.serve`) and removes the request.

The relay looks at the queue when the storage's change feed says it changed (``MARKERS``:
a request queued or removed), when this broker gains a partition (:meth:`wake`), and
every ``interval_s`` while it has something to wait for (a request of its own not yet
served, one of its partitions' that it could not carry out yet) or while the feed is not
live; else every ``SAFETY_S``. The transaction's pending offsets of a consumer group are ended the
same way by the owner of the group's ``__consumer_offsets`` partition (Kafka writes a marker
there). Only the owner writes, at its fenced epoch, so the marker lands
exactly where the partition's producer state expects it; a marker written twice (the owner
died between writing and removing) ends nothing the second time, as in Kafka.

A request for a partition whose owner died waits for the next owner; one for a partition
that no longer exists (its topic deleted) is dropped, and so is one the partition refuses
as fenced (a later coordinator or producer epoch ended the transaction: the request comes
from a coordinator that lost the transactional id, and would end the producer's next
transaction), with one log line.

The relay's statements (queueing, polling, removing) run in its own thread (``worker``),
never on the event loop: a database that stops answering holds only the transactions
waiting for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from broker_core.cluster.worker import Worker
from broker_core.errors import MARKER_FENCED, ErrorCode, KafkaApiError
from broker_core.storage import StorageError
from broker_core.storage.cluster import ClusterStore, MarkerRequest, TopicPartition
from broker_core.storage.feed import MARKERS, ChangeFeed
from broker_core.wakeup import Wakeup

log = logging.getLogger(__name__)

WriteMarker = Callable[[MarkerRequest], "asyncio.Future[None] | None"]
EndGroupTxn = Callable[[MarkerRequest], Awaitable[bool]]
"""Ends a producer's pending offsets of the request's group; False while the group's
partition is not ready here (asked again later)."""

_BACKOFF_S = 1.0
"""The pause after a round that met a database error."""
SAFETY_S = 5.0
"""The longest pause between rounds while the change feed is live and nothing is awaited
(a notification may have been lost)."""


class MarkerRelay:
    """Queues marker writes for other brokers and writes the ones queued for this one."""

    def __init__(self, store: ClusterStore, feed: ChangeFeed,
                 owned: Callable[[TopicPartition], bool],
                 exists: Callable[[TopicPartition], bool], write: WriteMarker,
                 end_group_txn: EndGroupTxn, interval_s: float = 0.05) -> None:
        self._store = store
        self._feed = feed
        self._wake: Callable[[], None] = lambda: None
        self._owned = owned
        self._exists = exists
        self._write = write
        self._end_group_txn = end_group_txn
        self._interval_s = interval_s
        self._waiting: dict[int, tuple[TopicPartition, asyncio.Future[None]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._failing: set[int] = set()
        self._worker = Worker("edge-markers")
        self._queueing: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        """Serve and follow queued markers in the background."""
        wakeup = Wakeup(self._feed, MARKERS)
        self._wake = wakeup.set
        self._task = asyncio.get_running_loop().create_task(self._run(wakeup))

    def wake(self) -> None:
        """Look at the queue now (this broker gained a partition: requests may wait for
        it); on the event loop."""
        self._wake()

    async def stop(self) -> None:
        """Stop; markers still awaited fail (the coordinator's next owner completes them)."""
        for task in [self._task, *self._queueing]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for _, waiter in self._waiting.values():
            if not waiter.done():
                waiter.cancel()
        self._waiting.clear()
        self._worker.close()

    def request(self, wanted: MarkerRequest) -> asyncio.Future[None]:
        """Queue a request for the owner of its partition; resolved once it is done, failed
        with NOT_COORDINATOR when the database cannot take it (the transaction coordinator
        tries again)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        task = asyncio.get_running_loop().create_task(self._queue(wanted, waiter))
        self._queueing.add(task)
        task.add_done_callback(self._queueing.discard)
        return waiter

    async def _queue(self, wanted: MarkerRequest, waiter: asyncio.Future[None]) -> None:
        try:
            (marker,) = await self._worker.run(lambda: self._store.request_markers([wanted]))
        except asyncio.CancelledError:  # stopping: as the requests already queued
            waiter.cancel()
            raise
        except (StorageError, OSError) as exc:
            if not waiter.done():
                waiter.set_exception(KafkaApiError(
                    ErrorCode.NOT_COORDINATOR, f"cannot queue a transaction end on "
                    f"{wanted.topic}-{wanted.partition}: {exc}"))
            return
        self._waiting[marker] = ((wanted.topic, wanted.partition), waiter)

    async def _run(self, wakeup: Wakeup) -> None:
        fast, slow = self._interval_s, self._interval_s
        while True:
            await wakeup.wait(fast, slow)
            try:
                left = await self.serve()
                await self._follow()
                fast = self._interval_s
                slow = fast if left or self._waiting else SAFETY_S
            except (StorageError, OSError) as exc:  # the database is away: back off
                log.debug("marker relay: %s", exc)
                fast = slow = _BACKOFF_S

    async def serve(self) -> bool:
        """Carry out the queued requests of partitions this broker owns; whether one of
        them is left (it could not be carried out yet)."""
        done: list[int] = []
        pending = await self._worker.run(self._store.pending_markers)
        self._failing.intersection_update(marker for marker, _ in pending)  # gone: forgotten
        mine = 0
        try:
            for marker, wanted in pending:
                if self._owned((wanted.topic, wanted.partition)):
                    mine += 1
                    if await self._carry_out(marker, wanted):
                        done.append(marker)
        finally:  # what was carried out is never carried out again
            if done:
                await self._worker.run(lambda: self._store.markers_done(done))
        return mine > len(done)

    async def _carry_out(self, marker: int, wanted: MarkerRequest) -> bool:
        """Write the marker, or end the group's pending offsets; False to try again later
        (one warning per request that keeps failing)."""
        try:
            if wanted.group_id is not None:
                return await self._end_group_txn(wanted)
            durable = self._write(wanted)
            if durable is not None:
                await durable
        except KafkaApiError as exc:
            if exc.code in MARKER_FENCED:
                self._failing.discard(marker)
                log.warning("dropped a queued transaction end on %s-%d of producer %d epoch "
                            "%d from coordinator epoch %d: %s", wanted.topic, wanted.partition,
                            wanted.producer_id, wanted.producer_epoch,
                            wanted.coordinator_epoch, exc.message)
                return True
            return self._retry(marker, wanted, exc)
        except (StorageError, OSError) as exc:
            return self._retry(marker, wanted, exc)
        self._failing.discard(marker)
        return True

    def _retry(self, marker: int, wanted: MarkerRequest, exc: Exception) -> bool:
        """A request that failed and is tried again later: False (one warning per request
        that keeps failing)."""
        if marker not in self._failing:
            self._failing.add(marker)
            log.warning("could not carry out a queued transaction end on %s-%d (tried "
                        "again): %s", wanted.topic, wanted.partition, exc)
        return False

    async def _follow(self) -> None:
        """Resolve the futures of this broker's requests that were served."""
        if not self._waiting:
            return
        asked = {marker: key for marker, (key, _) in self._waiting.items()}

        def left_and_gone() -> tuple[set[int], list[int]]:
            left = self._store.markers_left(list(asked))
            return left, [m for m, key in asked.items() if m in left and not self._exists(key)]

        left, gone = await self._worker.run(left_and_gone)
        if gone:
            await self._worker.run(lambda: self._store.markers_done(gone))
        for marker in [m for m in asked if m not in left or m in gone]:
            _, waiter = self._waiting.pop(marker, (None, None))
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
