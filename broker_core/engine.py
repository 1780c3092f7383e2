"""The engine's state and the services the request handlers share.

It owns the log manager, the fsync policy, long-poll waiters and retention, and answers
the questions every handler asks: which internal topic a client's name means, whether
it exists (creating it when auto-creation allows), and how to append a batch. What this
broker serves in the cluster is asked of :attr:`Engine.leadership` (``leadership``), and
transaction markers are written through :attr:`Engine.txn_markers` (``txn_markers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from broker_core import metrics
from broker_core.appends import AppendPath
from broker_core.cluster.service import ClusterService
from broker_core.codec import compression
from broker_core.codec.batch_header import (
    BatchHeader,
    stamp_log_append_time,
    validate_produced,
)
from broker_core.codec.records import check_records
from broker_core.codec.rework import Rework, rework
from broker_core.codec.varints import Buffer
from broker_core.compaction.cleaner import LogCleaner
from broker_core.context import AllowAll, Authorizer, RequestContext
from broker_core.durability import FlushScheduler
from broker_core.engine_config import EngineConfig, ProduceRules
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.groups.coordinator import GroupCoordinator
from broker_core.leadership import Leadership
from broker_core.partition_producers import PartitionProducers
from broker_core.producer_states import ProducerStates
from broker_core.quotas.limits import TenantLimits
from broker_core.storage import (
    DatabaseUnavailable,
    LogOffline,
    PartitionStore,
    Storage,
    StorageError,
    TopicExists,
    TopicInfo,
    UnknownTopic,
)
from broker_core.storage.cluster import BrokerRecord
from broker_core.storage.feed import CHANGES
from broker_core.storage_faults import WriteFaults, WriteKind
from broker_core.system_topics import SystemTopic
from broker_core.tenancy import OFFSETS_TOPIC, TXN_TOPIC, Tenancy
from broker_core.topic_configs import effective_config
from broker_core.transactions.coordinator import TransactionCoordinator
from broker_core.transactions.producer_ids import ProducerIdAllocator
from broker_core.txn_markers import TxnMarkers
from broker_core.waiters import AppendWaiters
from broker_core.wakeup import Wakeup
from common.log_fields import topic_fields

log = logging.getLogger(__name__)
ZSTD_PRODUCE_VERSION = 7
"""The first Produce version that may carry zstd batches (KIP-110)."""
CHECKPOINT_CHECK_S = 1.0
"""How often partitions are checked for a due producer-state snapshot."""
REFRESH_INTERVAL_S = 0.25
"""How often the storage is asked what other brokers sharing it changed while its change
feed is not live (``storage.feed``): their topic, ACL and config changes take effect here
within a second. While it is live, it is asked when the feed says so."""
REFRESH_SAFETY_S = 5.0
"""How often the storage is asked anyway while its change feed is live."""


@dataclass(frozen=True, slots=True)
class Appended:
    """The outcome of one append: where the batch went and what to wait for before acking."""

    base_offset: int
    log_append_time: int
    log_start_offset: int
    durable: asyncio.Future[None] | None


@dataclass(frozen=True, slots=True)
class Admitted:
    """A produced batch whose header passed the checks, on its way to the log."""

    internal: str
    index: int
    partition: PartitionStore
    records: Buffer
    header: BatchHeader
    rules: ProduceRules
    rework: Rework | None
    """What is left to do to its records, off the event loop (None: nothing)."""
    started: float
    """When its checks began (``time.perf_counter``), for the validate stage's metric."""
    owned: bool = False
    """``records`` is the broker's own copy (a reworked batch), to stamp in place."""


