"""The inputs of a plan, re-readable: the broker config, broker specs, a brokers file, the
cluster registry.

:class:`PlanSource` turns its inputs into an :class:`EnvoyPlan` on every :meth:`load`
(so a changed file or registry gives a changed plan) and reports a :meth:`fingerprint` of
the files it reads (content digests) and of the registry's live brokers, which the ADS
server polls to notice changes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from edge.config import ConfigError, load_config
from edge.envoy.brokers import local_broker, read_brokers_file, routes_from_specs
from edge.envoy.model import BrokerRoute, EdgeOptions, EnvoyConfigError, EnvoyPlan
from edge.envoy.registry import RegistryBrokers

__all__ = ["REGISTRY", "PlanSource"]

REGISTRY = "registry"
"""The fingerprint entry of the registry."""


@dataclass(frozen=True)
class PlanSource:
    """Where the brokers come from, plus the edge options.

    The broker described by ``config_path``/``overrides`` (when either is given) comes
    first, then ``broker_specs``, then the lines of ``brokers_file``, then the live brokers
    of ``registry``.
    """

    config_path: str | None = None
    overrides: tuple[str, ...] = ()
    listener: str | None = None
    broker_specs: tuple[str, ...] = ()
    brokers_file: str | None = None
    registry: RegistryBrokers | None = field(default=None, compare=False)
    options: EdgeOptions = field(default_factory=EdgeOptions)

    @property
    def describes_brokers(self) -> bool:
        """Whether any broker input is given."""
        return bool(self.config_path or self.overrides or self.broker_specs
                    or self.brokers_file or self.registry)

    def routes(self) -> list[BrokerRoute]:
        """Every broker route, read now."""
        routes: list[BrokerRoute] = []
        if self.config_path is not None or self.overrides:
            try:
                config = load_config(self.config_path, self.overrides)
            except ConfigError as exc:
                raise EnvoyConfigError(f"broker configuration: {exc}") from None
            routes.append(local_broker(config, self.listener))
        routes += routes_from_specs(self.broker_specs)
        if self.brokers_file is not None:
            routes += read_brokers_file(self.brokers_file)
        if self.registry is not None:
            routes += self.registry.routes()
        return routes

    def load(self) -> EnvoyPlan:
        """The plan, read now; raises EnvoyConfigError naming what is wrong."""
        return EnvoyPlan(tuple(self.routes()), self.options)

    def load_or_empty(self) -> EnvoyPlan | None:
        """Like :meth:`load`, but None when the inputs describe no broker at all."""
        routes = self.routes()
        return EnvoyPlan(tuple(routes), self.options) if routes else None

    def load_each(self) -> tuple[EnvoyPlan | None, dict[int, str]]:
        """Like :meth:`load_or_empty`, but a registry broker that cannot be routed (no
        such listener, an address that conflicts with a broker before it or with Envoy's
        own, ...) is left out rather than failing the whole plan, so one misconfigured
        broker does not freeze the routes of all the others: the plan, and why each
        broker left out is (by id). What the operator wrote (config, specs, a brokers
        file) still fails as a whole."""
        if self.registry is None:
            return self.load_or_empty(), {}
        fixed = replace(self, registry=None).routes()
        candidates, left_out = self.registry.routes_each()
        accepted = list(fixed)
        if accepted:
            EnvoyPlan(tuple(accepted), self.options)  # the operator's part must hold
        for route in sorted(candidates, key=lambda r: r.broker_id):
            try:
                EnvoyPlan((*accepted, route), self.options)
            except EnvoyConfigError as exc:
                left_out[route.broker_id] = str(exc)
                continue
            accepted.append(route)
        plan = EnvoyPlan(tuple(accepted), self.options) if accepted else None
        return plan, left_out

    def watched_files(self) -> list[Path]:
        return [Path(p) for p in (self.config_path, self.brokers_file) if p is not None]

    def fingerprint(self) -> Sequence[tuple[str, str]]:
        """(path, SHA-256 of the content) of every watched file ("missing" if unreadable),
        then (:data:`REGISTRY`, the registry's fingerprint) when there is one."""
        result = []
        for path in self.watched_files():
            try:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            except OSError:
                digest = "missing"
            result.append((str(path), digest))
        if self.registry is not None:
            result.append((REGISTRY, self.registry.fingerprint()))
        return result
