"""The caps of a whole tenant beyond rates: ``max_topics``, ``max_partitions`` and
``max_stored_bytes`` (each the tenant's own value: its tenant quota, the default tenant's,
or the configured default).

Topics and partitions are counted from the storage's topic list when a topic or
partitions are created (rare): beyond a cap the request answers POLICY_VIOLATION, as a
Kafka create-topic policy does. Stored bytes are the sizes the storage already keeps
per partition, summed per tenant every ``interval_s`` (:meth:`TenantLimits.refresh_due`),
with each produced batch added in between; a produce while the tenant stores its
``max_stored_bytes`` or more answers KAFKA_STORAGE_ERROR, as Kafka answers when its disk
is full, for that tenant only. It recovers once DeleteRecords, retention or a deleted
topic bring the next sum under the cap. The broker's own topics count for nobody.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.quotas.entities import MAX_PARTITIONS, MAX_STORED_BYTES, MAX_TOPICS
from broker_core.quotas.manager import QuotaManager
from broker_core.quotas.notices import Notices
from broker_core.storage import Storage

log = logging.getLogger(__name__)


def tenant_of(internal: str) -> str:
    """The tenant of an internal topic name (``tenant/namespace/topic``)."""
    return internal.partition("/")[0]


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
        self._summed_at = float("-inf")
        self.notices = Notices(log, manager.window.span_s)

    def _cap(self, tenant: str, key: str) -> int | None:
        value = self.manager.tenant_value(tenant, key)
        return None if value is None else int(value)

    def counts(self, tenant: str) -> tuple[int, int]:
        """The tenant's topics and partitions (the broker's own not counted)."""
        topics = partitions = 0
        for topic in self.logs.topics():
            if tenant_of(topic.name) == tenant and not self.is_internal(topic.name):
                topics += 1
                partitions += topic.num_partitions
        return topics, partitions

    def check_create(self, internal: str, topics: int, partitions: int) -> None:
        """POLICY_VIOLATION when ``topics`` new topics with ``partitions`` partitions in
        all would take the topic's tenant beyond its ``max_topics`` or ``max_partitions``."""
        tenant = tenant_of(internal)
        max_topics, max_partitions = self._cap(tenant, MAX_TOPICS), self._cap(
            tenant, MAX_PARTITIONS)
        if max_topics is None and max_partitions is None:
            return
        have_topics, have_partitions = self.counts(tenant)
        for key, cap, have, more, what in (
                (MAX_TOPICS, max_topics, have_topics, topics, "topics"),
                (MAX_PARTITIONS, max_partitions, have_partitions, partitions, "partitions")):
            if cap is not None and more > 0 and have + more > cap:
                raise KafkaApiError(ErrorCode.POLICY_VIOLATION,
                                    f"tenant {tenant} has {have} {what}; {more} more would "
                                    f"exceed its {key} of {cap}")

    def check_produce(self, internal: str, size: int) -> None:
        """KAFKA_STORAGE_ERROR when the topic's tenant stores its ``max_stored_bytes``;
        otherwise ``size`` bytes are counted for it."""
        tenant = tenant_of(internal)
        cap = self._cap(tenant, MAX_STORED_BYTES)
        used = self.stored.get(tenant, 0)
        if cap is not None and used >= cap:
            self.notices.warn((MAX_STORED_BYTES, tenant), (
                f"tenant {tenant} stores {used} bytes, its {MAX_STORED_BYTES} is {cap}: "
                "its produces answer KAFKA_STORAGE_ERROR"))
            raise KafkaApiError(ErrorCode.KAFKA_STORAGE_ERROR,
                                f"tenant {tenant} has reached its storage quota "
                                f"({MAX_STORED_BYTES} {cap})")
        self.stored[tenant] = used + size

    def refresh_due(self, now: float | None = None) -> None:
        """Sum the partitions' sizes per tenant again, once ``interval_s`` has passed."""
        now = time.monotonic() if now is None else now
        if now - self._summed_at < self.interval_s:
            return
        self._summed_at = now
        stored: dict[str, int] = {}
        for name, _index, partition in self.logs.all_partitions():
            if not self.is_internal(name):
                tenant = tenant_of(name)
                stored[tenant] = stored.get(tenant, 0) + partition.size_bytes
        self.stored = stored
