"""The engine's state and the services the request handlers share.

It owns the log manager, the fsync policy and long-poll waiters (its background loops are
:mod:`broker_core.background`'s), and answers the questions every handler asks: which
internal topic a client's name means, whether it exists (creating it when auto-creation
allows), and how to append a batch. What this
broker serves in the cluster is asked of :attr:`Engine.leadership` (``leadership``), and
transaction markers are written through :attr:`Engine.txn_markers` (``txn_markers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from broker_core import metrics
from broker_core.admin_refusals import AdminRefusals
from broker_core.appends import AppendPath
from broker_core.background import BackgroundWork
from broker_core.cluster.service import ClusterService
from broker_core.codec import compression
from broker_core.codec.batch_header import (
    BatchHeader,
    stamp_log_append_time,
    transactional_header,
    validate_produced,
)
from broker_core.codec.records import checked_here
from broker_core.codec.rework import WALKING, Rework, rework
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
from broker_core.quotas.limits import TenantLimits, TopicCounts, tenant_of
from broker_core.quotas.mutations import MutationQuotas
from broker_core.storage import (
    CapExceeded,
    DatabaseUnavailable,
    LogOffline,
    NewTopic,
    PartitionStore,
    Storage,
    TopicExists,
    TopicInfo,
    UnknownTopic,
    commit_generation,
)
from broker_core.storage.cluster import BrokerRecord
from broker_core.storage_faults import WriteFaults, WriteKind
from broker_core.system_topics import SystemTopic
from broker_core.tenancy import OFFSETS_TOPIC, TXN_TOPIC, Tenancy
from broker_core.topic_configs import effective_config
from broker_core.transactions.coordinator import TransactionCoordinator, TxnKey
from broker_core.transactions.producer_ids import ProducerIdAllocator
from broker_core.transactions.verification import Batch, ProduceVerifier
from broker_core.txn_markers import TxnMarkers
from broker_core.waiters import AppendWaiters
from common.log_fields import topic_fields

log = logging.getLogger(__name__)


async def settled_anyhow(commits: asyncio.Future[None]) -> None:
    """Wait for ``commits`` to end, whether they stored anything or failed."""
    with contextlib.suppress(OSError):
        await commits


ZSTD_PRODUCE_VERSION = 7
"""The first Produce version that may carry zstd batches (KIP-110)."""


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
    txn_key: TxnKey | None = None
    """The transactional id the request named, as its coordinator keys it (state topic,
    id scoped to the tenant), for the check that a transactional batch's producer id is
    that id's and its transaction added the partition."""
    ctx: RequestContext | None = None
    """Who produced it, for the audit of a refusal at its tenant's storage quota."""


