"""Connections admitted against the quotas, once the broker knows who is connecting.

``connection_creation_rate`` resolves like every rate (user and client id, namespace,
then the tenant's own value as a ceiling), and ``max_connections`` is a cap on a tenant's
open connections, on every broker of a cluster: this broker's own count plus what the
others published with their latest heartbeats (``elsewhere``; a burst of logins on several
brokers within one heartbeat interval may pass the cap by what those brokers admitted
meanwhile). A connection over either is refused (the caller closes it) and counts for
nothing; an admitted one counts until :meth:`Admission.release`. The per-``ip`` rate,
checked when a connection is accepted, is :meth:`QuotaManager.connect_from`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from broker_core.quotas.entities import (
    CONNECTION_CREATION_RATE,
    MAX_CONNECTIONS,
    TENANT,
    Caller,
)
from broker_core.quotas.manager import QuotaManager


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
                 elsewhere: Callable[[str], int] = lambda tenant: 0) -> None:
        self.manager = manager
        self.elsewhere = elsewhere
        """A tenant's connections on the other brokers of a cluster, as last published."""
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
