"""The cluster registry in PostgreSQL: ``edge_brokers`` (leases) and the owner columns of
``edge_partitions`` (owner and epoch).

Leases are judged by the database's clock (``statement_timestamp()``: when the statement
reached the server, not when its transaction began, which a statement held up by a stopped
database would make stale), so brokers' clocks never matter. A
claim and a hand-over each move a partition's epoch up in one statement; every write to a
partition carries the epoch its writer holds (``PgPartition``), so a broker that lost the
partition writes nothing more, however late its statement arrives.

A lease that ran out while the registry heard from no broker at all (``edge_registry_clock``:
the last heartbeat or registration of any broker) ran out because the database was away
(stopped, failing over, cut off), not its broker: the first heartbeat after such a silence
renews every lease that ran out during it, its own among them, as a new Kafka controller
gives every broker a fresh session. (Until that heartbeat no broker can claim anything:
a claim needs the claimer's own lease to run.) Without it, the first broker
back took every other broker's partitions, which went back a moment later, and each broker
gave up all of its own ("lease ran out"): a reshuffle of the whole cluster after each
database outage longer than a session. A broker that died meanwhile is judged dead a
session after the database is back.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

import psycopg

from . import pg_changes
from .cluster import (
    BrokerIdInUse,
    BrokerRecord,
    ClusterView,
    ListenerAddress,
    MarkerRequest,
    PartitionOwner,
    Renewal,
    TopicPartition,
)
from .errors import DatabaseUnavailable, LogClosed, StorageError
from .pg_database import Conn, Database, connect_read_only, unavailable

log = logging.getLogger(__name__)

_NOW = "statement_timestamp()"

_LIVE = f"lease_expires > {_NOW}"

_TOUCH = ("touched AS (INSERT INTO edge_registry_clock (heard) VALUES (" + _NOW + ")"
          " ON CONFLICT (one) DO UPDATE SET heard = excluded.heard RETURNING 1)")
"""The registry heard a broker (a heartbeat or a registration): a CTE, whose one row the
statement's own writes are made to depend on, so that the clock is locked before any lease
(two statements never lock them in opposite orders). Each touch is a statement of its own,
committed alone: no broker holds the clock from one round trip to the next (a broker
stopped mid-transaction would hold up every heartbeat)."""

_REGISTER = (
    "WITH " + _TOUCH +
    " INSERT INTO edge_brokers (broker_id, incarnation, rack, listeners, lease_expires)"
    " SELECT %(id)s, %(inc)s, %(rack)s, %(listeners)s,"
    "  " + _NOW + " + %(timeout)s * interval '1 millisecond' FROM touched"
    " ON CONFLICT (broker_id) DO UPDATE SET incarnation = excluded.incarnation,"
    "  rack = excluded.rack, listeners = excluded.listeners, registered_at = " + _NOW + ","
    "  lease_expires = excluded.lease_expires, tenant_connections = '{}'"
    " WHERE edge_brokers.lease_expires <= " + _NOW + " RETURNING broker_id")

_LIVE_BROKERS = ("SELECT broker_id, rack, listeners FROM edge_brokers WHERE " + _LIVE
                 + " ORDER BY broker_id")

_HEARTBEAT = (
    "WITH clock AS (SELECT heard, " + _NOW + " - heard > %(s)s * interval '1 millisecond'"
    "  AS silent FROM edge_registry_clock), " + _TOUCH + ","
    " renewed AS (UPDATE edge_brokers b"
    "  SET lease_expires = " + _NOW + " + %(t)s * interval '1 millisecond',"
    "   tenant_connections = CASE WHEN b.broker_id = %(id)s THEN %(conns)s::jsonb"
    "    ELSE b.tenant_connections END"
    "  FROM touched LEFT JOIN clock ON true"
    "  WHERE (b.broker_id = %(id)s AND b.incarnation = %(inc)s AND (b." + _LIVE +
    "    OR (clock.silent AND b.lease_expires > clock.heard)))"
    "   OR (b.broker_id <> %(id)s AND clock.silent AND b.lease_expires > clock.heard"
    "    AND b.lease_expires <= " + _NOW + ")"
    "  RETURNING b.broker_id, b.broker_id = %(id)s AS mine)"
    " SELECT EXISTS (SELECT 1 FROM renewed WHERE mine), concat_ws(' ',"
    "  (SELECT string_agg(broker_id || ':' || incarnation, ',' ORDER BY broker_id)"
    "   FROM edge_brokers WHERE " + _LIVE + "),"
    "  (SELECT count(*) || ':' || count(owner_broker) || ':' || coalesce(sum(owner_epoch), 0)"
    "   FROM edge_partitions),"
    "  (SELECT string_agg(key || '=' || convert_from(value, 'UTF8'), ',' ORDER BY key)"
    "   FROM edge_kv WHERE key IN ('" + pg_changes.TOPICS + "', '" + pg_changes.KV + "'))),"
    " (SELECT coalesce(jsonb_object_agg(tenant, n), '{}') FROM (SELECT c.key AS tenant,"
    "   sum(c.value::bigint) AS n FROM edge_brokers b, jsonb_each_text(b.tenant_connections) c"
    "   WHERE b.broker_id <> %(id)s AND b." + _LIVE + " GROUP BY c.key) o),"
    " (SELECT array_agg(broker_id ORDER BY broker_id) FROM renewed WHERE NOT mine)")
"""Renew the lease and publish this broker's connections per tenant, and read the
registry's stamp (``Renewal``) in the same round trip: the live brokers with their
incarnations, the partitions (how many, how many owned, the sum of their epochs: every
change of owner moves an epoch up) and the change counters (``pg_changes``); and the other
live brokers' published connections summed per tenant. Both read the registry as of
before the renewal. The registry's clock is moved on with it: when it had heard no broker
for ``%(s)s`` ms (the clock read as of before), the leases that ran out during that
silence are renewed too, this broker's among them (module docstring); the last column
names the other brokers so renewed."""

_CLAIM = (
    "UPDATE edge_partitions p SET owner_broker = %(me)s, owner_epoch = p.owner_epoch + 1"
    " FROM unnest(%(topics)s::text[], %(parts)s::integer[]) AS w(topic, partition)"
    " WHERE p.topic = w.topic AND p.partition = w.partition"
    "  AND EXISTS (SELECT 1 FROM edge_brokers WHERE broker_id = %(me)s"
    "   AND incarnation = %(inc)s AND " + _LIVE + ")"
    "  AND (p.owner_broker IS NULL OR p.owner_broker = %(me)s OR NOT EXISTS ("
    "   SELECT 1 FROM edge_brokers b WHERE b.broker_id = p.owner_broker AND b." + _LIVE + "))"
    " RETURNING p.topic, p.partition, p.owner_epoch, p.id")
"""Take the partitions asked for whose owner is nobody, this broker, or dead."""

_HAND_OVER = (
    "UPDATE edge_partitions p SET owner_broker = m.target, owner_epoch = p.owner_epoch + 1"
    " FROM unnest(%(ids)s::bigint[], %(epochs)s::bigint[], %(targets)s::integer[])"
    "  AS m(id, epoch, target)"
    " WHERE p.id = m.id AND p.owner_broker = %(me)s AND p.owner_epoch = m.epoch"
    " RETURNING p.topic, p.partition")


_CONNECTIONS_LOCK = 0x65646765  # pg_advisory_xact_lock(class, key) class: "edge"
_RESERVE = (
    "UPDATE edge_brokers SET tenant_connections = jsonb_set(tenant_connections,"
    "  ARRAY[%(tenant)s], to_jsonb(%(count)s::bigint))"
    " WHERE broker_id = %(id)s AND incarnation = %(inc)s AND %(count)s + (SELECT"
    "  coalesce(sum((b.tenant_connections ->> %(tenant)s)::bigint), 0) FROM edge_brokers b"
    "  WHERE b.broker_id <> %(id)s AND b." + _LIVE + ") <= %(cap)s"
    " RETURNING 1")
"""Publish this broker's connections of a tenant if the cluster's stay within the cap
(run under the tenant's advisory lock, so two brokers' reservations never both pass)."""


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

    def begin(self) -> None:
        self._joined = True

    def joined(self) -> bool:
        """Whether a broker registered through this storage: from then on, only partitions
        claimed are written (before, a tool or a test writes unfenced)."""
        return self._joined


    def register(self, me: BrokerRecord, session_timeout_ms: int) -> None:
        self._incarnation = uuid.uuid4()
        # each statement commits alone: the registration touches (locks) the registry's
        # clock, which no broker holds from one round trip to the next (``_TOUCH``);
        # whatever silence came before was the brokers', not the database's (a cluster
        # started again after its brokers died)
        with self._db.autocommit() as conn:
            row = conn.execute(_REGISTER, {
                "id": me.broker_id, "inc": self._incarnation, "rack": me.rack,
                "listeners": _listeners_json(me), "timeout": session_timeout_ms}).fetchone()
            if row is None:
                left = conn.execute(
                    "SELECT extract(epoch FROM lease_expires - " + _NOW + ") FROM edge_brokers"
                    " WHERE broker_id = %s", (me.broker_id,)).fetchone()
                seconds = float(str(left[0])) if left is not None else 0.0
                raise BrokerIdInUse(
                    f"broker id {me.broker_id} is registered by a live broker (its lease "
                    f"runs {max(seconds, 0):.1f} s more)")
        self._me = me.broker_id
        self._joined = True  # (a test may register without begin())

    def others_present(self) -> bool:
        """Whether another broker registered in the database or any topic exists in it (a
        schema that is in use); True when the database cannot tell."""
        try:
            with self._db.tx() as conn:
                row = conn.execute(
                    "SELECT EXISTS (SELECT 1 FROM edge_brokers WHERE incarnation <> %s)"
                    " OR EXISTS (SELECT 1 FROM edge_topics)", (self._incarnation,)).fetchone()
        except (DatabaseUnavailable, LogClosed):
            return True
        return row is None or bool(row[0])

    def heartbeat(self, session_timeout_ms: int,
                  connections: Mapping[str, int] | None = None,
                  silence_ms: int | None = None) -> Renewal:
        if self._me is None:
            return Renewal(False)
        with self._db.autocommit() as conn:
            row = conn.execute(_HEARTBEAT, {"t": session_timeout_ms, "id": self._me,
                                            "inc": self._incarnation, "s": silence_ms,
                                            "conns": json.dumps(dict(connections or {}))}
                               ).fetchone()
        assert row is not None
        elsewhere, silenced = row[2], row[3]
        assert isinstance(elsewhere, dict) and isinstance(silenced, list | None)
        if silenced:
            log.warning("the registry heard no broker for over %d ms (the database was "
                        "away): the leases of brokers %s, which ran out meanwhile, are "
                        "renewed, not judged dead", silence_ms,
                        ", ".join(str(broker) for broker in silenced))
        return Renewal(bool(row[0]), str(row[1]),
                       {str(tenant): int(count) for tenant, count in elsewhere.items()})

    def reserve_connection(self, tenant: str, count: int, cap: int) -> bool:
        if self._me is None:
            return count <= cap
        with self._db.tx() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                         (_CONNECTIONS_LOCK, tenant))
            row = conn.execute(_RESERVE, {"tenant": tenant, "count": count, "cap": cap,
                                          "id": self._me, "inc": self._incarnation}
                               ).fetchone()
        return row is not None

    def deregister(self) -> None:
        if self._me is not None:
            self._db.statement("DELETE FROM edge_brokers WHERE broker_id = %(id)s"
                               " AND incarnation = %(inc)s",
                               {"id": self._me, "inc": self._incarnation})
            self._me = None

    def view(self) -> ClusterView:
        with self._db.tx() as conn:
            brokers = conn.execute(_LIVE_BROKERS).fetchall()
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
        taken: dict[TopicPartition, int] = {}
        for topic, part, epoch, row_id in rows:
            key, held = (str(topic), int(str(part))), int(str(epoch))
            if self._adopt(key, held, int(str(row_id))):
                taken[key] = held
        return taken

    def _adopt(self, partition: TopicPartition, epoch: int, row_id: int) -> bool:
        """Write to the partition at ``epoch``, its state read afresh from the database;
        False when that cannot be done now (this process does not hold that partition row
        yet, say a topic re-created elsewhere, or the database failed): the claim is then
        not used, and the next reconcile claims the partition again."""
        found = self._partition(*partition)
        if found is None or found.partition_id != row_id:
            return False
        try:
            found.fence(epoch)
        except (StorageError, OSError):
            found.fence(None)
            return False
        return True

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

    def request_markers(self, requests: Sequence[MarkerRequest]) -> list[int]:
        if not requests:
            return []
        with self._db.tx() as conn:
            rows = conn.execute(
                "INSERT INTO edge_marker_requests (topic, partition, producer_id,"
                " producer_epoch, commit, group_id, coordinator_epoch) SELECT * FROM"
                " unnest(%s::text[], %s::integer[], %s::bigint[], %s::integer[],"
                " %s::boolean[], %s::text[], %s::bigint[]) RETURNING id",
                ([r.topic for r in requests], [r.partition for r in requests],
                 [r.producer_id for r in requests], [r.producer_epoch for r in requests],
                 [r.commit for r in requests], [r.group_id for r in requests],
                 [r.coordinator_epoch for r in requests])).fetchall()
        return [int(str(row[0])) for row in rows]

    def pending_markers(self) -> list[tuple[int, MarkerRequest]]:
        with self._db.autocommit() as conn:
            rows = conn.execute(
                "SELECT id, topic, partition, producer_id, producer_epoch, commit, group_id,"
                " coordinator_epoch FROM edge_marker_requests ORDER BY id").fetchall()
        return [(int(str(i)), MarkerRequest(str(t), int(str(p)), int(str(pid)),
                                            int(str(e)), bool(c),
                                            None if g is None else str(g), int(str(ce))))
                for i, t, p, pid, e, c, g, ce in rows]

    def markers_done(self, ids: Sequence[int]) -> None:
        if ids:
            self._db.statement("DELETE FROM edge_marker_requests WHERE id = ANY(%(ids)s)",
                               {"ids": list(ids)})

    def markers_left(self, ids: Sequence[int]) -> set[int]:
        if not ids:
            return set()
        with self._db.autocommit() as conn:
            rows = conn.execute("SELECT id FROM edge_marker_requests WHERE id = ANY(%s)",
                                (list(ids),)).fetchall()
        return {int(str(row[0])) for row in rows}

class RegistryReader:
    """The live brokers of a cluster's database, read by a process that is no broker (the
    xDS server in front of the cluster): one read-only connection, opened at the first read
    and again after a failure; no migration. Thread-safe."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: Conn | None = None
        self._lock = threading.Lock()

    def live(self) -> list[BrokerRecord]:
        """The brokers whose lease runs, by id (none before any broker created the
        schema); DatabaseUnavailable when the database cannot be read."""
        with self._lock:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = connect_read_only(self._url)
                rows = self._conn.execute(_LIVE_BROKERS).fetchall()
            except psycopg.errors.UndefinedTable:
                return []
            except psycopg.Error as exc:
                self._close()
                raise unavailable(exc) from None
        return [_record(*row) for row in rows]

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        with self._lock:
            self._close()
