"""Internal topics that hold coordinator state (``__consumer_offsets``, later
``__transaction_state``), written through the same managed ledger as user data.

They live in the metadata namespace (KoP's ``<tenant>/__kafka``), are never subject to
retention, and stay bounded by *snapshot compaction*: once a partition has taken
``compaction_bytes`` of new records, the coordinator's live state for that partition is
written again as fresh records and everything before them is dropped (DeleteRecords on
our own log). Replaying a partition from its log start rebuilds the state either way.

A coordinator keeps in memory what its writes made durable. A write whose outcome is
unknown (a commit sent to PostgreSQL whose answer was lost: it may be stored or not)
leaves memory and log apart, so, as Kafka's coordinators do not trust their cache after a
failed append, the coordinator forgets that partition's state and replays it from the log
in the background, retried until it succeeds; its keys answer COORDINATOR_LOAD_IN_PROGRESS
meanwhile, as while any partition loads, and the partition takes no write. A write that
certainly did not happen (refused before it was sent, fenced, abandoned behind a failed
one, a full disk) changes nothing and needs no replay; a failed fsync takes the partition
offline (NOT_COORDINATOR until restart).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence

from broker_core.appends import AppendPath
from broker_core.codec.batch_header import read_header
from broker_core.codec.records import encode_batch, key_values
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.ownership import coordinator_partition
from broker_core.storage import (
    PartitionStore,
    Storage,
    StorageError,
    TopicExists,
    TopicInfo,
    group_committed,
    shared_log,
)
from broker_core.storage.cluster import NotOwner
from broker_core.storage.errors import AppendFenced
from broker_core.storage_faults import UnknownOutcome, WriteKind
from broker_core.system_topic_index import KeyIndex, Record
from common.log_fields import topic_fields

log = logging.getLogger(__name__)
_MAX_RECORDS_PER_BATCH = 500
_KEPT = {"retention.ms": "-1", "retention.bytes": "-1"}
"""The configs that keep a system topic's records until compaction replaces them."""
_RETRY_S = 0.1
"""The first wait before a replay that failed (the database away) is tried again."""
_RETRY_MAX_S = 5.0
"""The longest wait between tries (each wait doubles the one before, up to this)."""


