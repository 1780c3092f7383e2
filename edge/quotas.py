"""Client quotas at the edge: who may manage which, per-tenant metrics, throttle audits.

The tenant boundary (:class:`TenantScope`): superusers, and connections without a tenant
login (only the ACLs apply to them), see and alter every quota. A tenant's login sees the
quotas of its own tenant and of its namespaces, and alters those of its namespaces only:
the quota of the tenant itself, and the user, client-id and default quotas (which cross
tenants), are the operator's. Beyond that scope the answer is CLUSTER_AUTHORIZATION_FAILED.

:class:`ConnectionGate` refuses connections over the quotas on new connections: per
``ip`` when accepted, per caller and tenant (``connection_creation_rate``,
``max_connections``, counted over every broker of a cluster) once the broker knows who
connects (its login; on a listener without SASL, its first request). One log line per
quota and sharer per quota window.

:class:`QuotaEvents` counts bytes and throttles per tenant for ``/metrics`` and writes
audit events (kind ``quota``): a throttled request (outcome ``throttled``), and a
connection, produce, topic or partitions refused over a quota (outcome ``refused``:
``connection_creation_rate``, ``max_connections``, ``max_stored_bytes``, ``max_topics``,
``max_partitions``). Only the first of each outcome, quota and sharer per quota window
(``quotaWindowNum`` x ``quotaWindowSizeSeconds``) is written, its reason counting the
ones left out since, so a client hammering past its quota cannot flood the audit topic.
:class:`TenantUsageCollector` shows, per tenant and quota, what the tenant uses of its own
quota at scrape time.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping

from prometheus_client import Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from broker_core.context import RequestContext
from broker_core.loop_metrics import CounterFamily, LoopCounter
from broker_core.quotas.admission import Admission
from broker_core.quotas.entities import (
    CONNECTION_CREATION_RATE,
    CONSUMER_BYTE_RATE,
    IP,
    MAX_CONNECTIONS,
    MAX_PARTITIONS,
    MAX_STORED_BYTES,
    MAX_TOPICS,
    NAMESPACE,
    PRODUCER_BYTE_RATE,
    Caller,
    QuotaEntity,
)
from broker_core.quotas.limits import TenantLimits
from broker_core.quotas.manager import QuotaManager, Refused, Throttle
from broker_core.quotas.notices import Intervals, Notices
from edge.audit import AuditEvent, AuditLog
from edge.authorization import Policy
from listeners.server import ConnectionInfo, ConnectionRefused, FrameError
from sasl.printable import printable

log = logging.getLogger(__name__)
_NAME_LIMIT = 100

TENANT_BYTES = CounterFamily("kop_server_tenant_bytes",
                             "Record bytes produced (in) and fetched (out), by tenant.",
                             ["tenant", "direction"])
THROTTLE_SECONDS = Counter("kop_server_quota_throttle_seconds",
                           "Throttle time given to requests over a quota, by tenant and quota.",
                           ["tenant", "quota"])
THROTTLED = Counter("kop_server_quota_throttled_requests",
                    "Requests answered with a throttle time, by tenant and quota.",
                    ["tenant", "quota"])
_DIRECTIONS = {PRODUCER_BYTE_RATE: "in", CONSUMER_BYTE_RATE: "out"}
_MAX_ENTITIES = 10_000


class TenantScope:
    """Implements the quota APIs' ``QuotaScope`` with the broker's tenant policy."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def _operator(self, ctx: RequestContext) -> bool:
        return self.policy.is_operator(ctx)

    def may_see(self, ctx: RequestContext, entity: QuotaEntity) -> bool:
        """Operators see all; a tenant its own tenant's and namespaces' quotas."""
        return self._operator(ctx) or entity.tenant == ctx.login_tenant

    def may_alter(self, ctx: RequestContext, entity: QuotaEntity) -> bool:
        """Operators alter all; a tenant the quotas of its own namespaces."""
        if self._operator(ctx):
            return True
        has_namespace, _ = entity.get(NAMESPACE)
        return has_namespace and entity.tenant == ctx.login_tenant


