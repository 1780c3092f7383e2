"""The cluster registry in PostgreSQL: ``edge_brokers`` (leases) and the owner columns of
``edge_partitions`` (owner and epoch).

Leases are judged by the database's clock (``now()``), so brokers' clocks never matter. A
claim and a hand-over each move a partition's epoch up in one statement; every write to a
partition carries the epoch its writer holds (``PgPartition``), so a broker that lost the
partition writes nothing more, however late its statement arrives.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from .cluster import (
    BrokerIdInUse,
    BrokerRecord,
    ClusterView,
    ListenerAddress,
    PartitionOwner,
    TopicPartition,
)
from .pg_database import Database

_LIVE = "lease_expires > now()"

_REGISTER = (
    "INSERT INTO edge_brokers (broker_id, incarnation, rack, listeners, lease_expires)"
    " VALUES (%(id)s, %(inc)s, %(rack)s, %(listeners)s,"
    "  now() + %(timeout)s * interval '1 millisecond')"
    " ON CONFLICT (broker_id) DO UPDATE SET incarnation = excluded.incarnation,"
    "  rack = excluded.rack, listeners = excluded.listeners, registered_at = now(),"
    "  lease_expires = excluded.lease_expires"
    " WHERE edge_brokers.lease_expires <= now()"
    " RETURNING broker_id")

_CLAIM = (
    "UPDATE edge_partitions p SET owner_broker = %(me)s, owner_epoch = p.owner_epoch + 1"
    " FROM unnest(%(topics)s::text[], %(parts)s::integer[]) AS w(topic, partition)"
    " WHERE p.topic = w.topic AND p.partition = w.partition"
    "  AND EXISTS (SELECT 1 FROM edge_brokers WHERE broker_id = %(me)s"
    "   AND incarnation = %(inc)s AND " + _LIVE + ")"
    "  AND (p.owner_broker IS NULL OR p.owner_broker = %(me)s OR NOT EXISTS ("
    "   SELECT 1 FROM edge_brokers b WHERE b.broker_id = p.owner_broker AND b." + _LIVE + "))"
    " RETURNING p.topic, p.partition, p.owner_epoch")
"""Take the partitions asked for whose owner is nobody, this broker, or dead."""

_HAND_OVER = (
    "UPDATE edge_partitions p SET owner_broker = m.target, owner_epoch = p.owner_epoch + 1"
    " FROM unnest(%(ids)s::bigint[], %(epochs)s::bigint[], %(targets)s::integer[])"
    "  AS m(id, epoch, target)"
    " WHERE p.id = m.id AND p.owner_broker = %(me)s AND p.owner_epoch = m.epoch"
    " RETURNING p.topic, p.partition")


class Fenced(Protocol):
    """A partition of this process whose writes carry an ownership epoch."""

    @property
    def partition_id(self) -> int: ...

    def fence(self, epoch: int | None) -> int | None: ...


def _listeners_json(record: BrokerRecord) -> str:
    return json.dumps([[a.name, a.security_protocol, a.host, a.port, a.bind_host, a.bind_port]
                       for a in record.listeners])


def _record(broker_id: object, rack: object, listeners: object) -> BrokerRecord:
    assert isinstance(listeners, list)
    return BrokerRecord(
        int(str(broker_id)), None if rack is None else str(rack),
        tuple(ListenerAddress(str(n), str(p), str(h), int(o), str(bh), int(bo))
              for n, p, h, o, bh, bo in listeners))


class PgCluster:
    """Membership and ownership in the storage database; the partitions' fences in this
    process are set through ``partition``."""

    def __init__(self, db: Database,
                 partition: Callable[[str, int], Fenced | None]) -> None:
        self._db = db
        self._partition = partition
        self._me: int | None = None
        self._incarnation = uuid.uuid4()
        self._joined = False

    @property
    def shared(self) -> bool:
        return True

    def joined(self) -> bool:
        """Whether a broker registered through this storage: from then on, only partitions
        claimed or adopted are written (before, a tool or a test writes unfenced)."""
        return self._joined


    def register(self, me: BrokerRecord, session_timeout_ms: int) -> None:
        self._incarnation = uuid.uuid4()
        with self._db.tx() as conn:
            row = conn.execute(_REGISTER, {
                "id": me.broker_id, "inc": self._incarnation, "rack": me.rack,
                "listeners": _listeners_json(me), "timeout": session_timeout_ms}).fetchone()
            if row is None:
                left = conn.execute(
                    "SELECT extract(epoch FROM lease_expires - now()) FROM edge_brokers"
                    " WHERE broker_id = %s", (me.broker_id,)).fetchone()
                seconds = float(str(left[0])) if left is not None else 0.0
                raise BrokerIdInUse(
                    f"broker id {me.broker_id} is registered by a live broker (its lease "
                    f"runs {max(seconds, 0):.1f} s more)")
        self._me = me.broker_id
        self._joined = True

    def heartbeat(self, session_timeout_ms: int) -> bool:
        if self._me is None:
            return False
        renewed = self._db.statement(
            "UPDATE edge_brokers SET lease_expires = now() + %(t)s * interval '1 millisecond'"
            " WHERE broker_id = %(id)s AND incarnation = %(inc)s AND " + _LIVE,
            {"t": session_timeout_ms, "id": self._me, "inc": self._incarnation})
        return renewed == 1

    def deregister(self) -> None:
        if self._me is not None:
            self._db.statement("DELETE FROM edge_brokers WHERE broker_id = %(id)s"
                               " AND incarnation = %(inc)s",
                               {"id": self._me, "inc": self._incarnation})
            self._me = None

    def view(self) -> ClusterView:
        with self._db.tx() as conn:
            brokers = conn.execute(
                "SELECT broker_id, rack, listeners FROM edge_brokers WHERE " + _LIVE
                + " ORDER BY broker_id").fetchall()
            owners = conn.execute(
                "SELECT topic, partition, owner_broker, owner_epoch FROM edge_partitions"
            ).fetchall()
        live = {record.broker_id: record for record in (_record(*row) for row in brokers)}
        return ClusterView(live, {
            (str(topic), int(str(part))): PartitionOwner(
                None if owner is None else int(str(owner)), int(str(epoch)))
            for topic, part, owner, epoch in owners})

    def claim(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        wanted = list(partitions)
        if self._me is None or not wanted:
            return {}
        with self._db.tx() as conn:
            rows = conn.execute(_CLAIM, {
                "me": self._me, "inc": self._incarnation,
                "topics": [t for t, _ in wanted], "parts": [p for _, p in wanted]}).fetchall()
        taken = {(str(t), int(str(p))): int(str(e)) for t, p, e in rows}
        for (topic, index), epoch in taken.items():
            self.adopt((topic, index), epoch)
        return taken

    def adopt(self, partition: TopicPartition, epoch: int) -> None:
        found = self._partition(*partition)
        if found is not None:
            found.fence(epoch)

    def hand_over(self, moves: Mapping[TopicPartition, tuple[int, int]]
                  ) -> list[TopicPartition]:
        ids: list[int] = []
        epochs: list[int] = []
        targets: list[int] = []
        for tp, (epoch, target) in moves.items():
            found = self._partition(*tp)
            if found is not None:
                found.fence(None)
                ids.append(found.partition_id)
                epochs.append(epoch)
                targets.append(target)
        if self._me is None or not ids:
            return []
        with self._db.tx() as conn:
            rows = conn.execute(_HAND_OVER, {"me": self._me, "ids": ids, "epochs": epochs,
                                             "targets": targets}).fetchall()
        return [(str(t), int(str(p))) for t, p in rows]

    def drop(self, partitions: Iterable[TopicPartition]) -> None:
        for tp in partitions:
            found = self._partition(*tp)
            if found is not None:
                found.fence(None)
