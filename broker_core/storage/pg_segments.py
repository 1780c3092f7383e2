"""The per-segment summary of a PostgreSQL partition's rows (``edge_segments``): one row
per segment (its base offset) with the offsets its rows cover, their bytes, their oldest
and newest broker timestamps and their largest batch max timestamp, kept in the same
transaction as every change to the rows: by the group commit's statement, and after the
partition's row is locked by a drop's chunk and by the cleaner's swap (``pg_entries``,
``pg_partition``; :func:`take` says why then). Retention, the cleaner's list of segments
and the lookups by time read it, then the rows of one segment at most, not every row of
the partition.

Offsets and bytes are exact. The timestamps are bounds once a drop deleted part of a
segment (its oldest rows: the newest broker timestamp and the largest max timestamp may
have gone with them), as a Kafka segment file keeps its time index when the log start
moves into it: a lookup that finds no row in a segment goes on to the next.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from .model import BatchInfo
from .pg_database import Conn
from .segments import SealedSegment

_COLUMNS = ("(partition_id, segment_base, first_offset, next_offset, size_bytes,"
            " min_broker_ts, max_broker_ts, max_ts)")
_SUMMED = ("SELECT partition_id, segment_base, min(base_offset), max(last_offset) + 1,"
           " sum(size), min(broker_ts), max(broker_ts), max(max_ts) FROM {rows}"
           " GROUP BY partition_id, segment_base")

SUMMARIZE = "INSERT INTO edge_segments " + _COLUMNS + " " + _SUMMED
"""The summary of the rows of ``{rows}`` (a table, or a ``RETURNING`` of entry rows), by
segment: what the migration that created the table filled it with."""

_MERGE = (
    " ON CONFLICT (partition_id, segment_base) DO UPDATE"
    " SET first_offset = least(s.first_offset, excluded.first_offset),"
    " next_offset = greatest(s.next_offset, excluded.next_offset),"
    " size_bytes = s.size_bytes + excluded.size_bytes,"
    " min_broker_ts = least(s.min_broker_ts, excluded.min_broker_ts),"
    " max_broker_ts = greatest(s.max_broker_ts, excluded.max_broker_ts),"
    " max_ts = greatest(s.max_ts, excluded.max_ts)")
"""What an insert into ``edge_segments AS s`` does with a segment already summarised:
adds to its summary."""

ADD_STORED = ("INSERT INTO edge_segments AS s " + _COLUMNS + " "
              + _SUMMED.format(rows="stored") + _MERGE)
"""Adds the rows a data-modifying ``stored`` (an INSERT of entry rows ``RETURNING
STORED``) inserted to their segments' summaries, in the same statement (a group commit's:
after its ``UPDATE`` of the partitions' rows, see :func:`take`)."""

STORED = "partition_id, segment_base, base_offset, last_offset, size, broker_ts, max_ts"
"""What an INSERT of entry rows returns for ``ADD_STORED``."""

class Deleted(NamedTuple):
    """The rows one ``pg_entries.delete_chunk`` deleted of one segment."""

    segment: int
    first_offset: int
    next_offset: int
    """One past the last offset deleted."""
    size_bytes: int


_TAKE = (
    "WITH per AS (SELECT * FROM unnest(%(seg)s::bigint[], %(first)s::bigint[],"
    "  %(next)s::bigint[], %(size)s::bigint[]) AS per(segment_base, first, next, size)),"
    " emptied AS (DELETE FROM edge_segments s USING per WHERE s.partition_id = %(p)s"
    "  AND s.segment_base = per.segment_base AND per.first <= s.first_offset"
    "  AND per.next >= s.next_offset)"
    " UPDATE edge_segments s SET size_bytes = s.size_bytes - per.size,"
    "  first_offset = CASE WHEN per.first <= s.first_offset THEN per.next"
    "   ELSE s.first_offset END,"
    "  next_offset = CASE WHEN per.next >= s.next_offset THEN per.first"
    "   ELSE s.next_offset END"
    " FROM per WHERE s.partition_id = %(p)s AND s.segment_base = per.segment_base"
    " AND NOT (per.first <= s.first_offset AND per.next >= s.next_offset)")


