"""Connections admitted against the quotas, once the broker knows who is connecting.

``connection_creation_rate`` resolves like every rate (user and client id, namespace,
then the tenant's own value as a ceiling), and ``max_connections`` is a cap on a tenant's
open connections, on every broker of a cluster: first this broker's own count plus what
the others published with their latest heartbeats (``elsewhere``), then, in
:meth:`Admission.admit_in_cluster`, the cluster's registry confirms the new count against
what every broker published, under a lock per tenant (``reserve``): two brokers admitting
the tenant's last place at once do not both get it. A registry that cannot be reached
leaves the first check alone to decide. Closes are published with the next heartbeat
(until then the others count a closed connection: never too few). A connection over a
quota is refused (the caller closes it) and counts for nothing (but for the rate, when the
registry refuses it); an admitted one counts until :meth:`Admission.release`. The per-``ip`` rate,
checked when a connection is accepted, is :meth:`QuotaManager.connect_from`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from broker_core.quotas.entities import (
    CONNECTION_CREATION_RATE,
    MAX_CONNECTIONS,
    TENANT,
    Caller,
)
from broker_core.quotas.manager import QuotaManager
from broker_core.storage import StorageError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a connection is refused: the quota, its value and who shares it."""

    key: str
    quota: float
    shared_by: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.key} {self.quota:g} of {'/'.join(self.shared_by)} reached"


class Admission:
    """The open connections of each tenant, and the checks of a new one."""

    def __init__(self, manager: QuotaManager,
                 elsewhere: Callable[[str], int] = lambda tenant: 0,
                 reserve: Callable[[str, int, int], Awaitable[bool]] | None = None) -> None:
        self.manager = manager
        self.elsewhere = elsewhere
        """A tenant's connections on the other brokers of a cluster, as last published."""
        self.reserve = reserve
        """Confirms (tenant, this broker's count with the new one, cap) against the whole
        cluster, publishing the count; None: nothing beyond this broker to ask."""
        self._unreachable = False
        self.open: dict[str, int] = {}
        """Admitted connections still open on this broker, by tenant."""

    def admit(self, who: Caller, now: float | None = None) -> Refusal | None:
        """Admit a connection of ``who``, or say why not."""
        cap = self.manager.tenant_value(who.tenant, MAX_CONNECTIONS)
        if cap is not None and \
                self.open.get(who.tenant, 0) + self.elsewhere(who.tenant) >= cap:
            return Refusal(MAX_CONNECTIONS, cap, (TENANT, who.tenant))
        throttle = self.manager.charge_caller(who, CONNECTION_CREATION_RATE, 1, now)
        if throttle is not None:
            self.manager.uncharge(throttle, 1, now)
            return Refusal(CONNECTION_CREATION_RATE, throttle.quota, throttle.shared_by)
        self.open[who.tenant] = self.open.get(who.tenant, 0) + 1
        return None

    def release(self, who: Caller) -> None:
        """An admitted connection of ``who`` closed."""
        left = self.open.get(who.tenant, 0) - 1
        if left > 0:
            self.open[who.tenant] = left
        else:
            self.open.pop(who.tenant, None)

    async def admit_in_cluster(self, who: Caller) -> Refusal | None:
        """:meth:`admit`, then the cluster's confirmation of a tenant with a
        ``max_connections`` (the connection counts here meanwhile, so a heartbeat never
        publishes less than a reservation made before it)."""
        refusal = self.admit(who)
        cap = self.manager.tenant_value(who.tenant, MAX_CONNECTIONS)
        if refusal is not None or cap is None or self.reserve is None:
            return refusal
        confirmed = False
        try:
            confirmed = await self.reserve(who.tenant, self.open.get(who.tenant, 0), int(cap))
            self._unreachable = False
        except (StorageError, OSError) as exc:  # the registry is away: the check above stands
            if not self._unreachable:
                log.warning("max_connections of tenant %s: the cluster registry cannot "
                            "confirm the count (%s); checked against the last published "
                            "counts only", who.tenant, exc)
            self._unreachable = confirmed = True
        finally:
            if not confirmed:
                self.release(who)
        return None if confirmed else Refusal(MAX_CONNECTIONS, cap, (TENANT, who.tenant))
