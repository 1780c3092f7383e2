"""Where the brokers behind Envoy come from: a broker config, route specs, a brokers file.

* A broker configuration (``--config``/``--set``, the broker's own keys) describes *this*
  broker: its ``brokerId``, and one listener (the first, or one named) whose advertised
  address is Envoy's and whose bind address is where Envoy forwards.
* ``ID=ADVERTISED_HOST:PORT@INTERNAL_HOST:PORT`` specs describe other brokers.
* A brokers file holds such specs, one per line; blank lines and ``#`` comments are
  skipped.  The ADS server watches it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from edge.config import BrokerConfig
from edge.envoy.model import BrokerRoute, EnvoyConfigError

__all__ = ["local_broker", "read_brokers_file", "routes_from_specs"]

_LOOPBACK_FOR = {"0.0.0.0": "127.0.0.1", "::": "::1"}


def local_broker(config: BrokerConfig, listener_name: str | None = None) -> BrokerRoute:
    """The route of the broker ``config`` describes, through ``listener_name`` (or the first).

    The listener must have a fixed port and advertise an address other than its own bind
    address (Envoy's).  A wildcard bind host is reached on loopback (Envoy on the same
    host as the broker); describe the broker with a spec otherwise.
    """
    specs = config.listener_specs()
    if listener_name is None:
        spec = specs[0]
    else:
        wanted = listener_name.upper()
        found = [s for s in specs if s.name == wanted]
        if not found:
            names = ", ".join(s.name for s in specs)
            raise EnvoyConfigError(f"no broker listener named {listener_name!r} (have {names})")
        spec = found[0]
    if spec.port == 0:
        raise EnvoyConfigError(
            f"listener {spec.name}: port 0 cannot be proxied; give the listener a fixed port"
        )
    if spec.advertised_defaulted:
        raise EnvoyConfigError(
            f"listener {spec.name}: set kafkaAdvertisedListeners to Envoy's address for it"
            f" (it advertises its own bind address {spec.bind_address})"
        )
    internal_host = _LOOPBACK_FOR.get(spec.host, spec.host)
    return BrokerRoute(config.broker_id, spec.advertised_host, spec.advertised_port,
                       internal_host, spec.port)


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
