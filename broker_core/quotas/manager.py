"""Measuring callers against their quotas: bytes produced, bytes fetched and request
handling time, each on the sliding window of whoever shares the matched quota, and on
the tenant's window against the tenant's own quota (a ceiling, see
``broker_core.quotas.entities``); the longer throttle of the two is the caller's.

A request is always answered; when its caller is over a quota the answer carries
``throttle_time_ms`` and the connection is not read for that long (KIP-219, see
``broker_core.quotas.throttling``). With no quota stored and no per-tenant default
configured, nothing is measured: the hot path pays one check.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from broker_core.context import RequestContext
from broker_core.quotas.entities import (
    CONNECTION_CREATION_RATE,
    IP,
    TENANT,
    Applied,
    Caller,
    ip_value,
    resolve,
    tenant_values,
)
from broker_core.quotas.rates import SlidingRate, Window
from broker_core.quotas.store import Quotas, QuotaStore

KAFKA_WINDOW = Window()
"""Kafka's defaults: 11 samples of one second."""
_MAX_CACHED = 10_000
"""Callers whose resolved quotas are remembered (cleared beyond), and the number of
rates kept before idle ones are dropped."""


@dataclass(frozen=True, slots=True)
class Throttle:
    """A caller held back: the quota key, its value, who shares it, and for how long."""

    who: Caller
    key: str
    quota: float
    shared_by: tuple[str, ...]
    throttle_ms: int


@dataclass(frozen=True, slots=True)
class Refused:
    """Something refused over a quota: the quota key, its value and who shares it, what
    was refused (a connection, a produce, a topic's creation), the tenant it counts for,
    and who asked (what the broker knows of it), and why in words."""

    key: str
    quota: float
    shared_by: tuple[str, ...]
    what: str
    tenant: str | None
    reason: str
    listener: str = ""
    client: str = ""
    principal: str | None = None
    api: str | None = None

    @staticmethod
    def of(ctx: RequestContext | None, key: str, quota: float, shared_by: tuple[str, ...],
           what: str, tenant: str, reason: str) -> Refused:
        """A refusal of a request of ``ctx`` (None: asked by the broker itself)."""
        if ctx is None:
            return Refused(key, quota, shared_by, what, tenant, reason)
        return Refused(key, quota, shared_by, what, tenant, reason, ctx.listener,
                       ctx.client_host, ctx.principal, ctx.api)


class QuotaObserver(Protocol):
    """Who is told about measured traffic, throttles and refusals (metrics, audit)."""

    def charged(self, who: Caller, key: str, amount: float) -> None:
        """``amount`` of ``key``'s quantity was measured for ``who``."""
        ...

    def throttled(self, ctx: RequestContext, throttle: Throttle) -> None:
        """A request of ``ctx`` is answered with a throttle time."""
        ...

    def refused(self, refused: Refused) -> None:
        """A connection, produce or creation was refused over a quota."""
        ...


def caller_of(ctx: RequestContext) -> Caller:
    """The quota identity of a request's caller: its principal, client id, tenant and
    namespace (a connection without a login counts in the broker's default namespace)."""
    return Caller(ctx.principal, ctx.client_id or "", ctx.home.tenant,
                  f"{ctx.home.tenant}/{ctx.home.namespace}")


