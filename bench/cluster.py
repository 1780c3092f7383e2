"""Several of this broker on one PostgreSQL database, run as one :class:`Broker` for the
harness: a comma-separated bootstrap, the CPU seconds of all its processes added up, and
the Metadata views (members, partition leaders) the cluster rows wait on.
"""

from __future__ import annotations

import time

from confluent_kafka.admin import AdminClient

from bench.brokers import Broker, BrokerError, EdgeBroker
from broker_core.cluster.placement import assign
from broker_core.naming import Namespace, to_internal
from edge.config import BrokerConfig

_DEFAULTS = BrokerConfig()
HOME = Namespace(_DEFAULTS.kafka_tenant, _DEFAULTS.kafka_namespace)
"""Where the brokers (default settings) put short topic names: placement hashes full names."""


class BrokerGroup(Broker):
    """Brokers ``0..count-1`` of this broker sharing the database at ``url``."""

    name = "cluster"
    label = "this broker, a cluster on PostgreSQL"

    def __init__(self, url: str, count: int, settings: dict[str, str] | None = None) -> None:
        super().__init__()
        self.url = url
        self.settings = dict(settings or {})
        self.members = [self.member(broker_id) for broker_id in range(count)]
        self.name = f"{count} broker{'s' if count > 1 else ''}"

    def member(self, broker_id: int) -> EdgeBroker:
        """A (not yet started) broker ``broker_id`` of this cluster."""
        return EdgeBroker({"storageUrl": self.url, "brokerId": str(broker_id),
                           **self.settings})

    @property
    def bootstrap(self) -> str:
        """Every live member, comma-separated."""
        return ",".join(m.bootstrap for m in self.members if m.alive())

    def command(self) -> list[str]:
        """Broker 0's command line (the others differ in ``brokerId`` and data directory)."""
        return self.members[0].command()

    def version(self) -> str:
        settings = ", ".join(f"{k}={v}" for k, v in self.settings.items()) or "default settings"
        return f"{len(self.members)} edge-broker processes on one PostgreSQL ({settings})"

    def start(self, cpus: frozenset[int] | None, timeout: float = 60.0) -> None:
        """Start every member (pinned to ``cpus``) and wait until each one lists them all."""
        try:
            for member in self.members:
                member.start(cpus, timeout)
            self.wait_for_members(timeout)
        except BaseException:
            self.stop()
            raise

    def alive(self) -> bool:
        return all(member.alive() for member in self.members)

    def check_alive(self) -> None:
        for member in self.members:
            if not member.alive():
                raise BrokerError(f"{self.name}: broker {self.members.index(member)} "
                                  f"exited:\n{member.log_tail()}")

    def cpu_seconds(self) -> float:
        """CPU seconds of the live members so far, added up."""
        return sum(member.cpu_seconds() for member in self.members if member.alive())

    def peak_rss_bytes(self) -> int:
        """The largest peak resident set of one member."""
        return max(member.peak_rss_bytes() for member in self.members if member.alive())

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(f"[broker {i}] {member.log_tail(lines)}"
                         for i, member in enumerate(self.members))

    def stop(self, timeout: float = 20.0) -> None:
        for member in self.members:
            member.stop(timeout)

    def members_seen(self) -> list[int]:
        """How many brokers each live member's Metadata lists."""
        counts = []
        for member in self.members:
            if member.alive():
                admin = AdminClient({"bootstrap.servers": member.bootstrap,
                                     "client.id": "bench-admin"})
                counts.append(len(admin.list_topics(timeout=10).brokers))
        return counts

    def wait_for_members(self, timeout: float = 60.0) -> None:
        """Until every member's Metadata lists every member."""
        deadline = time.monotonic() + timeout
        count = len(self.members)
        seen: list[int] = []
        while time.monotonic() < deadline:
            try:
                seen = self.members_seen()
            except Exception:  # a member not answering yet: ask again
                seen = []
            if seen and all(n == count for n in seen):
                return
            time.sleep(0.2)
        raise BrokerError(f"{self.name}: the members listed {seen} brokers, not {count}")

    def leaders(self, topic: str, via: EdgeBroker | None = None) -> dict[int, int]:
        """partition -> leader's broker id, as Metadata tells (asked through ``via``, by
        default any live member)."""
        bootstrap = self.bootstrap if via is None else via.bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": "bench-admin"})
        found = admin.list_topics(topic, timeout=10).topics[topic]
        return {p: meta.leader for p, meta in found.partitions.items()}

    def wait_settled(self, topic: str, timeout: float = 60.0) -> dict[int, int]:
        """Until every member's Metadata names, for each partition of ``topic``, the broker
        it belongs to among all the members (``placement``): no hand-over under way."""
        deadline = time.monotonic() + timeout
        views: list[dict[int, int]] = []
        while time.monotonic() < deadline:
            try:
                views = [self.leaders(topic, member) for member in self.members]
            except Exception:  # a member not answering yet: ask again
                views = []
            if views:
                wanted = dict(enumerate(assign(to_internal(topic, HOME), len(views[0]),
                                               range(len(self.members)))))
                if all(view == wanted for view in views):
                    return wanted
            time.sleep(0.2)
        raise BrokerError(f"{self.name}: {topic} never settled; leaders seen: {views}")