class SystemTopic:
    """One kind of internal topic (one topic per metadata namespace)."""

    def __init__(self, logs: Storage, appends: AppendPath, suffix: str,
                 num_partitions: int, segment_bytes: int, compaction_bytes: int) -> None:
        self.logs = logs
        self.appends = appends
        self.faults = appends.faults
        self.suffix = suffix
        self.num_partitions = num_partitions
        self.segment_bytes = segment_bytes
        self.compaction_bytes = compaction_bytes
        self._written: dict[tuple[str, int], int] = {}
        """Bytes appended to a partition since its last compaction (or its replay)."""
        self._live: dict[tuple[str, int], int] = {}
        """Bytes of a partition's last snapshot: its live state when it was compacted."""
        self._drops: dict[tuple[str, int], set[asyncio.Future[BaseException | None]]] = {}
        """Each partition's drops under way in worker threads (kept from the garbage
        collector; a replay of the partition waits for them: :meth:`reread`)."""
        self._indexes: dict[tuple[str, int], tuple[PartitionStore, KeyIndex]] = {}
        """The keys of partitions another broker writes, as read (:meth:`newest`)."""
        self._indexes_lock = threading.Lock()
        self.unknown: Callable[[str, int], None] = lambda topic, partition: None
        """Told of a partition a write of which failed with an unknown outcome (its
        coordinator replays it: :meth:`StateCoordinator.reload_partition`)."""
        self._unknown: set[tuple[str, int]] = set()
        """Partitions a write of which may be stored or not, until their coordinator has
        replayed them (:meth:`replayed`): they take no write meanwhile."""

    def ensure(self, topic: str) -> int:
        """Create the topic when missing; return its partition count (an existing topic
        keeps its count even when the configured one changed, so no state is lost).
        COORDINATOR_NOT_AVAILABLE when it cannot be created (a full disk)."""
        info = self.logs.topic(topic)
        if info is None:
            # a full disk: the coordinator is not available yet
            with self.faults.guard(f"the new topic {topic}", WriteKind.TOPICS,
                                   ErrorCode.COORDINATOR_NOT_AVAILABLE):
                try:
                    info = self.logs.create_topic(topic, self.num_partitions, {
                        **_KEPT, "segment.bytes": str(self.segment_bytes)})
                    log.info("created system topic %s with %d partitions", topic,
                             info.num_partitions, extra=topic_fields(topic))
                except TopicExists:  # created through another broker meanwhile
                    info = self.logs.topic(topic)
            if info is None:  # and deleted again
                raise KafkaApiError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                    f"system topic {topic} is being created")
        else:
            if info.num_partitions != self.num_partitions:
                log.warning("%s keeps its %d partitions (configured: %d)", topic,
                            info.num_partitions, self.num_partitions,
                            extra=topic_fields(topic))
            self._keep_forever(info)
        return info.num_partitions

    def _keep_forever(self, info: TopicInfo) -> None:
        """Give a system topic that retention could empty (one created otherwise, by an
        older version) the retention of one this broker creates: its state is kept until
        compacted, never deleted by age or size."""
        if all(info.configs.get(key) == value for key, value in _KEPT.items()):
            return
        with self.faults.guard(f"the configs of {info.name}", WriteKind.TOPICS,
                               ErrorCode.COORDINATOR_NOT_AVAILABLE):
            self.logs.alter_topic_configs(info.name, {**info.configs, **_KEPT})
        log.warning("system topic %s had a retention that could delete its state; it now "
                    "keeps it (retention.ms=-1, retention.bytes=-1)", info.name,
                    extra=topic_fields(info.name))

    def _partition(self, topic: str, partition: int) -> PartitionStore:
        found = self.logs.partition(topic, partition)
        if found is None:
            raise KeyError(f"system topic {topic} has no partition {partition}")
        return found

    def empty(self, topic: str, partition: int) -> bool:
        """Whether the partition holds no record to replay (not known while a write's
        outcome is unknown: it may have stored the first)."""
        target = self._partition(topic, partition)
        return (topic, partition) not in self._unknown and \
            target.log_start_offset >= target.next_offset

    def offline(self, topic: str, partition: int) -> bool:
        """Whether the partition's log is offline until restart (a failed fsync): its state
        in memory may hold what the log lost, so the coordinator must not serve it."""
        found = self.logs.partition(topic, partition)
        return found is not None and found.offline

    def append(self, topic: str, partition: int,
               records: Sequence[Record]) -> asyncio.Future[None] | None:
        """Append records (in batches); return what to await before acknowledging
        (:meth:`settle`). A write that fails (a full disk) raises NOT_COORDINATOR, as Kafka
        answers a coordinator's failed log write; one whose outcome turns out unknown also
        tells :attr:`unknown`. COORDINATOR_LOAD_IN_PROGRESS, and nothing written, while the
        partition waits to be read again after such a write."""
        key = (topic, partition)
        if key in self._unknown:
            raise KafkaApiError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                                f"{topic}-{partition} is being read again after a write "
                                "whose outcome is unknown")
        target = self._partition(topic, partition)
        durable: asyncio.Future[None] | None = None
        now = int(time.time() * 1000)
        for start in range(0, len(records), _MAX_RECORDS_PER_BATCH):
            chunk = records[start:start + _MAX_RECORDS_PER_BATCH]
            batch = encode_batch(chunk, now)
            _, appended = self.appends.append(key, target, batch, read_header(batch),
                                              WriteKind.COORDINATOR, ErrorCode.NOT_COORDINATOR)
            self._written[key] = self._written.get(key, 0) + len(batch)
            if appended is not None:
                # first: done before whoever awaits the write resumes
                appended.add_done_callback(functools.partial(self._settled, key))
            durable = appended or durable
        return durable

    def _settled(self, key: tuple[str, int], done: asyncio.Future[None]) -> None:
        """A write to ``key`` settled; one whose outcome is unknown marks the partition and
        tells :attr:`unknown`."""
        if done.cancelled() or not isinstance(done.exception(), UnknownOutcome):
            return
        self._unknown.add(key)
        self.unknown(*key)

    async def reread(self, topic: str, partition: int) -> None:
        """Make what :meth:`read` reads next the partition as stored: wait until its
        compaction's drop and its writes under way are done and, when a write failed,
        reload its ends from the storage (in a worker thread: it may wait for a commit)."""
        await self._dropped_all(self._drops.get((topic, partition), ()))
        target = self._partition(topic, partition)
        if group_committed(target):
            await asyncio.to_thread(target.settle)

    @staticmethod
    async def _dropped_all(drops: Iterable[asyncio.Future[BaseException | None]]) -> None:
        """Wait until ``drops`` (compactions' drops in worker threads) are done: a replay
        that read while one moved the log start past it would end early without a word,
        its state missing the snapshot and all after it."""
        pending = set(drops)
        if pending:
            await asyncio.wait(pending)

    async def await_drops(self) -> None:
        """Wait for every compaction's drop under way (the broker's stop, before the
        storage closes under them)."""
        await self._dropped_all([task for tasks in self._drops.values() for task in tasks])

    def replayed(self, topic: str, partition: int) -> None:
        """The coordinator replayed the partition as stored: it takes writes again."""
        self._unknown.discard((topic, partition))

    async def settle(self, durable: asyncio.Future[None] | None) -> None:
        """Await what :meth:`append` returned; a failed fsync raises NOT_COORDINATOR."""
        if durable is None:
            return
        try:
            await durable
        except AppendFenced as exc:  # the partition moved to another broker: not a fault
            raise KafkaApiError(ErrorCode.NOT_COORDINATOR, str(exc)) from None
        except OSError as exc:
            raise self.faults.failed(exc, f"{self.suffix} (fsync)", WriteKind.CHECKPOINTS,
                                     ErrorCode.NOT_COORDINATOR) from None

    def read(self, topic: str, partition: int) -> Iterator[Record]:
        """Every record from the partition's log start, in order."""
        target = self._partition(topic, partition)
        start = target.log_start_offset
        self._written[(topic, partition)] = target.size_bytes
        if start >= target.next_offset:
            return
        for info in target.batches_from(start):
            yield from key_values(info.batch, start)

    def newest(self, topic: str, partition: int, key: bytes) -> Record | None:
        """The newest record of ``key`` in the partition as stored now (None: there is
        none), whichever broker wrote it: what another broker's coordinator made durable
        (a shared storage only: KeyError otherwise), found through the partition's
        :class:`KeyIndex` (one statement nearly always, whatever the key). Blocking: a
        worker thread."""
        target = self._partition(topic, partition)
        start = target.log_start_offset
        shared = target if shared_log(target) else None
        if shared is None:
            raise KeyError(f"{topic}-{partition} is not in a shared storage")
        with self._indexes_lock:
            found = self._indexes.get((topic, partition))
            if found is None or found[0] is not target:  # new, or the topic made again
                found = self._indexes[(topic, partition)] = (target, KeyIndex())
        index = found[1]
        return shared.search(lambda read: index.newest(key, read, start))

    def needs_compaction(self, topic: str, partition: int) -> bool:
        """Whether the partition took ``compaction_bytes`` since it was last compacted, and
        at least as much as that compaction kept: a compaction rewrites the whole live
        state, so its cost is paid for by as many bytes of new writes (with a live state
        above ``compaction_bytes``, every write compacted it whole again: its own snapshot
        counted as written)."""
        key = (topic, partition)
        return self._written.get(key, 0) >= max(self.compaction_bytes, self._live.get(key, 0))

    def compact(self, topic: str, partition: int, live: Sequence[Record]) -> None:
        """Write ``live`` (the whole current state of the partition) and, once it is
        stored, drop what precedes it (a snapshot whose write or commit fails drops
        nothing: the partition is compacted again at its next write)."""
        target = self._partition(topic, partition)
        snapshot_start = target.next_offset
        key = (topic, partition)
        self._written[key] = 0
        try:
            durable = self.append(topic, partition, live) if live else None
        except KafkaApiError:  # a full disk (logged): compact again at the next write
            self._again(key)
            return
        self._live[key], self._written[key] = self._written[key], 0  # the snapshot's bytes
        if durable is None:
            self._drop_before(topic, partition, target, snapshot_start, len(live))
            return

        def stored(done: asyncio.Future[None]) -> None:
            if done.cancelled() or done.exception() is not None:  # logged by its writer
                self._again(key)
            else:
                self._drop_before(topic, partition, target, snapshot_start, len(live))

        durable.add_done_callback(stored)

    def _again(self, key: tuple[str, int]) -> None:
        """Compact the partition again at its next write (this compaction failed)."""
        self._written[key] = max(self.compaction_bytes, self._live.get(key, 0))

    def _drop_before(self, topic: str, partition: int, target: PartitionStore,
                     snapshot_start: int, kept: int) -> None:
        """The second half of :meth:`compact`: the snapshot at ``snapshot_start`` is
        written (and committed); drop the records before it: on the event loop for files
        (an fsync and unlinks, where reads walk the log), in a worker thread where the
        partition says so (``drops_in_thread``: on PostgreSQL, a delete of every row the
        snapshot replaces, a chunk per transaction, which would hold every connection of
        the broker for seconds)."""
        def dropped(error: BaseException | None) -> None:
            self._dropped(topic, partition, snapshot_start, kept, error)

        if not target.drops_in_thread:
            dropped(self._drop(target, snapshot_start))
            return
        key = (topic, partition)
        task = asyncio.ensure_future(asyncio.to_thread(self._drop, target, snapshot_start))
        self._drops.setdefault(key, set()).add(task)

        def done(task: asyncio.Future[BaseException | None]) -> None:
            pending = self._drops.get(key)
            if pending is not None:
                pending.discard(task)
                if not pending:
                    del self._drops[key]
            if not task.cancelled():  # cancelled: the broker stops
                dropped(task.result())

        task.add_done_callback(done)

    @staticmethod
    def _drop(target: PartitionStore, snapshot_start: int) -> BaseException | None:
        """Drop what precedes ``snapshot_start`` once the snapshot is on disk; the error
        that stopped it, if any."""
        try:
            target.flush()  # the snapshot is on disk before what it replaces is dropped
            target.delete_records_before(snapshot_start)
        except (NotOwner, OSError, StorageError) as exc:
            return exc
        return None

    def _dropped(self, topic: str, partition: int, snapshot_start: int, kept: int,
                 error: BaseException | None) -> None:
        """Log a compaction's end, or compact again at the next write if its drop failed
        (another broker took the partition: it compacts from now on)."""
        if isinstance(error, NotOwner):
            return
        if error is not None:
            if isinstance(error, OSError):
                self.faults.failed(error, f"the compaction of {topic}-{partition}",
                                   WriteKind.COORDINATOR)
            self._again((topic, partition))
            return
        log.info("compacted %s-%d: %d live records kept from offset %d", topic, partition,
                 kept, snapshot_start, extra=topic_fields(topic))