class QuotaManager:
    """The quotas in force (the store and the configured per-tenant defaults) and the
    rates measured against them."""

    def __init__(self, store: QuotaStore, defaults: Mapping[str, float],
                 window: Window = KAFKA_WINDOW) -> None:
        self.store = store
        self.defaults = {key: value for key, value in defaults.items() if value > 0}
        self.window = window
        self.observer: QuotaObserver | None = None
        self._rates: dict[tuple[str, tuple[str, ...]], SlidingRate] = {}
        self._resolved: dict[Caller, dict[str, tuple[Applied, ...]]] = {}
        self._resolved_for: Quotas | None = None
        self._tenants: dict[str, dict[str, float]] = {}
        self._limits: dict[tuple[str, tuple[str, ...]], float] = {}
        """The quota each rate was last measured against."""

    @property
    def active(self) -> bool:
        """Whether any quota may apply (else nothing is measured)."""
        return bool(self.defaults) or bool(self.store.quotas)

    def _quotas(self) -> Quotas:
        """The stored quotas; what was resolved from older ones is forgotten."""
        quotas = self.store.quotas
        if quotas is not self._resolved_for or len(self._resolved) > _MAX_CACHED \
                or len(self._tenants) > _MAX_CACHED:
            self._resolved, self._tenants, self._resolved_for = {}, {}, quotas
        return quotas

    def applied(self, who: Caller) -> dict[str, tuple[Applied, ...]]:
        """The quotas of each key that apply to ``who`` (the most specific first)."""
        quotas = self._quotas()
        found = self._resolved.get(who)
        if found is None:
            found = self._resolved[who] = resolve(quotas, who, self.defaults)
        return found

    def tenant_value(self, tenant: str, key: str) -> float | None:
        """The tenant's own value of ``key`` (its quota, the default tenant's, the config)."""
        quotas = self._quotas()
        found = self._tenants.get(tenant)
        if found is None:
            found = self._tenants[tenant] = tenant_values(quotas, tenant, self.defaults)
        return found.get(key)

    def max_in_window(self, ctx: RequestContext, key: str) -> float | None:
        """The most of ``key`` the caller of ``ctx`` may take in one request and still be
        within every quota of its own: the smallest quota times the ``samples - 1`` whole
        windows a rate is measured over at least (Kafka's ``maxValueInQuotaWindow``, which
        caps a quota'd consumer's Fetch so one answer can ever pass); None: no quota."""
        if not self.active:
            return None
        applied = self.applied(caller_of(ctx)).get(key)
        if not applied:
            return None
        return min(quota.value for quota in applied) * (self.window.samples - 1) \
            * self.window.size_s

    def connect_from(self, ip: str, now: float | None = None) -> float | None:
        """Count a new connection from ``ip`` against its ``connection_creation_rate``;
        the quota it would exceed (the connection is refused and not counted), if any."""
        quota = ip_value(self.store.quotas, ip) if self.store.quotas else None
        if quota is None:
            return None
        now = time.monotonic() if now is None else now
        rate = self._rate(CONNECTION_CREATION_RATE, (IP, ip), now)
        self._limits[(CONNECTION_CREATION_RATE, (IP, ip))] = quota
        rate.record(1, now)
        if rate.throttle_ms(quota, now) <= 0:
            return None
        rate.record(-1, now)
        return quota

    def charge(self, ctx: RequestContext, key: str, amount: float,
               now: float | None = None) -> Throttle | None:
        """Measure ``amount`` for the caller of ``ctx`` against its ``key`` quota; the
        throttle it earns, if it is over."""
        return self.charge_caller(caller_of(ctx), key, amount, now)

    def charge_caller(self, who: Caller, key: str, amount: float,
                      now: float | None = None) -> Throttle | None:
        """Measure ``amount`` for ``who`` against each of its ``key`` quotas; the longest
        throttle it earns, if it is over any."""
        if self.observer is not None:
            self.observer.charged(who, key, amount)
        applied = self.applied(who).get(key)
        if not applied:
            return None
        now = time.monotonic() if now is None else now
        longest: Throttle | None = None
        for quota in applied:
            rate = self._rate(key, quota.shared_by, now)
            self._limits[(key, quota.shared_by)] = quota.value
            rate.record(amount, now)
            delay = rate.throttle_ms(quota.value, now)
            if delay > 0 and (longest is None or delay > longest.throttle_ms):
                longest = Throttle(who, key, quota.value, quota.shared_by, delay)
        return longest

    def uncharge(self, throttle: Throttle, amount: float, now: float | None = None) -> None:
        """Take back ``amount`` measured for a request answered without it (a throttled
        Fetch is answered empty, as Kafka answers it), from every rate it was charged to."""
        now = time.monotonic() if now is None else now
        for quota in self.applied(throttle.who).get(throttle.key, ()):
            rate = self._rates.get((throttle.key, quota.shared_by))
            if rate is not None:
                rate.record(-amount, now)

    def tenant_rates(self, now: float | None = None) -> list[tuple[str, str, float]]:
        """(tenant, key, measured per second) of every rate a whole tenant shares; safe
        to call from another thread (a metrics scrape)."""
        now = time.monotonic() if now is None else now
        return [(shared_by[1], key, rate.peek(now))
                for (key, shared_by), rate in list(self._rates.items())
                if shared_by[0] == TENANT]

    def entity_rates(self, now: float | None = None
                     ) -> list[tuple[tuple[str, ...], str, float, float | None]]:
        """(who shares it, key, measured per second, its quota) of every rate measured
        against a quota (a user's, a client id's, a namespace's, a tenant's: Kafka's quota
        metric tags); safe to call from another thread (a metrics scrape)."""
        now = time.monotonic() if now is None else now
        limits = dict(self._limits)
        return [(shared_by, key, rate.peek(now), limits.get((key, shared_by)))
                for (key, shared_by), rate in list(self._rates.items())]

    def _rate(self, key: str, shared_by: tuple[str, ...], now: float) -> SlidingRate:
        found = self._rates.get((key, shared_by))
        if found is None:
            if len(self._rates) >= _MAX_CACHED:
                self._forget_idle(now)
            found = self._rates[(key, shared_by)] = SlidingRate(self.window)
        return found

    def _forget_idle(self, now: float) -> None:
        """Drop rates unused for a whole window (they measure zero again anyway)."""
        span = self.window.span_s
        self._rates = {k: r for k, r in self._rates.items() if now - r.last_used < span}
        self._limits = {k: v for k, v in self._limits.items() if k in self._rates}
