"""The cluster registry as an input of the plan: the live brokers of a shared database.

Brokers sharing a PostgreSQL ``storageUrl`` register there with a lease
(``broker_core.storage.pg_cluster``).  :class:`RegistryBrokers` reads the live ones, read
only, and gives a route for each through one listener name
(:func:`~edge.envoy.brokers.routes_from_registry`).  Its :meth:`~RegistryBrokers.fingerprint`
changes when a broker joins, leaves or moves a listener, and names the cause while the
database cannot be read, so the ADS server reloads (and logs) once per change or cause.
"""

from __future__ import annotations

import hashlib

from broker_core.storage.cluster import BrokerRecord
from broker_core.storage.errors import DatabaseUnavailable
from broker_core.storage.pg_cluster import RegistryReader
from broker_core.storage.postgres import public_url
from edge.envoy.brokers import registry_routes, routes_from_registry
from edge.envoy.model import BrokerRoute, EnvoyConfigError

__all__ = ["RegistryBrokers"]

_SCHEMES = ("postgres", "postgresql")


class RegistryBrokers:
    """The live brokers registered in the database ``url``, through listener ``listener``
    (None: each broker's first)."""

    def __init__(self, url: str, listener: str | None = None) -> None:
        scheme = url.partition("://")[0].lower()
        if scheme not in _SCHEMES:
            raise EnvoyConfigError(
                f"--registry {public_url(url)!r}: expected the brokers' postgres:// storageUrl")
        self.url = url
        self.listener = listener
        self._reader = RegistryReader(url)

    @property
    def where(self) -> str:
        """The registry's URL without its password (for messages)."""
        return public_url(self.url)

    def _live(self) -> list[BrokerRecord]:
        try:
            return self._reader.live()
        except DatabaseUnavailable as exc:
            raise EnvoyConfigError(f"broker registry {self.where}: {exc.strerror}") from None

    def routes(self) -> list[BrokerRoute]:
        """A route per live broker, read now; EnvoyConfigError if the database cannot be
        read or a broker lacks the listener."""
        records = self._live()
        try:
            return routes_from_registry(records, self.listener)
        except EnvoyConfigError as exc:
            raise EnvoyConfigError(f"broker registry {self.where}: {exc}") from None

    def routes_each(self) -> tuple[list[BrokerRoute], dict[int, str]]:
        """Each live broker on its own: the routes, and why a broker has none (by id);
        EnvoyConfigError only if the database cannot be read."""
        return registry_routes(self._live(), self.listener)

    def fingerprint(self) -> str:
        """A digest of the live brokers and their listeners, or the reason they cannot be
        read (the same while the reason stays)."""
        try:
            records = self._live()
        except EnvoyConfigError as exc:
            return f"unreadable: {exc}"
        return hashlib.sha256(repr(records).encode()).hexdigest()

    def close(self) -> None:
        self._reader.close()