class QuotaEvents:
    """Implements ``QuotaObserver``: metrics per tenant and bounded quota audits."""

    def __init__(self, audit: AuditLog, window_s: float) -> None:
        self.audit = audit
        self.intervals = Intervals(window_s)
        self.throttle_s: dict[tuple[tuple[str, ...], str], float] = {}
        """Throttle time given per sharer of a quota and key (a metrics scrape reads it)."""
        self._tenant_bytes: dict[tuple[str, str], LoopCounter] = {}
        """The labelled children of ``TENANT_BYTES`` (a produce request counts here)."""

    def charged(self, who: Caller, key: str, amount: float) -> None:
        """Count produced and fetched bytes per tenant."""
        direction = _DIRECTIONS.get(key)
        if direction is not None and amount:
            labels = (who.tenant, direction)
            child = self._tenant_bytes.get(labels)
            if child is None:
                child = self._tenant_bytes[labels] = TENANT_BYTES.labels(*labels)
            child.inc(amount)

    def throttled(self, ctx: RequestContext, throttle: Throttle) -> None:
        """Count the throttle; audit the first one per quota and sharer per window."""
        tenant = throttle.who.tenant
        THROTTLE_SECONDS.labels(tenant, throttle.key).inc(throttle.throttle_ms / 1000)
        THROTTLED.labels(tenant, throttle.key).inc()
        mark = (throttle.shared_by, throttle.key)
        if mark not in self.throttle_s and len(self.throttle_s) >= _MAX_ENTITIES:
            self.throttle_s = {}  # a counter reset, rather than unbounded memory
        self.throttle_s[mark] = self.throttle_s.get(mark, 0.0) + throttle.throttle_ms / 1000
        since = self.intervals.due(("throttled", throttle.key, throttle.shared_by))
        if since is None:
            return
        self.audit.record(AuditEvent(
            kind="quota", outcome="throttled", listener=ctx.listener,
            client=ctx.client_host, principal=ctx.principal, tenant=tenant, api=ctx.api,
            resource="/".join(throttle.shared_by),
            reason=f"{throttle.key} {throttle.quota:g} exceeded: throttled "
                   f"{throttle.throttle_ms} ms{_since(since)}"))

    def refused(self, refused: Refused) -> None:
        """Audit the first refusal per quota and sharer per window."""
        since = self.intervals.due(("refused", refused.key, refused.shared_by))
        if since is None:
            return
        self.audit.record(AuditEvent(
            kind="quota", outcome="refused", listener=refused.listener,
            client=refused.client, principal=refused.principal, tenant=refused.tenant,
            api=refused.api, resource="/".join(refused.shared_by),
            reason=f"{refused.what} refused: {refused.reason}{_since(since)}"))


def _since(left_out: int) -> str:
    return f" ({left_out} more like it since the last event)" if left_out else \
        " (first of this window)"


class ConnectionGate:
    """Admits connections against the quotas on new connections."""

    def __init__(self, manager: QuotaManager, window_s: float,
                 elsewhere: Callable[[str], int] = lambda tenant: 0,
                 reserve: Callable[[str, int, int], Awaitable[bool]] | None = None) -> None:
        self.manager = manager
        self.admission = Admission(manager, elsewhere, reserve)
        self.notices = Notices(log, window_s)

    def _refused(self, refused: Refused) -> None:
        if self.manager.observer is not None:
            self.manager.observer.refused(refused)

    def accepted(self, listener: str, peer: str) -> None:
        """A connection of ``peer`` just accepted on ``listener``, before its TLS
        handshake: ConnectionRefused when its address is over its
        ``connection_creation_rate``."""
        ip = peer.rsplit(":", 1)[0]
        quota = self.manager.connect_from(ip)
        if quota is not None:
            reason = f"connection_creation_rate {quota:g} of ip {ip} reached"
            self.notices.warn((IP, ip), f"refusing connection from {peer} on {listener}: "
                                        f"{reason}")
            self._refused(Refused(CONNECTION_CREATION_RATE, quota, (IP, ip), "connection",
                                  None, reason, listener, peer))
            raise ConnectionRefused(ip)

    async def admit(self, who: Caller, info: ConnectionInfo) -> None:
        """Admit a connection of ``who``; FrameError (the connection is closed) when it is
        over the caller's ``connection_creation_rate`` or its tenant's
        ``max_connections`` (over the whole cluster)."""
        refusal = await self.admission.admit_in_cluster(who)
        if refusal is None:
            return
        self.notices.warn((refusal.key, refusal.shared_by), (
            f"closing connection from {info.peer} on {info.listener} of "
            f"{printable(who.user, _NAME_LIMIT)} (client id "
            f"{printable(who.client_id, _NAME_LIMIT)}, tenant {who.tenant}): "
            f"{printable(str(refusal), 2 * _NAME_LIMIT)}"))
        self._refused(Refused(refusal.key, refusal.quota, refusal.shared_by, "connection",
                              who.tenant, f"{refusal} (client id "
                              f"{printable(who.client_id, _NAME_LIMIT)})", info.listener,
                              info.peer, who.user))
        raise FrameError(str(refusal), logged=True)

    def release(self, who: Caller) -> None:
        """An admitted connection closed."""
        self.admission.release(who)


