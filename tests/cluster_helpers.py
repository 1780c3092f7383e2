"""Several real broker processes on one real PostgreSQL database: a cluster for tests."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from confluent_kafka.admin import AdminClient
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from tests.broker_process import BrokerProcess
from tests.postgres_server import shared_server
from tests.raw import RawConnection

FAST_FAILOVER = {"brokerSessionTimeoutMs": "2000", "brokerHeartbeatIntervalMs": "250"}
"""Membership settings that make a dead broker's partitions move in about two seconds."""


class Cluster:
    """Brokers 0..n-1 (or the ``ids`` given) sharing one database; each on its own port."""

    def __init__(self, root: Path, size: int, settings: dict[str, str] | None = None,
                 url: str | None = None, client: dict[str, str] | None = None,
                 ids: Sequence[int] | None = None) -> None:
        self.url = url or shared_server().new_database_url()
        self.client = client or {}
        """Extra settings of the admin clients that watch the cluster (a SASL login)."""
        self.root = root
        self.settings = {"storageUrl": self.url, **FAST_FAILOVER, **(settings or {})}
        self.ids = list(ids if ids is not None else range(size))
        self.brokers = [self._broker(i) for i in self.ids]

    def _broker(self, broker_id: int) -> BrokerProcess:
        return BrokerProcess(self.root / f"b{broker_id}",
                             {**self.settings, "brokerId": str(broker_id)})

    def start(self) -> Cluster:
        for broker in self.brokers:
            broker.start()
        self.wait_for_members(len(self.brokers))
        return self

    def add(self, broker_id: int) -> BrokerProcess:
        """Start one more broker, numbered ``broker_id``."""
        self.ids.append(broker_id)
        self.brokers.append(self._broker(broker_id).start())
        return self.brokers[-1]

    def restart(self, broker_id: int) -> BrokerProcess:
        """Start broker ``broker_id`` again (on a new port)."""
        self.brokers[self.ids.index(broker_id)] = self._broker(broker_id).start()
        return self.by_id(broker_id)

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers if b.alive())

    def live_ids(self, via: BrokerProcess | None = None) -> set[int]:
        """The broker ids Metadata lists, asked through ``via`` (default: any live one)."""
        target = via or next(b for b in self.brokers if b.alive())
        admin = AdminClient({"bootstrap.servers": target.bootstrap, **self.client})
        return set(admin.list_topics(timeout=10).brokers)

    def wait_for_members(self, count: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if all(len(self.live_ids(b)) == count for b in self.brokers if b.alive()):
                    return
            except Exception:
                if time.monotonic() > deadline:
                    raise
            if time.monotonic() > deadline:
                raise AssertionError(f"the cluster never showed {count} brokers")
            time.sleep(0.2)

    def leaders(self, topic: str) -> dict[int, int]:
        """partition -> leader id, as Metadata tells."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap, **self.client})
        found = admin.list_topics(topic, timeout=10).topics[topic]
        return {p: meta.leader for p, meta in found.partitions.items()}

    def agreed_leaders(self, topic: str) -> dict[int, int] | None:
        """partition -> leader id once every live broker's Metadata tells the same and names a
        live broker for each partition; None while their views still differ (each broker
        learns a move from the database on its own, a moment apart)."""
        alive = [(broker_id, broker) for broker_id, broker
                 in zip(self.ids, self.brokers, strict=True) if broker.alive()]
        views = [leaders_at(broker.port, topic) for _, broker in alive]
        first = views[0]
        if any(view != first for view in views):
            return None
        if not set(first.values()) <= {broker_id for broker_id, _ in alive}:
            return None
        return first

    def by_id(self, broker_id: int) -> BrokerProcess:
        return self.brokers[self.ids.index(broker_id)]

    def stop(self) -> None:
        for broker in self.brokers:
            if broker.alive():
                broker.stop()

    def stop_all_at_once(self) -> None:
        """SIGTERM every broker at the same moment; each must exit cleanly."""
        for broker in self.brokers:
            assert broker.proc is not None
            broker.proc.send_signal(signal.SIGTERM)
        # wait without a second SIGTERM: a broker whose shutdown is done but whose
        # interpreter is still tearing down has its default handler back, and a second
        # signal would kill it (-15)
        codes = [broker.proc.wait(30) for broker in self.brokers if broker.proc is not None]
        assert codes == [0] * len(self.brokers), "exit codes " + repr(codes) + self.last_lines(
            15, [b for b, code in zip(self.ids, codes, strict=True) if code != 0])

    def last_lines(self, count: int, ids: Sequence[int] | None = None) -> str:
        """The last ``count`` log lines of brokers ``ids`` (default: all), for a failure
        message."""
        return "".join(f"\n-- broker {broker_id}, last lines:\n"
                       + "\n".join(self.by_id(broker_id).lines[-count:])
                       for broker_id in (self.ids if ids is None else ids))


def leaders_at(port: int, topic: str) -> dict[int, int]:
    """partition -> leader id, as the broker on ``port`` itself tells (a raw Metadata v12 to
    that one broker: a client library would ask whichever broker it likes)."""
    conn = RawConnection(port)
    try:
        answer = conn.call(MetadataRequest[12](
            topics=[MetadataRequest.MetadataRequestTopic(name=topic, topic_id=None)],
            allow_auto_topic_creation=False, include_topic_authorized_operations=False),
            12, MetadataResponse)
    finally:
        conn.close()
    (found,) = answer.topics
    return {int(p.partition_index): int(p.leader_id) for p in found.partitions}


@contextmanager
def running_cluster(root: Path, size: int = 3, settings: dict[str, str] | None = None,
                    url: str | None = None, client: dict[str, str] | None = None,
                    ids: Sequence[int] | None = None) -> Iterator[Cluster]:
    """A started cluster (on a new database of the session's server unless ``url``; its
    brokers numbered ``ids``, default 0..size-1), stopped at the end."""
    cluster = Cluster(root, size, settings, url, client, ids)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
