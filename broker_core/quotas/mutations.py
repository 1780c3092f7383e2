"""KIP-599's controller mutation quota: ``controller_mutation_rate``, the partitions a
caller may create or delete per second, enforced as Kafka's controller enforces it.

What counts: a topic CreateTopics creates counts its partitions, CreatePartitions the
partitions it adds, DeleteTopics the deleted topic's partitions; a request that only
validates (``validate_only``) and a topic refused for another reason count nothing. Each
quota applying to the caller (the most specific one and the tenant's own as a ceiling,
``entities.resolve``) has a token bucket per sharer (``rates.TokenBucket``: a burst of the
quota x ``quotaWindowNum`` x ``quotaWindowSizeSeconds``, refilled at the quota).

Two answers, by request version (:data:`STRICT_SINCE`), as in Kafka:

* strict (CreateTopics v6+, CreatePartitions v3+, DeleteTopics v5+): a topic is checked
  before it is counted, so a request is accepted while no bucket is below zero, and may
  take one below; once one is, each further topic answers THROTTLING_QUOTA_EXCEEDED and
  the answer's ``throttle_time_ms`` is the time until the bucket is back at zero;
* permissive (older versions, whose clients do not know that error): every topic is
  counted and done, and an answer that leaves a bucket below zero carries the time until
  it is back at zero.

Either way the connection is then not read for that time (KIP-219: the dispatcher mutes it
for the ``throttle_time_ms`` the answer carries, ``throttling.with_throttle``), and the
throttle is told to the quota observer (metrics, one audit event per window). The
mutations are also measured as a sliding rate for the quota metrics (Kafka's
``mutation-rate``). Buckets are this broker's, as all its rates; clients send these
requests to the controller Metadata names, so on a cluster one broker sees them.
"""

from __future__ import annotations

import time

from broker_core.context import RequestContext
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.quotas.entities import CONTROLLER_MUTATION_RATE, Applied, Caller
from broker_core.quotas.manager import QuotaManager, Throttle, caller_of
from broker_core.quotas.rates import TokenBucket

CREATE_TOPICS_KEY = 19
DELETE_TOPICS_KEY = 20
CREATE_PARTITIONS_KEY = 37
STRICT_SINCE = {CREATE_TOPICS_KEY: 6, DELETE_TOPICS_KEY: 5, CREATE_PARTITIONS_KEY: 3}
"""The first version of each mutating API whose topics answer THROTTLING_QUOTA_EXCEEDED
(KIP-599); older versions are done and their answer throttled."""
_MAX_BUCKETS = 10_000
"""Buckets kept before full ones (which a new bucket equals) are forgotten."""


class MutationQuotas:
    """The token buckets of every sharer of a ``controller_mutation_rate`` quota."""

    def __init__(self, manager: QuotaManager) -> None:
        self.manager = manager
        self._buckets: dict[tuple[str, ...], TokenBucket] = {}

    def begin(self, ctx: RequestContext, api_key: int, version: int) -> MutationQuota:
        """The quota of one request of ``ctx`` to the mutating API ``api_key``."""
        who = caller_of(ctx)
        applied = self.manager.applied(who).get(CONTROLLER_MUTATION_RATE, ()) \
            if self.manager.active else ()
        return MutationQuota(self, ctx, who, applied, version >= STRICT_SINCE[api_key])

    def bucket(self, shared_by: tuple[str, ...], now: float) -> TokenBucket:
        """The bucket of ``shared_by`` (a new one is full)."""
        found = self._buckets.get(shared_by)
        if found is None:
            if len(self._buckets) >= _MAX_BUCKETS:
                self._buckets = {k: b for k, b in self._buckets.items() if not b.full(now)}
            found = self._buckets[shared_by] = TokenBucket(self.manager.window)
        return found


class MutationQuota:
    """One request's partition mutations against its caller's quotas."""

    def __init__(self, quotas: MutationQuotas | None, ctx: RequestContext, who: Caller,
                 applied: tuple[Applied, ...], strict: bool) -> None:
        self.quotas = quotas
        self.ctx = ctx
        self.who = who
        self.applied = applied
        self.strict = strict
        self.throttle: Throttle | None = None
        """The longest throttle the request earned."""

    def _over(self, quotas: MutationQuotas, now: float) -> Throttle | None:
        """The quota whose bucket is furthest below zero, if any is."""
        longest: Throttle | None = None
        for quota in self.applied:
            delay = quotas.bucket(quota.shared_by, now).throttle_ms(quota.value, now)
            if delay > 0 and (longest is None or delay > longest.throttle_ms):
                longest = Throttle(self.who, CONTROLLER_MUTATION_RATE, quota.value,
                                   quota.shared_by, delay)
        return longest

    def _earned(self, throttle: Throttle | None) -> None:
        if throttle is not None and (self.throttle is None
                                     or throttle.throttle_ms > self.throttle.throttle_ms):
            self.throttle = throttle

    def record(self, partitions: int, now: float | None = None) -> None:
        """Count ``partitions`` mutations of one topic, about to be done; strict, a
        KafkaApiError THROTTLING_QUOTA_EXCEEDED instead while a bucket is below zero."""
        quotas = self.quotas
        if quotas is None or not self.applied:
            return
        now = time.monotonic() if now is None else now
        if self.strict:
            over = self._over(quotas, now)
            if over is not None:
                self._earned(over)
                raise KafkaApiError(
                    ErrorCode.THROTTLING_QUOTA_EXCEEDED,
                    f"{CONTROLLER_MUTATION_RATE} {over.quota:g} of {'/'.join(over.shared_by)}"
                    f" exceeded: retry after {over.throttle_ms} ms")
        for quota in self.applied:
            quotas.bucket(quota.shared_by, now).take(partitions, quota.value, now)
        # the mutation rate the quota metrics show
        quotas.manager.charge_caller(self.who, CONTROLLER_MUTATION_RATE, partitions, now)
        if not self.strict:
            self._earned(self._over(quotas, now))

    def throttle_ms(self) -> int:
        """The answer's ``throttle_time_ms`` (told to the quota observer when not 0)."""
        if self.throttle is None or self.quotas is None:
            return 0
        observer = self.quotas.manager.observer
        if observer is not None:
            observer.throttled(self.ctx, self.throttle)
        return self.throttle.throttle_ms


def begin(quotas: MutationQuotas | None, ctx: RequestContext, api_key: int,
          version: int) -> MutationQuota:
    """The quota of a request to a mutating API (``quotas`` None: a broker without quotas,
    which counts nothing)."""
    if quotas is None:
        return MutationQuota(None, ctx, caller_of(ctx), (), False)
    return quotas.begin(ctx, api_key, version)