class Engine:
    """Shared state of the request handlers."""

    def __init__(self, config: EngineConfig, logs: Storage,
                 authorizer: Authorizer | None = None) -> None:
        self.config = config
        self.logs = logs
        self.authorizer: Authorizer = authorizer if authorizer is not None else AllowAll()
        self.tenancy = Tenancy(config, self.authorizer, logs)
        """Names and access: what a caller's names mean, what it sees and may do."""
        self.waiters = AppendWaiters()
        self.faults = WriteFaults()
        self.flusher = FlushScheduler(config.flush_interval_messages, config.flush_interval_ms,
                                      self.faults)
        self.appends = AppendPath(self.waiters, self.flusher)
        self._retention: asyncio.Task[None] | None = None
        self._cleaning: asyncio.Task[None] | None = None
        self._checkpoints: asyncio.Task[None] | None = None
        self._refresher: asyncio.Task[None] | None = None
        self._summing: asyncio.Task[None] | None = None
        self._wake_refresher: Callable[[], None] = lambda: None
        self.limits: TenantLimits | None = None
        """A tenant's caps on topics, partitions and stored bytes (None: no caps)."""
        self.kv_readers: list[Callable[[], None]] = []
        """Called when another broker may have changed the storage's key-value area: each
        reads again what it keeps of it (the ACLs); one that raises is called again."""
        self._stopping = asyncio.Event()
        self.closing = False
        self.topic_changes = asyncio.Lock()
        """Held by CreateTopics and CreatePartitions from their checks to the end of their
        writes (which run in a worker thread): the caps they check hold when they write."""
        offsets = SystemTopic(logs, self.appends, OFFSETS_TOPIC, config.offsets_topic_partitions,
                              config.offsets_topic_segment_bytes,
                              config.offsets_topic_compaction_bytes)
        self.groups = GroupCoordinator(config.groups, offsets)
        self.producers = ProducerStates(config.producer_id_expiration_ms, self.faults)
        self.appends.lost = self.producers.invalidate  # a failed commit: rebuild it
        self._rules: dict[str, ProduceRules] = {}
        self._reworkers = ThreadPoolExecutor(max_workers=os.cpu_count() or 1,
                                             thread_name_prefix="rework")
        """Threads for the work on produced records (recompression, key checks): their
        own, so that CPU-heavy batches never queue the fsyncs of the default executor."""
        txn_log = SystemTopic(logs, self.appends, TXN_TOPIC, config.txn_topic_partitions,
                              config.offsets_topic_segment_bytes,
                              config.offsets_topic_compaction_bytes)
        logs.cluster.begin()  # from now on only claimed partitions are written
        self.cluster = ClusterService(logs.cluster, BrokerRecord(config.broker_id, None, ()),
                                      config.cluster, logs.topics, logs.kv, logs.feed)
        self.leadership = Leadership(config.broker_id, config.metadata_namespace, logs,
                                     self.cluster, self.producers, self.waiters)
        self.txn_markers = TxnMarkers(logs, self.appends, self.producers, self.groups,
                                      self.leadership.serves,
                                      lambda key: key in self.cluster.owned)
        self.cluster.on_gained(lambda _key, _epoch: self.txn_markers.relay.wake())
        self.transactions = TransactionCoordinator(
            config.transactions, txn_log, ProducerIdAllocator(logs.kv),
            self.txn_markers.write_marker, self.groups)
        self.transaction_check: Callable[[int, int, str, int], None] | None = (
            self.transactions.verify_produce)
        self.transactions.end_group_txn = self.txn_markers.end_group_txn
        self.groups.acquire = self.transactions.acquire = self.cluster.acquire
        self.leadership.coordinators = {OFFSETS_TOPIC: self.groups, TXN_TOPIC: self.transactions}
        self.cleaner = LogCleaner(logs, self._cleaned_configs, self._writes,
                                  config.log_cleaner_io_max_bytes_per_second,
                                  cleaned=self.producers.cleaned,
                                  map_bytes=config.log_cleaner_dedupe_buffer_size)
        self._cleaner_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cleaner")

    def start(self) -> None:
        """Start background work: periodic fsync and retention."""
        self.flusher.start()
        self.groups.start()
        self.transactions.start()
        loop = asyncio.get_running_loop()
        self._retention = loop.create_task(self._retention_loop())
        if self.config.log_cleaner_enable:
            self._cleaning = loop.create_task(self._cleaner_loop())
        self._checkpoints = loop.create_task(self._checkpoint_loop())
        self._refresher = loop.create_task(
            self._refresh_loop(Wakeup(self.logs.feed, CHANGES)))
        if self.limits is not None:
            self._summing = loop.create_task(self.limits.keep_summing(self._stopping))

    async def join(self, me: BrokerRecord) -> None:
        """Join the cluster as ``me`` and take this broker's share of the partitions; carry
        out the transaction markers other brokers queue for this one."""
        await self.leadership.join(me)
        self.txn_markers.start()

    def begin_shutdown(self) -> None:
        """Answer parked fetches now instead of at their ``max_wait_ms``, and waiting group
        joins and syncs now instead of when their rebalance ends (NOT_COORDINATOR)."""
        self.closing = True
        self.waiters.notify_all()
        self.groups.resign()

    async def stop(self) -> list[str]:
        """Stop background work, fsync and seal every ledger.

        Each step is tried even when one before it failed (on a full disk the snapshot and
        metadata writes do): what was done needs no recovery at the next start. Returns one
        line per step that could not be done.
        """
        problems: list[str] = []
        if self._retention is not None:
            self._retention.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._retention
        self._stopping.set()
        self._wake_refresher()
        self.cleaner.stopping.set()
        if self._cleaning is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._cleaning
        self._cleaner_thread.shutdown(wait=False, cancel_futures=True)
        steps: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("stop relaying transaction markers", self.txn_markers.relay.stop),
            ("hand partitions over", self.cluster.leave),
            ("finish the producer snapshot under way", self._await_checkpoints),
            ("finish the storage refresh under way", self._await_refresher),
            ("finish the tenant usage sum under way", self._await_summing),
            ("stop the transaction coordinator", self.transactions.stop),
            ("stop the group coordinator", self.groups.stop),
            ("fsync the partitions", self.flusher.stop),
        ]
        for what, action in steps:
            try:
                await action()
            except Exception as exc:
                problems.append(f"could not {what}: {exc}")
        self._reworkers.shutdown(wait=False, cancel_futures=True)
        unsaved = self.producers.save()
        if unsaved is not None:
            problems.append(f"could not save the producer snapshots: {unsaved}")
        problems += self.logs.close()
        return problems

    async def _await_checkpoints(self) -> None:
        if self._checkpoints is not None:  # let a snapshot being written finish first
            await self._checkpoints

    async def _await_summing(self) -> None:
        if self._summing is not None:
            await self._summing

    async def _await_refresher(self) -> None:
        if self._refresher is not None:
            await self._refresher

    async def _refresh_loop(self, wakeup: Wakeup) -> None:
        """Take in what other brokers sharing the storage changed, when its feed says so
        (``REFRESH_SAFETY_S`` at the latest) or every ``REFRESH_INTERVAL_S`` while the
        feed is not live: forget deleted topics, let ``kv_readers`` read again. A storage
        that cannot be read (a database away) is logged once, and once more when it can
        be read again."""
        self._wake_refresher = wakeup.set
        failing = kv_pending = False
        while not self._stopping.is_set():
            await wakeup.wait(REFRESH_INTERVAL_S, REFRESH_SAFETY_S)
            if self._stopping.is_set():
                return
            try:
                changes = await asyncio.to_thread(self.logs.refresh)
                for internal, partitions in changes.gone.items():
                    log.info("topic %s was deleted through another broker", internal,
                             extra=topic_fields(internal))
                    self._forget_topic(internal, partitions)
                kv_pending = kv_pending or changes.kv_changed
                if kv_pending:
                    for read_again in self.kv_readers:
                        read_again()
                    kv_pending = False
            except Exception as exc:  # keep refreshing: the next round retries
                if not failing:
                    reason = exc.strerror if isinstance(exc, OSError) else None
                    log.warning("storage: cannot take in what other brokers changed: %s; "
                                "retrying", reason or exc, exc_info=not isinstance(exc, OSError))
                failing = True
                continue
            if failing:
                log.info("storage: reading what other brokers changed works again")
                failing = False

    async def _retention_loop(self) -> None:
        interval = self.config.retention_check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                removed = self.logs.enforce_retention()
            except (StorageError, OSError) as exc:  # the database is away: next round
                log.warning("retention could not run: %s", exc)
                continue
            if removed:
                log.info("retention removed %d ledgers", removed)

    async def _cleaner_loop(self) -> None:
        """Run the log cleaner in its thread every ``log_cleaner_backoff_ms``."""
        loop = asyncio.get_running_loop()
        interval = self.config.log_cleaner_backoff_ms / 1000
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), interval)
                return
            try:
                await loop.run_in_executor(self._cleaner_thread, self.cleaner.run_once)
            except Exception:  # the next round tries again
                log.exception("the log cleaner failed")

    def _cleaned_configs(self, internal: str) -> Mapping[str, str] | None:
        """A topic's effective configs for the log cleaner; None for the broker's own
        topics (they compact their snapshots themselves) and deleted ones."""
        topic = self.logs.topic(internal)
        if topic is None or self.tenancy.is_internal(internal):
            return None
        return self.topic_configs(topic.configs)

    def _writes(self, internal: str, index: int) -> bool:
        """Whether this broker writes the partition (on a cluster: owns it now)."""
        return not self.logs.cluster.shared or (internal, index) in self.cluster.owned

    async def _checkpoint_loop(self) -> None:
        """Snapshot producer state as partitions move on, so a crash replays little; forget
        idle producer ids every ``producer_id_expiration_check_interval_ms``."""
        expire_every = self.config.producer_id_expiration_check_interval_ms / 1000
        expired_at = time.monotonic()
        while not self._stopping.is_set():
            wait = min(CHECKPOINT_CHECK_S, max(expired_at + expire_every - time.monotonic(), 0))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), wait)
                return  # stopping: the shutdown snapshot follows
            try:
                if time.monotonic() - expired_at >= expire_every:
                    expired_at = time.monotonic()
                    self.producers.expire()
                await self.producers.checkpoint(self.flusher.flush)
            except Exception:  # keep taking snapshots; the next round retries
                log.exception("producer state snapshots failed")

    def _produce_rules(self, internal: str, own: Mapping[str, str]) -> ProduceRules:
        """What produce checks per topic, computed once per set of topic configs."""
        rules = self._rules.get(internal)
        if rules is None or rules.configs != own:
            rules = self._rules[internal] = ProduceRules.of(internal, own,
                                                            self.topic_configs(own))
        return rules

    def stores_zstd(self, internal: str) -> bool:
        """Whether the topic's ``compression.type`` is zstd (False for a missing topic)."""
        topic = self.logs.topic(internal)
        return topic is not None and \
            self._produce_rules(internal, topic.configs).codec == compression.ZSTD

    def topic_configs(self, own: Mapping[str, str]) -> dict[str, str]:
        """Every topic config key with its effective value, given a topic's own configs."""
        return effective_config(own, self.config.topic_defaults)

    def lookup(self, internal: str, auto_create: bool) -> TopicInfo | None:
        """The topic, created with the default partition count when allowed and missing."""
        topic = self.logs.topic(internal)
        if topic is None and auto_create and self.config.allow_auto_topic_creation:
            try:
                if self.limits is not None:
                    self.limits.check_create(internal, 1, self.config.default_num_partitions)
                topic = self.logs.create_topic(internal, self.config.default_num_partitions, {})
                log.info("auto-created topic %s with %d partitions", internal,
                         topic.num_partitions, extra=topic_fields(internal))
            except TopicExists:
                topic = self.logs.topic(internal)
            except KafkaApiError as exc:  # a tenant's cap: the topic stays unknown
                log.info("not auto-creating %s: %s", internal, exc.message,
                         extra=topic_fields(internal))
            except OSError as exc:  # a full disk: the topic stays unknown, clients retry
                self.faults.failed(exc, f"the new topic {internal}", WriteKind.TOPICS)
        return topic

    def partition(self, internal: str, index: int) -> PartitionStore:
        """The partition's log, or UNKNOWN_TOPIC_OR_PARTITION; KAFKA_STORAGE_ERROR while it
        is offline (a failed fsync: until restart)."""
        found = self.logs.partition(internal, index)
        if found is None:
            raise KafkaApiError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"this server does not host partition {index} of {internal}",
            )
        if found.offline:
            raise KafkaApiError(ErrorCode.KAFKA_STORAGE_ERROR,
                                f"partition {index} of {internal} is offline until restart")
        if self.leadership.serves(internal, index) is None:
            raise KafkaApiError(ErrorCode.NOT_LEADER_OR_FOLLOWER,
                                f"partition {index} of {internal} is served by another broker")
        return found

    def require_partition(self, internal: str, index: int) -> None:
        """UNKNOWN_TOPIC_OR_PARTITION unless the partition exists (on any broker)."""
        if self.logs.partition(internal, index) is None:
            raise KafkaApiError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                f"partition {index} of {internal} does not exist")

    def delete_topic(self, internal: str) -> None:
        """Delete a topic and forget its partitions' flush state."""
        topic = self.logs.topic(internal)
        if topic is None:
            raise KafkaApiError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {internal}")
        partitions = [partition for index in range(topic.num_partitions)
                      if (partition := self.logs.partition(internal, index)) is not None]
        try:
            self.logs.delete_topic(internal)
        except UnknownTopic:  # deleted through another broker: the cache was behind
            self._forget_topic(internal, partitions)
            raise KafkaApiError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                f"unknown topic {internal}") from None
        self._forget_topic(internal, partitions)

    def _forget_topic(self, internal: str, partitions: Sequence[PartitionStore]) -> None:
        """Drop what the engine keeps of a deleted topic, and wake its parked fetches."""
        for partition in partitions:
            self.flusher.forget(partition)
        self._rules.pop(internal, None)
        self.cluster.forget_topic(internal)
        self.producers.forget(internal)
        for index in range(len(partitions)):
            self.waiters.notify((internal, index))

    # -- produce -----------------------------------------------------------------------

    def admit(self, internal: str, index: int, records: Buffer, acks: int,
              version: int = ZSTD_PRODUCE_VERSION, ctx: RequestContext | None = None
              ) -> Admitted:
        """Check one produced batch's header, size and the topic's produce rules; what is
        left to do off the event loop is the admission's ``rework`` (see
        :meth:`reworked`), then :meth:`append` it."""
        started = time.perf_counter()
        topic = self.logs.topic(internal)
        partition = self.partition(internal, index)
        assert topic is not None
        if self.limits is not None:
            self.limits.check_produce(internal, len(records), ctx)
        header = validate_produced(records)
        if header.compression == compression.ZSTD and version < ZSTD_PRODUCE_VERSION:
            raise KafkaApiError(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
                                f"produce requests of version {version} may not use zstd")
        rules = self._produce_rules(internal, topic.configs)
        self._check_size(internal, len(records), rules)
        if acks == -1 and rules.min_insync_replicas > 1:
            raise KafkaApiError(
                ErrorCode.NOT_ENOUGH_REPLICAS,
                f"{internal} requires {rules.min_insync_replicas} in-sync replicas; "
                "this broker keeps one",
            )
        rework = Rework.needed(header, rules.codec, rules.keyed, self.config.validate_records)
        if rework is None and self.config.validate_records:
            check_records(records, header)
        return Admitted(internal, index, partition, records, header, rules, rework, started)

    @staticmethod
    def _check_size(internal: str, size: int, rules: ProduceRules) -> None:
        if size > rules.max_message_bytes:
            raise KafkaApiError(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"batch of {size} bytes exceeds max.message.bytes "
                f"{rules.max_message_bytes} of {internal}",
            )

    async def reworked(self, admitted: Admitted) -> Admitted:
        """The admission once its ``rework`` is done in an executor thread (compressed
        again as the topic stores batches, its keys or records checked). The partition is
        looked up again: it may have moved meanwhile."""
        assert admitted.rework is not None
        done = await asyncio.get_running_loop().run_in_executor(
            self._reworkers, rework, admitted.records, admitted.header, admitted.rework)
        partition = self.partition(admitted.internal, admitted.index)
        if done is None:
            return replace(admitted, partition=partition, rework=None)
        batch, header = done
        self._check_size(admitted.internal, len(batch), admitted.rules)
        return replace(admitted, partition=partition, records=batch, header=header,
                       rework=None, owned=True)

    def append(self, admitted: Admitted) -> Appended:
        """Append an admitted batch (its rework done) after the idempotence and transaction
        checks; the caller awaits ``durable`` if set."""
        assert admitted.rework is None
        internal, index, partition = admitted.internal, admitted.index, admitted.partition
        header, rules, records = admitted.header, admitted.rules, admitted.records
        producers: PartitionProducers | None = None
        if header.producer_id >= 0:
            producers = self.producer_state(internal, index, partition)
            duplicate = producers.check(header)
            if duplicate is not None:
                log.info("duplicate batch of producer %d on %s-%d acknowledged at %d",
                         header.producer_id, internal, index, duplicate,
                         extra=topic_fields(internal))
                return Appended(duplicate, -1, partition.log_start_offset,
                                self.appends.settled((internal, index)))
            if header.is_transactional and self.transaction_check is not None and (
                    not self.logs.cluster.shared
                    or header.producer_id in self.transactions.by_producer):
                # in a cluster only the producer's own coordinator can tell: as Kafka before
                # KIP-890, a batch whose coordinator is another broker is not verified
                self.transaction_check(header.producer_id, header.producer_epoch, internal,
                                       index)
        batch = records if admitted.owned and isinstance(records, bytearray) \
            else bytearray(records)
        log_append_time = -1
        if rules.log_append_time:
            log_append_time = int(time.time() * 1000)
            header = stamp_log_append_time(batch, header, log_append_time)
        validated = time.perf_counter()
        try:
            base, durable = self.appends.append((internal, index), partition, batch, header,
                                                WriteKind.RECORDS)
        except KafkaApiError:
            # a database commit's reply may be what was lost, or the partition moved: judge
            # the producer's retry by what is stored
            if producers is not None:
                self.producers.invalidate(internal, index)
            raise
        metrics.STAGE_VALIDATE.observe(validated - admitted.started)
        metrics.STAGE_APPEND.observe(time.perf_counter() - validated)
        rules.messages_in.inc(header.record_count)
        rules.bytes_in.inc(len(batch))
        if producers is not None:
            producers.record(header, base, header.max_timestamp)
        return Appended(base, log_append_time, partition.log_start_offset, durable)

    # -- transactions --------------------------------------------------------------------

    def producer_state(self, internal: str, index: int,
                       partition: PartitionStore) -> PartitionProducers:
        """A partition's producer state; KAFKA_STORAGE_ERROR (retriable) when it must be
        rebuilt from a storage that cannot be read now (a database away)."""
        try:
            return self.producers.get(internal, index, partition)
        except (LogOffline, DatabaseUnavailable) as exc:
            raise KafkaApiError(ErrorCode.KAFKA_STORAGE_ERROR,
                                f"the producer state of {internal}-{index}: {exc}") from None

    def partition_producers(self, internal: str, index: int) -> PartitionProducers:
        """The producer state of a partition (UNKNOWN_TOPIC_OR_PARTITION when missing)."""
        return self.producer_state(internal, index, self.partition(internal, index))

    def stable_offset(self, internal: str, index: int) -> int:
        """The last stable offset: read_committed readers see nothing at or beyond it."""
        partition = self.partition(internal, index)
        state = self.producer_state(internal, index, partition)
        return state.last_stable_offset(partition.next_offset)
