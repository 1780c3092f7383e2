"""The PostgreSQL engine's schema and its versioned migrations, applied at start.

``edge_schema_version`` holds one row: the version the database is at. ``MIGRATIONS[i]``
takes it from version ``i`` to ``i + 1``; start-up applies the missing ones in one
transaction under an advisory lock (brokers starting together migrate once). A database
at a newer version than this code knows stops start-up (:class:`SchemaTooNew`).

A partition row carries its owner (``owner_broker``) and ``owner_epoch``, the fencing token
checked in the same statement as every write to the partition; ``edge_brokers`` is the
registry of brokers and their leases (``pg_cluster``). Triggers notify the channels
``edge_changes`` (a change counter of ``pg_changes`` moved), ``edge_markers`` (a marker
request queued or removed) and ``edge_registry`` (a broker registered or left, a partition
changed owner), which brokers listen on (``pg_listen``).
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg

from .errors import StorageError

_LOCK_KEY = 0x6564_6765_5f62_726b  # pg_advisory_xact_lock key: "edge_brk"

MIGRATIONS: Sequence[str] = (
    """
    CREATE TABLE edge_topics (
        name           text PRIMARY KEY,
        topic_id       uuid NOT NULL,
        num_partitions integer NOT NULL,
        configs        jsonb NOT NULL
    );
    CREATE TABLE edge_partitions (
        id                 bigserial PRIMARY KEY,
        topic              text NOT NULL REFERENCES edge_topics ON DELETE CASCADE,
        partition          integer NOT NULL,
        log_start          bigint NOT NULL DEFAULT 0,
        next_offset        bigint NOT NULL DEFAULT 0,
        size_bytes         bigint NOT NULL DEFAULT 0,
        segment_base       bigint NOT NULL DEFAULT 0,
        segment_size       bigint NOT NULL DEFAULT 0,
        segment_created_ms bigint NOT NULL,
        owner_epoch        bigint NOT NULL DEFAULT 0,
        UNIQUE (topic, partition)
    );
    CREATE TABLE edge_entries (
        partition_id  bigint NOT NULL REFERENCES edge_partitions ON DELETE CASCADE,
        base_offset   bigint NOT NULL,
        last_offset   bigint NOT NULL,
        segment_base  bigint NOT NULL,
        broker_ts     bigint NOT NULL,
        max_ts        bigint NOT NULL,
        size          integer NOT NULL,
        batch         bytea NOT NULL,
        PRIMARY KEY (partition_id, base_offset)
    );
    CREATE TABLE edge_kv (
        key   text PRIMARY KEY,
        value bytea NOT NULL
    );
    CREATE TABLE edge_partition_kv (
        partition_id bigint NOT NULL REFERENCES edge_partitions ON DELETE CASCADE,
        key          text NOT NULL,
        value        bytea NOT NULL,
        PRIMARY KEY (partition_id, key)
    );
    """,
    """
    CREATE TABLE edge_brokers (
        broker_id     integer PRIMARY KEY,
        incarnation   uuid NOT NULL,
        rack          text,
        listeners     jsonb NOT NULL,
        registered_at timestamptz NOT NULL DEFAULT now(),
        lease_expires timestamptz NOT NULL
    );
    ALTER TABLE edge_partitions ADD COLUMN owner_broker integer;
    CREATE TABLE edge_marker_requests (
        id             bigserial PRIMARY KEY,
        topic          text NOT NULL,
        partition      integer NOT NULL,
        producer_id    bigint NOT NULL,
        producer_epoch integer NOT NULL,
        commit         boolean NOT NULL,
        group_id       text,
        requested_at   timestamptz NOT NULL DEFAULT now()
    );
    """,
    # 3: wake-ups (``pg_listen``): a change other brokers act on sends a notification
    # when its transaction commits. ``edge_notify()`` notifies the channel named by the
    # trigger's argument with an empty payload (one per channel and transaction).
    """
    CREATE OR REPLACE FUNCTION edge_notify() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify(TG_ARGV[0], '');
        RETURN NULL;
    END $$;
    CREATE TRIGGER edge_changes_notify AFTER INSERT OR UPDATE ON edge_kv
        FOR EACH ROW WHEN (NEW.key IN ('changes.topics', 'changes.kv'))
        EXECUTE FUNCTION edge_notify('edge_changes');
    CREATE TRIGGER edge_markers_notify AFTER INSERT OR DELETE ON edge_marker_requests
        FOR EACH STATEMENT EXECUTE FUNCTION edge_notify('edge_markers');
    CREATE TRIGGER edge_brokers_notify AFTER INSERT OR DELETE ON edge_brokers
        FOR EACH STATEMENT EXECUTE FUNCTION edge_notify('edge_registry');
    CREATE TRIGGER edge_owners_notify AFTER UPDATE OF owner_broker ON edge_partitions
        FOR EACH ROW WHEN (OLD.owner_broker IS DISTINCT FROM NEW.owner_broker)
        EXECUTE FUNCTION edge_notify('edge_registry');
    """,
    # 4: each broker publishes its live connections per tenant with its heartbeat
    # ({"tenant": count}), so that a tenant's ``max_connections`` counts every broker's
    """
    ALTER TABLE edge_brokers ADD COLUMN tenant_connections jsonb NOT NULL DEFAULT '{}';
    """,
    # 5: a queued transaction end carries the coordinator epoch (the epoch of the
    # coordinator's claim on the transactional id's state partition), which the partition
    # or group checks; -1 for a request queued by a broker from before (not judged)
    """
    ALTER TABLE edge_marker_requests ADD COLUMN coordinator_epoch bigint NOT NULL DEFAULT -1;
    """,
    # 6: when the registry last heard a heartbeat or a registration of any broker
    # (``pg_cluster``): a lease that ran out while it heard nothing ran out because the
    # database was away, not its broker
    """
    CREATE TABLE edge_registry_clock (
        one   boolean PRIMARY KEY DEFAULT true CHECK (one),
        heard timestamptz NOT NULL
    );
    INSERT INTO edge_registry_clock (heard) VALUES (now());
    """,
    # 7: a summary of each segment's rows (``pg_segments``), kept in the transaction of
    # every change to them, so that retention, the cleaner and lookups by time read one
    # row per segment, not every row of a partition; filled from the rows stored
    """
    CREATE TABLE edge_segments (
        partition_id  bigint NOT NULL REFERENCES edge_partitions ON DELETE CASCADE,
        segment_base  bigint NOT NULL,
        first_offset  bigint NOT NULL,
        next_offset   bigint NOT NULL,
        size_bytes    bigint NOT NULL,
        min_broker_ts bigint NOT NULL,
        max_broker_ts bigint NOT NULL,
        max_ts        bigint NOT NULL,
        PRIMARY KEY (partition_id, segment_base)
    );
    INSERT INTO edge_segments SELECT partition_id, segment_base, min(base_offset),
        max(last_offset) + 1, sum(size), min(broker_ts), max(broker_ts), max(max_ts)
        FROM edge_entries GROUP BY partition_id, segment_base;
    ANALYZE edge_segments;
    """,
)
"""The schema, one step per version (never edit a released step: add one)."""

SCHEMA_VERSION = len(MIGRATIONS)

TABLES = ("edge_segments", "edge_registry_clock", "edge_marker_requests", "edge_brokers",
          "edge_partition_kv", "edge_kv", "edge_entries", "edge_partitions", "edge_topics",
          "edge_schema_version")
"""Every table of the schema, dependants first."""


class SchemaTooNew(StorageError):
    """The database's schema is newer than this code understands."""


