"""The caps of a whole tenant beyond rates: ``max_topics``, ``max_partitions`` and
``max_stored_bytes`` (each the tenant's own value: its tenant quota, the default tenant's,
or the configured default).

Topics and partitions are counted from the storage's topic list when a topic or
partitions are created (rare), once per request (:class:`TopicCounts`: every tenant in
one pass, then what the request itself adds; not once per topic it names, which cost
O(its topics x all topics)): beyond a cap the request answers POLICY_VIOLATION, as a
Kafka create-topic policy does. On a shared engine that list is every broker's (topics
live in the shared metadata), and the storage counts again where it stores a creation
(:meth:`TenantLimits.storage_cap`: in the database, under a lock of the tenant's), so
creations through several brokers at the same moment cannot pass a cap together.
Stored bytes are the sizes the storage keeps per partition, summed per tenant every
``interval_s`` (:meth:`TenantLimits.keep_summing`, ``Storage.topic_sizes``: on a shared
engine one aggregate in the database, so what every broker stored counts), with each
batch produced through this broker added in between, as stored (after the topic's
compression.type reworked it: a small gzip batch may store many times its size), each
counted before the next is judged; a produced batch that would take the tenant beyond
its ``max_stored_bytes`` answers KAFKA_STORAGE_ERROR, as Kafka answers when its
disk is full, for that tenant only. It recovers once DeleteRecords, retention or a
deleted topic bring the next sum under the cap. The broker's own topics count for
nobody. Each refusal is told to the quota observer (an audit event, rate-limited there).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping

from broker_core.context import RequestContext
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.quotas.entities import MAX_PARTITIONS, MAX_STORED_BYTES, MAX_TOPICS, TENANT
from broker_core.quotas.manager import QuotaManager, Refused
from broker_core.quotas.notices import Notices
from broker_core.storage import CapExceeded, Storage, TenantCap

log = logging.getLogger(__name__)


def tenant_of(internal: str) -> str:
    """The tenant of an internal topic name (``tenant/namespace/topic``)."""
    return internal.partition("/")[0]


class TopicCounts:
    """Topics and partitions per tenant (the broker's own not counted) for one request:
    counted in one pass over the storage's topic list when first asked for, then changed
    by what the request adds (:meth:`add`)."""

    def __init__(self, logs: Storage, is_internal: Callable[[str], bool]) -> None:
        self._logs = logs
        self._is_internal = is_internal
        self._counts: dict[str, tuple[int, int]] | None = None

    def _counted(self) -> dict[str, tuple[int, int]]:
        if self._counts is None:
            counts: dict[str, tuple[int, int]] = {}
            for topic in self._logs.topics():
                if not self._is_internal(topic.name):
                    tenant = tenant_of(topic.name)
                    topics, partitions = counts.get(tenant, (0, 0))
                    counts[tenant] = topics + 1, partitions + topic.num_partitions
            self._counts = counts
        return self._counts

    def of(self, tenant: str) -> tuple[int, int]:
        """The tenant's topics and partitions."""
        return self._counted().get(tenant, (0, 0))

    def add(self, tenant: str, topics: int, partitions: int) -> None:
        """The request created ``topics`` topics and ``partitions`` partitions of
        ``tenant`` (nothing to do while nothing was counted yet)."""
        if self._counts is not None:
            have_topics, have_partitions = self._counts.get(tenant, (0, 0))
            self._counts[tenant] = have_topics + topics, have_partitions + partitions


class TenantLimits:
    """Checks creations and produces against a tenant's caps."""

    def __init__(self, manager: QuotaManager, logs: Storage,
                 is_internal: Callable[[str], bool], interval_s: float) -> None:
        self.manager = manager
        self.logs = logs
        self.is_internal = is_internal
        self.interval_s = interval_s
        self.stored: dict[str, int] = {}
        """Bytes each tenant stores: the last sum, plus what was produced since."""
        self._failing = False
        self.notices = Notices(log, manager.window.span_s)

    def _cap(self, tenant: str, key: str) -> int | None:
        value = self.manager.tenant_value(tenant, key)
        return None if value is None else int(value)

    def topic_counts(self) -> TopicCounts:
        """Every tenant's topics and partitions, counted once when first asked for: one
        request's (or one metrics scrape's) view."""
        return TopicCounts(self.logs, self.is_internal)

    def _refuse(self, ctx: RequestContext | None, key: str, cap: int, tenant: str,
                what: str, code: ErrorCode, message: str) -> KafkaApiError:
        """Tell the observer of a refusal; the error to raise."""
        observer = self.manager.observer
        if observer is not None:
            observer.refused(Refused.of(ctx, key, cap, (TENANT, tenant), what, tenant,
                                        message))
        return KafkaApiError(code, message)

    def storage_cap(self, internal: str, metadata_namespace: str) -> TenantCap | None:
        """The caps of the topic's tenant for the storage to keep where it stores the
        topic (on a shared database, counted there under the tenant's lock: creations
        through several brokers at once take turns); None when the tenant has none."""
        tenant = tenant_of(internal)
        max_topics, max_partitions = self._cap(tenant, MAX_TOPICS), self._cap(
            tenant, MAX_PARTITIONS)
        if max_topics is None and max_partitions is None:
            return None
        return TenantCap(f"{tenant}/", f"{tenant}/{metadata_namespace}/", max_topics,
                         max_partitions)

    def refused_by_storage(self, ctx: RequestContext | None, internal: str,
                           exceeded: CapExceeded) -> KafkaApiError:
        """The POLICY_VIOLATION (told to the observer) of a creation the storage refused
        at its tenant's cap."""
        tenant = tenant_of(internal)
        return self._refuse(ctx, exceeded.key, exceeded.cap, tenant, "topic",
                            ErrorCode.POLICY_VIOLATION,
                            f"tenant {tenant} has {exceeded.have}; {exceeded.more} more "
                            f"would exceed its {exceeded.key} of {exceeded.cap}")

    def check_create(self, internal: str, topics: int, partitions: int,
                     ctx: RequestContext | None = None,
                     counts: TopicCounts | None = None) -> None:
        """POLICY_VIOLATION when ``topics`` new topics with ``partitions`` partitions in
        all would take the topic's tenant beyond its ``max_topics`` or ``max_partitions``
        (``ctx``: who asked, for the audit; None when the broker creates it itself;
        ``counts``: the request's, for a request that checks several topics, else they
        are counted here)."""
        tenant = tenant_of(internal)
        max_topics, max_partitions = self._cap(tenant, MAX_TOPICS), self._cap(
            tenant, MAX_PARTITIONS)
        if max_topics is None and max_partitions is None:
            return
        have_topics, have_partitions = (counts or self.topic_counts()).of(tenant)
        for key, cap, have, more, what in (
                (MAX_TOPICS, max_topics, have_topics, topics, "topics"),
                (MAX_PARTITIONS, max_partitions, have_partitions, partitions, "partitions")):
            if cap is not None and more > 0 and have + more > cap:
                raise self._refuse(
                    ctx, key, cap, tenant, "topic" if topics else "partitions",
                    ErrorCode.POLICY_VIOLATION,
                    f"tenant {tenant} has {have} {what}; {more} more would exceed its "
                    f"{key} of {cap}")

    def check_produce(self, internal: str, size: int,
                      ctx: RequestContext | None = None) -> None:
        """KAFKA_STORAGE_ERROR when the topic's tenant stores its ``max_stored_bytes``, or
        when ``size`` more bytes would take it beyond (``size``: the batch as it is stored,
        after any rework; 0 for the early check before it). Nothing is counted here: the
        caller counts a stored batch with :meth:`count_produced`, on the event loop with
        no wait between, so the batches of one request, and of requests at once, each
        count against what the ones before them added."""
        tenant = tenant_of(internal)
        cap = self._cap(tenant, MAX_STORED_BYTES)
        used = self.stored.get(tenant, 0)
        if cap is not None and (used >= cap or used + size > cap):
            self.notices.warn((MAX_STORED_BYTES, tenant), (
                f"tenant {tenant} stores {used} bytes, its {MAX_STORED_BYTES} is {cap}: "
                "its produces answer KAFKA_STORAGE_ERROR"))
            raise self._refuse(ctx, MAX_STORED_BYTES, cap, tenant, "produce",
                               ErrorCode.KAFKA_STORAGE_ERROR,
                               f"tenant {tenant} has reached its storage quota "
                               f"({MAX_STORED_BYTES} {cap}): it stores {used} bytes, "
                               f"the batch would add {size}")

    def count_produced(self, internal: str, size: int) -> None:
        """``size`` bytes were just stored for the topic's tenant (until the next sum)."""
        tenant = tenant_of(internal)
        self.stored[tenant] = self.stored.get(tenant, 0) + size

    def took_sizes(self, sizes: Mapping[str, int]) -> None:
        """The bytes stored per topic, as just read: the sums per tenant from now on."""
        stored: dict[str, int] = {}
        for name, size in sizes.items():
            if not self.is_internal(name):
                tenant = tenant_of(name)
                stored[tenant] = stored.get(tenant, 0) + size
        self.stored = stored

    async def keep_summing(self, stopping: asyncio.Event) -> None:
        """Read the bytes stored per topic every ``interval_s`` until ``stopping`` (in a
        worker thread: on a shared engine a database read). A storage that cannot be read
        is logged once, and once more when it can be read again; the sums stay meanwhile."""
        while not stopping.is_set():
            try:
                self.took_sizes(await asyncio.to_thread(self.logs.topic_sizes))
                if self._failing:
                    log.info("tenant storage usage: the storage can be read again")
                self._failing = False
            except Exception as exc:  # the database is away: try again next interval
                if not self._failing:
                    log.warning("tenant storage usage: cannot sum the partitions' sizes: "
                                "%s", exc)
                self._failing = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), self.interval_s)
