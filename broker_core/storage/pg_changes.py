"""How brokers sharing one PostgreSQL database learn of each other's changes.

Two counter rows of ``edge_kv`` count changes: ``changes.topics`` moves in the same
transaction as every change of the topic tables (a topic created, deleted, grown or
reconfigured), ``changes.kv`` in the same transaction as every write to the broker-wide
key-value area (ACLs, producer-id blocks, the cluster id). A trigger notifies the channel
``edge_changes`` when either moves (``pg_schema``); a broker woken by it (``pg_listen``),
or every few seconds anyway, reads both rows (one read by primary key); when
``changes.topics`` moved, it reads every topic and partition row in one snapshot
(:func:`read_snapshot`) and reconciles its cache with it. A counter value commits with
the change it counts, and bumps of one row are serialised by its row lock, so a snapshot
holding counter value ``n`` holds every change counted up to ``n`` and none after.

The counters stay the truth and the notification only a wake-up: one sent while the
listening connection is down is lost, so a broker reads the counters after every
reconnection and at its old fast pace while the connection is down.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import psycopg

from .model import TopicInfo

Conn = psycopg.Connection[tuple[object, ...]]

TOPICS = "changes.topics"
"""The ``edge_kv`` counter of topic changes."""
KV = "changes.kv"
"""The ``edge_kv`` counter of writes to the broker-wide key-value area."""

_BUMP = ("INSERT INTO edge_kv VALUES (%s, '1') ON CONFLICT (key) DO UPDATE SET value ="
         " convert_to((convert_from(edge_kv.value, 'UTF8')::bigint + 1)::text, 'UTF8')"
         " RETURNING value")


def _number(value: object) -> int:
    assert isinstance(value, bytes)
    return int(value.decode())


def bump(conn: Conn, counter: str) -> int:
    """Count one change in ``counter`` (inside the change's transaction); its new value."""
    row = conn.execute(_BUMP, (counter,)).fetchone()
    assert row is not None
    return _number(row[0])


def counters(conn: Conn) -> tuple[int, int]:
    """The counters of topic changes and of key-value writes (0 before the first)."""
    found = {str(key): value for key, value in conn.execute(
        "SELECT key, value FROM edge_kv WHERE key = ANY(%s)", ([TOPICS, KV],)).fetchall()}
    return (_number(found[TOPICS]) if TOPICS in found else 0,
            _number(found[KV]) if KV in found else 0)


@dataclass
class TopicRows:
    """One topic as the database holds it: its info, and per partition (in order) the
    partition row's id and state columns."""

    info: TopicInfo
    partitions: list[tuple[int, tuple[object, ...]]] = field(default_factory=list)


@dataclass(frozen=True)
class Snapshot:
    """Topics read in one snapshot, with the change counters of that snapshot."""

    version: int
    kv_version: int
    topics: dict[str, TopicRows]


def read_snapshot(conn: Conn, state_columns: str, only: str | None = None) -> Snapshot:
    """Every topic (or only the topic ``only``) and its partition rows (``id`` then
    ``state_columns``), as of one moment; call it first thing in a transaction."""
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
    version, kv_version = counters(conn)
    where, params = ("WHERE name = %s", (only,)) if only is not None else ("", ())
    topics: dict[str, TopicRows] = {}
    for name, topic_id, count, configs in conn.execute(
            f"SELECT name, topic_id, num_partitions, configs FROM edge_topics {where}",
            params).fetchall():
        own = {str(k): str(v) for k, v in dict(configs).items()}  # type: ignore[call-overload]
        topics[str(name)] = TopicRows(
            TopicInfo(str(name), uuid.UUID(str(topic_id)), int(str(count)), own))
    where = where.replace("name", "topic")
    for row in conn.execute(
            f"SELECT topic, id, {state_columns} FROM edge_partitions {where}"
            " ORDER BY topic, partition", params).fetchall():
        rows = topics.get(str(row[0]))
        if rows is not None:
            rows.partitions.append((int(str(row[1])), row[2:]))
    return Snapshot(version, kv_version, topics)