class StateCoordinator(ABC):
    """A coordinator whose state lives in a SystemTopic: it places keys on partitions with the
    one ownership function and serves the keys of the partitions this broker owns. The
    cluster tells it which ones (:meth:`load_partition` replays one in the background, a key
    whose partition is not replayed yet answers COORDINATOR_LOAD_IN_PROGRESS;
    :meth:`unload_partition` forgets one); keys of other partitions answer NOT_COORDINATOR.
    A partition a write of which has an unknown outcome is forgotten and replayed again
    (:meth:`reload_partition`). It runs a periodic duty (expiry, timeouts) over what it
    holds."""

    def __init__(self, store: SystemTopic, interval_ms: int) -> None:
        self.store = store
        self.interval_ms = interval_ms
        self.acquire: Callable[[str, int, int], int | None] = lambda topic, p, count: 0
        """The ownership function: the epoch this broker serves a partition at, or None."""
        self._partitions: dict[str, int] = {}
        self._epochs: dict[tuple[str, int], int] = {}
        """The epoch of this broker's claim on each partition it holds, as it was when the
        partition was loaded (a later claim unloads and loads it again)."""
        self._loaded: set[tuple[str, int]] = set()
        self._loading: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._again: set[tuple[str, int]] = set()
        """Partitions whose replay under way must start over (a write's outcome turned
        unknown meanwhile)."""
        self._tasks: list[asyncio.Task[None]] = []
        store.unknown = self.reload_partition

    def start(self) -> None:
        """Start the periodic duty."""
        self._tasks.append(asyncio.get_running_loop().create_task(self._periodic()))

    async def stop(self) -> None:
        """Stop background work."""
        tasks = self._tasks + list(self._loading.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def place(self, topic: str, key: str) -> int:
        """The partition of ``topic`` that holds ``key`` (creating the topic when new)."""
        count = self._partitions.get(topic)
        if count is None:
            count = self._partitions[topic] = self.store.ensure(topic)
        return coordinator_partition(key, count)

    def is_loaded(self, topic: str, key: str) -> bool:
        """Whether the partition holding ``key`` has been replayed."""
        return (topic, self.place(topic, key)) in self._loaded

    def is_offline(self, topic: str, key: str) -> bool:
        """Whether the partition holding ``key`` is offline until restart: Kafka's
        coordinator no longer owns a partition whose log is offline, so requests for its
        keys get NOT_COORDINATOR."""
        return self.store.offline(topic, self.place(topic, key))

    def serving_error(self, topic: str, key: str) -> ErrorCode:
        """NONE when this broker owns the partition holding ``key`` and has replayed it;
        otherwise what to answer: NOT_COORDINATOR (another broker owns it, or it is offline),
        COORDINATOR_LOAD_IN_PROGRESS, or the error that keeps the state topic from being
        created (a full disk)."""
        try:
            partition = self.place(topic, key)
            epoch = self.acquire(topic, partition, self._partitions[topic])
            if epoch is None:
                return ErrorCode.NOT_COORDINATOR
            if (topic, partition) not in self._loaded:
                # at once when there is nothing to replay
                self.load_partition(topic, partition, epoch)
                if (topic, partition) not in self._loaded:
                    return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
            if self.is_offline(topic, key):
                return ErrorCode.NOT_COORDINATOR
        except KafkaApiError as error:
            return error.code
        return ErrorCode.NONE

    def holds(self, topic: str, key: str) -> bool:
        """Whether this broker's memory holds ``key``'s state now: it owns the partition,
        has replayed it, and its log is online. Asks for no claim (cheap enough for every
        transactional batch a partition leader verifies)."""
        try:
            partition = self.place(topic, key)
        except KafkaApiError:
            return False
        return (topic, partition) in self._loaded and not self.store.offline(topic, partition)

    def coordinates(self, topic: str, key: str) -> bool:
        """Whether this broker owns (or can take now) the partition holding ``key``."""
        try:
            partition = self.place(topic, key)
        except KafkaApiError:
            return False
        return self.acquire(topic, partition, self._partitions[topic]) is not None

    def load_partition(self, topic: str, partition: int, epoch: int = 0) -> None:
        """This broker owns ``partition`` of ``topic`` now, claimed at ``epoch``: replay it
        (at once when empty)."""
        key = (topic, partition)
        if key in self._loaded or key in self._loading:
            return
        self._partitions.setdefault(topic, self.store.ensure(topic))
        self._epochs[key] = epoch
        if self.store.empty(topic, partition):
            self._loaded.add(key)
            self.partition_loaded(topic, partition)
            return
        self._start_load(topic, partition, forget=False)

    def reload_partition(self, topic: str, partition: int) -> None:
        """A write to ``partition`` of ``topic`` failed with an unknown outcome (it may be
        stored): what memory holds of the partition may no longer be what its log holds.
        Forget it and replay the log in the background (a replay under way starts over);
        its keys answer COORDINATOR_LOAD_IN_PROGRESS until then. Nothing to do for a
        partition not held here (its next load replays it)."""
        key = (topic, partition)
        if key in self._loading:
            self._again.add(key)
            return
        if key not in self._loaded:
            return
        log.warning("%s-%d: a write's outcome is unknown (its commit's answer was lost); "
                    "its state is replayed from the log, its requests answered "
                    "COORDINATOR_LOAD_IN_PROGRESS meanwhile", topic, partition,
                    extra=topic_fields(topic))
        self._loaded.discard(key)
        self.partition_unloaded(topic, partition)
        self._start_load(topic, partition, forget=True)

    def _start_load(self, topic: str, partition: int, *, forget: bool) -> None:
        key = (topic, partition)
        task = asyncio.get_running_loop().create_task(self._load(topic, partition, forget))
        self._loading[key] = task

        def done(_: asyncio.Task[None]) -> None:
            if self._loading.get(key) is task:  # not a later load's
                del self._loading[key]

        task.add_done_callback(done)

    def unload_partition(self, topic: str, partition: int) -> None:
        """This broker no longer owns ``partition`` of ``topic``: forget its state."""
        key = (topic, partition)
        loading = self._loading.pop(key, None)
        if loading is not None:
            loading.cancel()
        self._again.discard(key)
        self._loaded.discard(key)
        self._epochs.pop(key, None)
        self.partition_unloaded(topic, partition)

    def claim_epoch(self, topic: str, partition: int) -> int | None:
        """The epoch of this broker's claim on ``partition`` of ``topic`` when it loaded it
        (the coordinator epoch of what it writes for the partition's keys); None when it
        does not hold it."""
        return self._epochs.get((topic, partition))

    async def _load(self, topic: str, partition: int, forget: bool) -> None:
        """Replay the partition as stored (its writes under way answered first), forgetting
        first what memory holds of it (``forget``; always on a later try, which a failed
        try leaves half replayed); tried again with a growing wait while it fails (the
        database away), and again from the start while a write's outcome turned unknown
        meanwhile."""
        key = (topic, partition)
        started = time.monotonic()
        wait, failures, count = _RETRY_S, 0, 0
        while True:
            self._again.discard(key)
            try:
                await self.store.reread(topic, partition)
                if forget:
                    self.partition_unloaded(topic, partition)
                forget = True
                count = 0
                for count, (record_key, value) in enumerate(self.store.read(topic, partition),
                                                            1):
                    self.replay(topic, partition, record_key, value)
                    if count % 2000 == 0:
                        await asyncio.sleep(0)
            except (OSError, StorageError) as exc:
                failures += 1
                if failures == 1:
                    log.warning("could not replay %s-%d (%s); trying again until it "
                                "succeeds", topic, partition, exc, extra=topic_fields(topic))
                await asyncio.sleep(wait)
                wait = min(wait * 2, _RETRY_MAX_S)
                continue
            if key not in self._again:
                break
        self.store.replayed(topic, partition)
        self._loaded.add(key)
        self.partition_loaded(topic, partition)
        log.info("replayed %s-%d (%d records) in %.3f s%s", topic, partition, count,
                 time.monotonic() - started,
                 f" ({failures} failed tries before)" if failures else "",
                 extra=topic_fields(topic))

    async def _periodic(self) -> None:
        while True:
            await asyncio.sleep(self.interval_ms / 1000)
            try:
                await self.periodic(int(time.time() * 1000))
            except KafkaApiError:  # a write failed (a full disk, logged once): next round
                continue
            except Exception:  # never stop the duty: the next round tries again
                log.exception("%s: the periodic duty failed", self.store.suffix)

    @abstractmethod
    def replay(self, topic: str, partition: int, key: bytes, value: bytes | None) -> None:
        """Apply one stored record."""

    def partition_loaded(self, topic: str, partition: int) -> None:  # noqa: B027
        """A partition is replayed (hook)."""

    @abstractmethod
    def partition_unloaded(self, topic: str, partition: int) -> None:
        """Forget the state of a partition: this broker no longer owns it, or replays it
        again (a write's outcome unknown)."""

    @abstractmethod
    async def periodic(self, now: int) -> None:
        """The periodic duty."""