def take(conn: Conn, pid: int, gone: Sequence[Deleted]) -> None:
    """Take what ``gone`` says was deleted of partition ``pid``'s segments (each a run of
    their rows: a drop deletes a segment's oldest rows; the cleaner's swap all of them, or
    those from the first row at or above the log start on) out of their summaries: a
    segment left without rows loses its summary, one that lost its first (or last) rows
    starts (or ends) where they ended (or began).

    Run after the statement that locks the partition's row in the same transaction, as a
    group commit locks that row before it adds to the summary of the segment appends go
    to: a drop into that segment that took the summary's lock first would wait for the
    partition's row while the group commit waits for the summary (a deadlock)."""
    if gone:
        conn.execute(_TAKE, {"p": pid, "seg": [g.segment for g in gone],
                             "first": [g.first_offset for g in gone],
                             "next": [g.next_offset for g in gone],
                             "size": [g.size_bytes for g in gone]})


_ADD = ("INSERT INTO edge_segments AS s " + _COLUMNS + " VALUES (%(p)s, %(b)s, %(f)s,"
        " %(n)s, %(z)s, %(lo)s, %(hi)s, %(t)s)" + _MERGE)


def add(conn: Conn, pid: int, segment: int, batches: Sequence[BatchInfo]) -> None:
    """Add ``batches``, inserted as rows of partition ``pid``'s segment ``segment``, to its
    summary (after the partition's row is locked, as :func:`take`)."""
    if batches:
        conn.execute(_ADD, {
            "p": pid, "b": segment, "f": batches[0].base_offset,
            "n": batches[-1].last_offset + 1, "z": sum(len(b.batch) for b in batches),
            "lo": min(b.broker_timestamp for b in batches),
            "hi": max(b.broker_timestamp for b in batches),
            "t": max(b.max_timestamp for b in batches)})


_SUMMARIES = (
    "SELECT s.segment_base, coalesce(r.first, s.first_offset), s.next_offset,"
    " coalesce(r.size, s.size_bytes), coalesce(r.min_broker_ts, s.min_broker_ts),"
    " coalesce(r.max_broker_ts, s.max_broker_ts), coalesce(r.max_ts, s.max_ts)"
    " FROM edge_segments s LEFT JOIN LATERAL (SELECT min(e.base_offset) AS first,"
    "  sum(e.size) AS size, min(e.broker_ts) AS min_broker_ts,"
    "  max(e.broker_ts) AS max_broker_ts, max(e.max_ts) AS max_ts FROM edge_entries e"
    "  WHERE e.partition_id = s.partition_id AND e.base_offset >= s.first_offset"
    "  AND e.base_offset < s.next_offset AND e.last_offset >= %(s)s"
    "  AND s.first_offset < %(s)s AND EXISTS (SELECT 1 FROM edge_entries f"
    "   WHERE f.partition_id = s.partition_id AND f.base_offset = s.first_offset"
    "   AND f.last_offset < %(s)s)) AS r ON true"
    " WHERE s.partition_id = %(p)s AND s.segment_base < %(b)s AND s.next_offset > %(s)s"
    " ORDER BY s.segment_base")


def summaries(conn: Conn, pid: int, start: int, before: int) -> list[SealedSegment]:
    """The segments of partition ``pid`` with a row at or above ``start`` (the log start)
    whose base offset is below ``before``, in offset order, from their summaries. Only a
    segment that still holds rows wholly below ``start`` (a drop not yet swept) is summed
    from its rows, from the first at or above ``start``."""
    rows = conn.execute(_SUMMARIES, {"p": pid, "s": start, "b": before}).fetchall()
    return [SealedSegment(*(int(str(value)) for value in row)) for row in rows]
