"""Where the brokers behind Envoy come from: a broker config, route specs, a brokers file,
the cluster registry.

* A broker configuration (``--config``/``--set``, the broker's own keys) describes *this*
  broker: its ``brokerId``, and one listener (the first, or one named) whose advertised
  address is Envoy's and whose bind address is where Envoy forwards.
* ``ID=ADVERTISED_HOST:PORT@INTERNAL_HOST:PORT`` specs describe other brokers.
* A brokers file holds such specs, one per line; blank lines and ``#`` comments are
  skipped.  The ADS server watches it.
* The registry of a cluster (the brokers registered in their shared database) gives every
  live broker, each through its listener of one name, read the same way as a config's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from broker_core.storage.cluster import BrokerRecord
from edge.config import BrokerConfig
from edge.envoy.model import BrokerRoute, EnvoyConfigError
from listeners.hosts import is_wildcard

__all__ = ["local_broker", "read_brokers_file", "registry_routes", "routes_from_registry",
           "routes_from_specs"]


def _forward_host(bind_host: str) -> str:
    """Where Envoy reaches a listener bound to ``bind_host``: a wildcard on loopback (Envoy
    on the broker's host), any other host as it is."""
    if not is_wildcard(bind_host):
        return bind_host
    return "::1" if ":" in bind_host else "127.0.0.1"


def local_broker(config: BrokerConfig, listener_name: str | None = None) -> BrokerRoute:
    """The route of the broker ``config`` describes, through ``listener_name`` (or the first).

    The listener must have a fixed port and advertise an address other than its own bind
    address (Envoy's).  A wildcard bind host is reached on loopback (Envoy on the same
    host as the broker); describe the broker with a spec otherwise.
    """
    specs = config.listener_specs()
    spec = specs[_listener_index([s.name for s in specs], listener_name, "this broker")]
    if spec.port == 0:
        raise EnvoyConfigError(
            f"listener {spec.name}: port 0 cannot be proxied; give the listener a fixed port"
        )
    if spec.advertised_defaulted:
        raise EnvoyConfigError(
            f"listener {spec.name}: set kafkaAdvertisedListeners to Envoy's address for it"
            f" (it advertises its own bind address {spec.bind_address})"
        )
    return BrokerRoute(config.broker_id, spec.advertised_host, spec.advertised_port,
                       _forward_host(spec.host), spec.port)


def routes_from_registry(records: Iterable[BrokerRecord],
                         listener_name: str | None = None) -> list[BrokerRoute]:
    """A route for each registered broker, through its listener ``listener_name`` (or its
    first): the advertised address is Envoy's, the bound one where Envoy forwards (a
    wildcard bind host is reached on loopback, as in :func:`local_broker`); the first
    broker that has no such route raises EnvoyConfigError."""
    routes, refused = registry_routes(records, listener_name)
    if refused:
        raise EnvoyConfigError(next(iter(refused.values())))
    return routes


def registry_routes(records: Iterable[BrokerRecord], listener_name: str | None = None
                    ) -> tuple[list[BrokerRoute], dict[int, str]]:
    """Like :func:`routes_from_registry`, each broker on its own: the routes, and why each
    broker without one has none (by broker id)."""
    routes, refused = [], {}
    for record in records:
        try:
            names = [a.name for a in record.listeners]
            address = record.listeners[_listener_index(names, listener_name,
                                                       f"broker {record.broker_id}")]
            routes.append(BrokerRoute(record.broker_id, address.host, address.port,
                                      _forward_host(address.bind_host),
                                      address.bind_port))
        except EnvoyConfigError as exc:
            refused[record.broker_id] = str(exc)
    return routes, refused


def _listener_index(names: Sequence[str], wanted: str | None, whose: str) -> int:
    """The position of the listener called ``wanted`` (any case) among ``names``, or 0."""
    if wanted is None and names:
        return 0
    upper = (wanted or "").upper()
    if upper in names:
        return names.index(upper)
    have = ", ".join(names) or "none"
    raise EnvoyConfigError(f"no listener named {wanted!r} on {whose} (it has {have})")


def routes_from_specs(specs: Iterable[str]) -> list[BrokerRoute]:
    """Parse ``ID=ADVERTISED@INTERNAL`` specs."""
    return [BrokerRoute.parse(text) for text in specs]


def read_brokers_file(path: str | Path) -> list[BrokerRoute]:
    """The routes listed in a brokers file (one ``ID=ADVERTISED@INTERNAL`` per line)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EnvoyConfigError(f"cannot read brokers file {str(path)!r}: {exc}") from None
    routes: list[BrokerRoute] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.split("#", 1)[0].strip()
        if not stripped:
            continue
        try:
            routes.append(BrokerRoute.parse(stripped))
        except EnvoyConfigError as exc:
            raise EnvoyConfigError(f"{path}, line {number}: {exc}") from None
    return routes