def migrate(conn: psycopg.Connection[tuple[object, ...]], where: str) -> int:
    """Bring the database up to ``SCHEMA_VERSION``; return the version it was at (0 for an
    empty database). SchemaTooNew if it is beyond that."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        conn.execute("CREATE TABLE IF NOT EXISTS edge_schema_version (version integer NOT NULL)")
        row = conn.execute("SELECT version FROM edge_schema_version").fetchone()
        found = 0 if row is None else int(str(row[0]))
        if found > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"the database {where} has storage schema version {found}; this edge-broker "
                f"knows versions up to {SCHEMA_VERSION} (upgrade edge-broker)")
        for step in MIGRATIONS[found:]:
            conn.execute(step.encode())
        if row is None:
            conn.execute("INSERT INTO edge_schema_version VALUES (%s)", (SCHEMA_VERSION,))
        elif found < SCHEMA_VERSION:
            conn.execute("UPDATE edge_schema_version SET version = %s", (SCHEMA_VERSION,))
    return found


def drop_schema(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """Remove every table of the schema (after a failed first start that created it)."""
    with conn.transaction():
        for table in TABLES:
            conn.execute(f"DROP TABLE IF EXISTS {table} CASCADE".encode())
        conn.execute("DROP FUNCTION IF EXISTS edge_notify()")