class Engine:
    """Shared state of the request handlers."""

    def __init__(self, config: EngineConfig, logs: Storage,
                 authorizer: Authorizer | None = None) -> None:
        self.config = config
        self._topic_defaults = config.topic_default_values()
        self.logs = logs
        self.authorizer: Authorizer = authorizer if authorizer is not None else AllowAll()
        self.tenancy = Tenancy(config, self.authorizer, logs)
        """Names and access: what a caller's names mean, what it sees and may do."""
        self.waiters = AppendWaiters()
        self.faults = WriteFaults()
        self.refusals = AdminRefusals()
        """The admin handlers' refusals, logged within bounds."""
        self.flusher = FlushScheduler(config.flush_interval_messages, config.flush_interval_ms,
                                      self.faults, self.waiters)
        self.appends = AppendPath(self.flusher)
        self.limits: TenantLimits | None = None
        """A tenant's caps on topics, partitions and stored bytes (None: no caps)."""
        self.mutations: MutationQuotas | None = None
        """The ``controller_mutation_rate`` quotas of topic changes (None: no quotas)."""
        self.kv_readers: list[Callable[[], Awaitable[None]]] = []
        """Awaited when another broker may have changed the storage's key-value area: each
        reads again what it keeps of it (the ACLs, the quotas); one that raises is awaited
        again."""
        self.closing = False
        self.topic_changes = asyncio.Lock()
        """Held by CreateTopics and CreatePartitions from their checks to the end of their
        writes (which run in a worker thread): the caps they check hold when they write."""
        offsets = SystemTopic(logs, self.appends, OFFSETS_TOPIC, config.offsets_topic_partitions,
                              config.offsets_topic_segment_bytes,
                              config.offsets_topic_compaction_bytes)
        self.groups = GroupCoordinator(config.groups, offsets)
        self.producers = ProducerStates(config.producer_id_expiration_ms, self.faults)
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
                                      lambda key: key in self.cluster.ownership.owned)
        self.cluster.ownership.on_gained(lambda _key, _epoch: self.txn_markers.relay.wake())
        self.transactions = TransactionCoordinator(
            config.transactions, txn_log, ProducerIdAllocator(logs.kv),
            self.txn_markers.write_marker, self.groups)
        self.txn_verifier = ProduceVerifier(self.transactions, logs.cluster.shared)
        self.transactions.end_group_txn = self.txn_markers.end_group_txn
        self.groups.acquire = self.transactions.acquire = self.cluster.acquire
        self.leadership.coordinators = {OFFSETS_TOPIC: self.groups, TXN_TOPIC: self.transactions}
        self.cleaner = LogCleaner(logs, self._cleaned_configs, self._writes,
                                  config.log_cleaner_io_max_bytes_per_second,
                                  cleaned=self.producers.cleaned,
                                  map_bytes=config.log_cleaner_dedupe_buffer_size,
                                  producer_expiration_ms=config.producer_id_expiration_ms)
        self.background = BackgroundWork(config, logs, self.producers, self.flusher,
                                         self.cleaner, self._forget_topic, self.kv_readers)

    def start(self) -> None:
        """Start background work: periodic fsync, the coordinators' timers and the loops of
        :class:`BackgroundWork`."""
        self.flusher.start()
        self.groups.start()
        self.transactions.start()
        self.background.start(self.limits)

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
        self.refusals.close_all()
        await self.background.stop()
        steps: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("stop relaying transaction markers", self.txn_markers.relay.stop),
            ("hand partitions over", self.cluster.leave),
            ("finish the producer snapshot under way", self.background.await_checkpoints),
            ("finish the storage refresh under way", self.background.await_refresher),
            ("finish the tenant usage sum under way", self.background.await_summing),
            ("stop the transaction coordinator", self.transactions.stop),
            ("stop the group coordinator", self.groups.stop),
            ("finish the compactions of __consumer_offsets", self.groups.store.await_drops),
            ("finish the compactions of __transaction_state",
             self.transactions.store.await_drops),
            ("fsync the partitions", self.flusher.stop),
        ]
        for what, action in steps:
            try:
                await action()
            except Exception as exc:
                problems.append(f"could not {what}: {exc}")
        self._reworkers.shutdown(wait=False, cancel_futures=True)
        self.txn_verifier.close()
        unsaved = self.producers.save()
        if unsaved is not None:
            problems.append(f"could not save the producer snapshots: {unsaved}")
        problems += self.logs.close()
        return problems

    def _cleaned_configs(self, internal: str) -> Mapping[str, str] | None:
        """A topic's effective configs for the log cleaner; None for the broker's own
        topics (they compact their snapshots themselves) and deleted ones."""
        topic = self.logs.topic(internal)
        if topic is None or self.tenancy.is_internal(internal):
            return None
        return self.topic_configs(topic.configs)

    def _writes(self, internal: str, index: int) -> bool:
        """Whether this broker writes the partition (on a cluster: owns it now)."""
        return not self.logs.cluster.shared or (internal, index) in self.cluster.ownership.owned

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
        return effective_config(own, self._topic_defaults)

    def lookup(self, internal: str, auto_create: bool,
               counts: TopicCounts | None = None) -> TopicInfo | None:
        """The topic, created with the default partition count when allowed and missing
        (``counts``: the request's count of the tenants' topics, for a request that may
        create several: counted once, not once per topic). A caller that may create holds
        ``topic_changes``, as CreateTopics does: the topics another request is creating
        in a worker thread count against the tenant's caps; on a shared engine the
        storage counts again, under the tenant's lock in the database."""
        topic = self.logs.topic(internal)
        if topic is None and auto_create and self.config.allow_auto_topic_creation:
            partitions = self.config.default_num_partitions
            cap = None
            try:
                if self.limits is not None:
                    self.limits.check_create(internal, 1, partitions, counts=counts)
                    cap = self.limits.storage_cap(internal, self.config.metadata_namespace)
                (outcome,) = self.logs.create_topics([NewTopic(internal, partitions, {}, cap)])
                if isinstance(outcome, CapExceeded) and self.limits is not None:
                    raise self.limits.refused_by_storage(None, internal, outcome)
                if isinstance(outcome, Exception):
                    raise outcome
                topic = outcome
                if counts is not None:
                    counts.add(tenant_of(internal), 1, partitions)
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
        is offline (a failed fsync: until restart). The messages go to clients, so they name
        the partition's index, not the internal topic name (the tenant's scope)."""
        found = self.logs.partition(internal, index)
        if found is None:
            raise KafkaApiError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"this server does not host partition {index} of the topic",
            )
        if found.offline:
            raise KafkaApiError(ErrorCode.KAFKA_STORAGE_ERROR,
                                f"partition {index} of the topic is offline until restart")
        if self.leadership.serves(internal, index) is None:
            # a produce refused here may be followed by one that skips its sequences
            self.producers.resume(internal, index)  # (ProducerStates.resume)
            raise KafkaApiError(ErrorCode.NOT_LEADER_OR_FOLLOWER,
                                f"partition {index} of the topic is served by another broker")
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
        """Drop what the engine keeps of a deleted topic (its metrics' series too: its
        produce rules hold two, made again for a topic created again), and wake its parked
        fetches."""
        for partition in partitions:
            self.flusher.forget(partition)
        self._rules.pop(internal, None)
        metrics.forget_topic(internal, len(partitions))
        self.cluster.ownership.forget_topic(internal)
        self.producers.forget(internal)
        self.groups.topic_deleted(internal)
        for index in range(len(partitions)):
            self.waiters.notify((internal, index))

    # -- produce -----------------------------------------------------------------------

    def admit(self, internal: str, index: int, records: Buffer, acks: int,
              version: int = ZSTD_PRODUCE_VERSION, ctx: RequestContext | None = None,
              topic: TopicInfo | None = None, txn_key: TxnKey | None = None) -> Admitted:
        """Check one produced batch's header, size and the topic's produce rules; what is
        left to do off the event loop is the admission's ``rework`` (see
        :meth:`reworked`), then :meth:`append` it. ``topic``: the topic as the caller just
        looked it up (else it is looked up here); ``txn_key``: the transactional id the
        request named, as its coordinator keys it."""
        started = time.perf_counter()
        if topic is None:
            topic = self.logs.topic(internal)
        partition = self.partition(internal, index)
        assert topic is not None
        if self.limits is not None:  # early, before any rework: the tenant is full
            self.limits.check_produce(internal, 0, ctx)
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
        if rules.timestamps is not None:
            rules.timestamps.check(header, int(time.time() * 1000))
        rework = Rework.needed(header, rules.codec, rules.keyed, self.config.validate_records)
        if rework is None and self.config.validate_records and \
                not checked_here(records, header):  # it inflates to much more than came
            rework = WALKING
        return Admitted(internal, index, partition, records, header, rules, rework, started,
                        txn_key=txn_key, ctx=ctx)

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

    def commits_before_state(self, internal: str, index: int, partition: PartitionStore,
                             ) -> asyncio.Future[None] | None:
        """What to await, off the event loop's critical path, before a partition's producer
        state is used (to judge a batch, or for the last stable offset): the partition's
        commits under way when the state is to be (re)built, which must count them. None:
        nothing (the state is loaded, or nothing is under way)."""
        if self.producers.loaded(internal, index, partition):
            return None
        return self.appends.settled((internal, index))

    async def settled_before_state(self, admitted: Admitted,
                                   commits: asyncio.Future[None]) -> Admitted:
        """The admission once ``commits`` (:meth:`commits_before_state`) ended, however
        they did (the batch is judged against what they stored). The partition is looked
        up again: it may have moved meanwhile."""
        await settled_anyhow(commits)
        return replace(admitted, partition=self.partition(admitted.internal, admitted.index))

    def verification_pending(self, admitted: Admitted) -> bool:
        """Whether a transactional batch waits for :meth:`verified` before its append:
        another broker coordinates its transactional id, and its transaction has not been
        verified on the partition yet (``transactions.verification``)."""
        return admitted.header.is_transactional and self.txn_verifier.pending(
            lambda: self.producer_state(admitted.internal, admitted.index, admitted.partition),
            admitted.header, admitted.txn_key)

    async def verified(self, admitted: Admitted,
                       refusal: KafkaApiError | None = None) -> Admitted:
        """The admission once its coordinator's durable state says its transaction took the
        partition (KafkaApiError otherwise; ``refusal``: what :meth:`verify_ahead` found
        already). The partition is looked up again (it may have moved meanwhile), and the
        commits under way awaited again if its producer state is to be rebuilt."""
        if refusal is not None:
            raise refusal
        assert admitted.txn_key is not None
        internal, index = admitted.internal, admitted.index
        refusals = await self.txn_verifier.verify(
            [(self.producer_state(internal, index, admitted.partition), admitted.header,
              internal, index)], admitted.txn_key)
        for refused in refusals.values():
            raise refused
        admitted = replace(admitted, partition=self.partition(internal, index))
        commits = self.commits_before_state(internal, index, admitted.partition)
        return admitted if commits is None else \
            await self.settled_before_state(admitted, commits)

    async def verify_ahead(self, batches: Iterable[tuple[str, int, Buffer | None]],
                           key: TxnKey) -> dict[tuple[str, int], KafkaApiError]:
        """Verify together the transactional batches of a request (its ``(internal topic,
        index, records)``, naming transactional id ``key``) that another broker's durable
        state decides: one read for them all; the refusals by (topic, index). What cannot
        be judged here yet (a partition not led here, a producer state to rebuild once the
        commits under way ended, records that are no transactional batch) is left to
        :meth:`verified`, batch by batch, and so is a lone batch."""
        if not self.txn_verifier.remote(key):
            return {}
        found: list[Batch] = []
        for internal, index, records in batches:
            header = transactional_header(records)
            if header is None:
                continue
            try:
                partition = self.partition(internal, index)
                if self.commits_before_state(internal, index, partition) is not None:
                    continue  # a state to rebuild once they ended
                producers = self.producer_state(internal, index, partition)
            except KafkaApiError:
                continue
            if not self.txn_verifier.verified(producers, header, key):
                found.append((producers, header, internal, index))
        if len(found) < 2:
            return {}
        return await self.txn_verifier.verify(found, key)

    def append(self, admitted: Admitted) -> Appended:
        """Append an admitted batch (its rework done) after the idempotence and transaction
        checks; the caller awaits ``durable`` if set."""
        assert admitted.rework is None
        internal, index, partition = admitted.internal, admitted.index, admitted.partition
        header, rules, records = admitted.header, admitted.rules, admitted.records
        producers: PartitionProducers | None = None
        generation: int | None = None
        if header.producer_id >= 0:
            generation = commit_generation(partition)  # the state below is judged at it
            producers = self.producer_state(internal, index, partition)
            duplicate = producers.check(header)
            if duplicate is not None:
                log.info("duplicate batch of producer %d on %s-%d acknowledged at %d",
                         header.producer_id, internal, index, duplicate,
                         extra=topic_fields(internal))
                return Appended(duplicate, -1, partition.log_start_offset,
                                self.appends.repeated((internal, index), partition,
                                                     duplicate, records))
            if header.is_transactional:
                self.txn_verifier.check(producers, header, admitted.txn_key, internal, index)
        # the request's own bytes, not copied: the storage copies what it keeps
        batch: Buffer = records
        log_append_time = -1
        if rules.log_append_time:
            stamped = records if admitted.owned and isinstance(records, bytearray) \
                else bytearray(records)
            log_append_time = int(time.time() * 1000)
            header = stamp_log_append_time(stamped, header, log_append_time)
            batch = stamped
        if self.limits is not None:  # the batch as stored, counted with no wait after
            self.limits.check_produce(internal, len(batch), admitted.ctx)
        validated = time.perf_counter()
        try:
            base, durable = self.appends.append((internal, index), partition, batch, header,
                                                WriteKind.RECORDS, generation=generation,
                                                flush=rules.flush)
        except KafkaApiError:
            # a database commit's reply may be what was lost, or the partition moved: judge
            # the producer's retry by what is stored
            if producers is not None:
                self.producers.invalidate(internal, index)
                self.producers.resume(internal, index)
            raise
        metrics.STAGE_VALIDATE.observe(validated - admitted.started)
        metrics.STAGE_APPEND.observe(time.perf_counter() - validated)
        if self.limits is not None:
            self.limits.count_produced(internal, len(batch))
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
        return state.last_stable_offset(self.flusher.high_watermark(partition),
                                        partition.log_start_offset)