class TenantUsageCollector(Collector):
    """``kop_server_tenant_quota_usage``, ``kop_server_tenant_quota_limit`` and
    ``kop_server_tenant_quota_usage_ratio`` per tenant and quota key: each tenant's
    measured rates (over the tenant's whole traffic) and its open connections (on every
    broker of a cluster, as last published), topics,
    partitions and stored bytes, beside the tenant's own quota where it has one."""

    def __init__(self, manager: QuotaManager, limits: TenantLimits, gate: ConnectionGate,
                 elsewhere: Callable[[], Mapping[str, int]] = dict) -> None:
        self.manager = manager
        self.limits = limits
        self.gate = gate
        self.elsewhere = elsewhere

    def _usage(self) -> Iterator[tuple[str, str, float]]:
        yield from self.manager.tenant_rates()
        here, elsewhere = dict(self.gate.admission.open), dict(self.elsewhere())
        for tenant in here.keys() | elsewhere.keys():
            yield tenant, MAX_CONNECTIONS, here.get(tenant, 0) + elsewhere.get(tenant, 0)
        stored = dict(self.limits.stored)
        for tenant, used in stored.items():
            yield tenant, MAX_STORED_BYTES, used
        counts = self.limits.topic_counts()  # every tenant in one pass, if any is capped
        for tenant in stored:
            if self.manager.tenant_value(tenant, MAX_TOPICS) is not None or \
                    self.manager.tenant_value(tenant, MAX_PARTITIONS) is not None:
                topics, partitions = counts.of(tenant)
                yield tenant, MAX_TOPICS, topics
                yield tenant, MAX_PARTITIONS, partitions

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """One sample per tenant and quota key in use."""
        labels = ["tenant", "quota"]
        usage = GaugeMetricFamily(
            "kop_server_tenant_quota_usage",
            "What a tenant uses, by quota key: bytes, connections or partition mutations per "
            "second and percent of request time over its whole traffic, open connections, "
            "topics, partitions, stored bytes.", labels=labels)
        limit = GaugeMetricFamily("kop_server_tenant_quota_limit",
                                  "The tenant's own quota, by quota key (where it has one).",
                                  labels=labels)
        ratio = GaugeMetricFamily("kop_server_tenant_quota_usage_ratio",
                                  "Usage over the tenant's own quota (1 = at the quota).",
                                  labels=labels)
        for tenant, key, used in self._usage():
            usage.add_metric([tenant, key], used)
            quota = self.manager.tenant_value(tenant, key)
            if quota is not None:
                limit.add_metric([tenant, key], quota)
                ratio.add_metric([tenant, key], used / quota)
        yield from (usage, limit, ratio)


class EntityQuotaCollector(Collector):
    """Per quota entity, as Kafka tags its quota metrics (who shares the measured rate:
    ``user/alice``, ``client-id/app``, ``user/alice/client-id/app``, ``namespace/acme/prod``,
    ``tenant/acme``, ``ip/10.0.0.9``): ``kop_server_quota_entity_usage`` (its measured rate),
    ``kop_server_quota_entity_limit`` (the quota it is measured against) and
    ``kop_server_quota_entity_throttle_seconds_total``. Only entities measured against a
    quota lately appear (idle ones drop out after a window)."""

    def __init__(self, manager: QuotaManager, events: QuotaEvents) -> None:
        self.manager = manager
        self.events = events

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """One sample per entity and quota key."""
        labels = ["entity", "quota"]
        usage = GaugeMetricFamily(
            "kop_server_quota_entity_usage",
            "What a quota entity uses (bytes, connections or partition mutations per second, "
            "percent of request time), by the entity sharing the rate and quota key.",
            labels=labels)
        limit = GaugeMetricFamily("kop_server_quota_entity_limit",
                                  "The quota a quota entity is measured against.",
                                  labels=labels)
        throttled = CounterMetricFamily(
            "kop_server_quota_entity_throttle_seconds",
            "Throttle time given to requests over a quota, by the entity sharing the rate "
            "and quota key.", labels=labels)
        for shared_by, key, used, quota in self.manager.entity_rates():
            entity = "/".join(shared_by)
            usage.add_metric([entity, key], used)
            if quota is not None:
                limit.add_metric([entity, key], quota)
        for (shared_by, key), seconds in list(self.events.throttle_s.items()):
            throttled.add_metric(["/".join(shared_by), key], seconds)
        yield from (usage, limit, throttled)
