"""The statements on a PostgreSQL partition's rows in ``edge_entries`` that insert them,
read them by offset and by time, delete them a bounded chunk at a time and swap segments
for their cleaned batches. The segments' summaries (``pg_segments``) follow in the same
transaction: a group commit's in its one statement, a chunk's and a swap's once the
partition's row is locked. The partition (``pg_partition``) holds the locks, the cached
row and the epoch around them.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from broker_core.codec.batch_header import ATTRIBUTES_AT, BATCH_HEADER_SIZE, CONTROL_BIT

from . import pg_segments
from .model import BatchInfo
from .pg_database import Conn
from .pg_segments import Deleted
from .segments import SealedSegment


def batch_info(row: tuple[object, ...]) -> BatchInfo:
    """The batch of a row of ``ENTRY_COLUMNS`` (or ``HEADER_COLUMNS``)."""
    base, last, max_ts, broker_ts, batch = row
    assert isinstance(batch, bytes)
    return BatchInfo(int(str(base)), int(str(last)), int(str(max_ts)), int(str(broker_ts)),
                     batch)


ENTRY_COLUMNS = "base_offset, last_offset, max_ts, broker_ts, batch"
HEADER_COLUMNS = (
    "base_offset, last_offset, max_ts, broker_ts, CASE WHEN (get_byte(substring(batch FROM 1 "
    f"FOR {BATCH_HEADER_SIZE}), {ATTRIBUTES_AT + 1}) & {CONTROL_BIT}) <> 0 THEN batch ELSE "
    f"substring(batch FROM 1 FOR {BATCH_HEADER_SIZE}) END")
"""The entry columns with only the 61-byte header of a batch that is not a control batch
(attributes bit 5 clear; ``get_byte`` counts from 0, and the bit is in the attributes' low
byte): what replaying producer state reads, without the records."""


_ENTRY_ROW = "(%b::bigint, %b::bigint, %b::bigint, %b::bigint, %b::bigint, %b::bigint, %b::bytea)"

MAX_ENTRIES = 1000
"""Most entry rows one statement inserts (seven parameters each: PostgreSQL takes at most
65,535 in a statement)."""


def _insert(count: int) -> str:
    assert 0 < count <= MAX_ENTRIES
    return ("INSERT INTO edge_entries (partition_id, base_offset, last_offset, segment_base,"
            " broker_ts, max_ts, size, batch) SELECT e.partition_id, e.base_offset,"
            " e.last_offset, e.segment_base, e.broker_ts, e.max_ts, octet_length(e.batch),"
            f" e.batch FROM (VALUES {', '.join([_ENTRY_ROW] * count)}) AS e(partition_id,"
            " base_offset, last_offset, segment_base, broker_ts, max_ts, batch)")


@functools.lru_cache(maxsize=64)
def stored_entries(count: int, where: str = "") -> str:
    """Two common table expressions of a group commit's statement: ``stored``, the INSERT
    of ``count`` (at most ``MAX_ENTRIES``) entry rows, each a row of parameters
    (``entry_params``) in a VALUES list aliased ``e`` (those ``where`` keeps: a WHERE
    clause on ``e``), and ``summed``, which adds them to their segments' summaries
    (``pg_segments``). One statement, however many rows, and each batch received as it
    is sent (an array of them would be copied again on both sides)."""
    return (f"stored AS ({_insert(count)}{where} RETURNING {pg_segments.STORED}),"
            f" summed AS ({pg_segments.ADD_STORED})")


EntryRow = tuple[int, int, int, int, int, int, bytes | bytearray]
"""An entry row as ``entry_params`` takes it: partition id, base offset, last offset,
segment base, broker timestamp, max timestamp, batch."""


def entry_params(rows: Sequence[EntryRow]) -> list[object]:
    """The parameters of ``stored_entries(len(rows))``, in order."""
    return [value for row in rows for value in row]


def insert_entries(conn: Conn, rows: Sequence[EntryRow]) -> None:
    """Insert ``rows``, ``MAX_ENTRIES`` a statement (their segments' summaries are the
    caller's: ``pg_segments.add``)."""
    for at in range(0, len(rows), MAX_ENTRIES):
        part = rows[at:at + MAX_ENTRIES]
        conn.execute(_insert(len(part)), entry_params(part))


def rows_from(conn: Conn, pid: int, offset: int, limit: int,
              max_bytes: int | None = None,
              columns: str = ENTRY_COLUMNS) -> list[BatchInfo]:
    """Up to ``limit`` batches from the one holding ``offset`` (by the primary key);
    with ``max_bytes``, only the first and those that fit with it (the others' bytes
    never leave the server: a row's batch is read only when it is returned)."""
    # The LIMIT is taken before the running sum, so the window sees ``limit`` rows
    # whatever plan the statistics choose (a sort of the partition's rest, else).
    rows = conn.execute(
        f"SELECT {columns} FROM (SELECT *, sum(size) OVER (ORDER BY base_offset)"
        "  AS upto, row_number() OVER (ORDER BY base_offset) AS nth FROM"
        "  (SELECT * FROM edge_entries WHERE partition_id = %(p)s"
        "   AND base_offset >= coalesce((SELECT base_offset FROM edge_entries"
        "    WHERE partition_id = %(p)s AND base_offset <= %(o)s"
        "    ORDER BY base_offset DESC LIMIT 1), %(o)s)"
        "   AND last_offset >= %(o)s ORDER BY base_offset LIMIT %(n)s) AS head) AS page"
        " WHERE nth = 1 OR upto <= %(b)s ORDER BY base_offset",
        {"p": pid, "o": offset, "n": limit,
         "b": max_bytes if max_bytes is not None else 1 << 62}, binary=True).fetchall()
    return [batch_info(row) for row in rows]


def rows_newest(conn: Conn, pid: int, since: int, before: int | None, also: int | None,
                limit: int) -> list[BatchInfo]:
    """Up to ``limit`` batches whose base offset is in [``since``, ``before``) (None: no
    bound), newest first (the primary key read backwards), then the one at base offset
    ``also`` when it is stored below ``since`` (by the primary key): one statement."""
    rows = conn.execute(
        f"(SELECT {ENTRY_COLUMNS} FROM edge_entries WHERE partition_id = %(p)s"
        "  AND base_offset >= %(s)s AND base_offset < %(b)s ORDER BY base_offset DESC"
        "  LIMIT %(n)s)"
        f" UNION ALL (SELECT {ENTRY_COLUMNS} FROM edge_entries WHERE partition_id = %(p)s"
        "  AND base_offset = %(a)s AND base_offset < %(s)s) ORDER BY base_offset DESC",
        {"p": pid, "s": since, "b": (1 << 63) - 1 if before is None else before,
         "n": limit, "a": -1 if also is None else also}, binary=True).fetchall()
    return [batch_info(row) for row in rows]


_IN_SEGMENT = ("e.partition_id = s.partition_id AND e.base_offset >= s.first_offset"
               " AND e.base_offset < s.next_offset AND e.last_offset >= %(s)s")
"""The rows of segment ``s`` (a summary row) at or above the log start ``%(s)s``."""


def _in_segment(conn: Conn, pid: int, start: int, base: int, where: str, order: str,
                timestamp: int = 0) -> BatchInfo | None:
    """The first row by ``order`` of segment ``base`` at or above ``start`` that ``where``
    (a condition on ``e``, with ``%(t)s`` for ``timestamp``) keeps: a range of the primary
    key, the segment's rows at most, whatever the statistics."""
    row = conn.execute(
        f"SELECT e.* FROM edge_segments s CROSS JOIN LATERAL (SELECT {ENTRY_COLUMNS}"
        f" FROM edge_entries e WHERE {_IN_SEGMENT}{where} ORDER BY {order} LIMIT 1) AS e"
        " WHERE s.partition_id = %(p)s AND s.segment_base = %(b)s",
        {"p": pid, "s": start, "b": base, "t": timestamp}, binary=True).fetchone()
    return None if row is None else batch_info(row)


def first_at_least(conn: Conn, pid: int, start: int, timestamp: int) -> BatchInfo | None:
    """The first batch at or above ``start`` whose max timestamp is at least
    ``timestamp``: the rows of the first segment whose summary says it may hold one, in
    offset order (and of the next such, if a drop took the rows its summary counted).
    The segments are listed first, then searched one statement each: one statement
    joining them searched every listed segment before its LIMIT when the summaries had
    no statistics yet (a whole partition read for a time before its first record)."""
    for (base,) in conn.execute(
            "SELECT segment_base FROM edge_segments WHERE partition_id = %s"
            " AND next_offset > %s AND max_ts >= %s ORDER BY segment_base",
            (pid, start, timestamp)).fetchall():
        found = _in_segment(conn, pid, start, int(str(base)), " AND e.max_ts >= %(t)s",
                            "e.base_offset", timestamp)
        if found is not None:
            return found
    return None


def _rank(max_timestamp: int, base: int) -> tuple[int, int]:
    """Orders candidates for the largest max timestamp: the larger, then the first."""
    return max_timestamp, -base


def with_max_timestamp(conn: Conn, pid: int, start: int) -> BatchInfo | None:
    """The batch at or above ``start`` with the largest max timestamp (the first of
    those): the rows of the segment whose summary has the largest, then of the next ones
    in that order while theirs could still beat the best found (a drop may have taken the
    rows a summary counted)."""
    best: BatchInfo | None = None
    for base, largest in conn.execute(
            "SELECT segment_base, max_ts FROM edge_segments WHERE partition_id = %s"
            " AND next_offset > %s ORDER BY max_ts DESC, segment_base",
            (pid, start)).fetchall():
        if best is not None and _rank(int(str(largest)), int(str(base))) < _rank(
                best.max_timestamp, best.base_offset):
            break
        found = _in_segment(conn, pid, start, int(str(base)), "",
                            "e.max_ts DESC, e.base_offset")
        if found is not None and (best is None or _rank(
                found.max_timestamp, found.base_offset) > _rank(
                best.max_timestamp, best.base_offset)):
            best = found
    return best


DELETE_ROWS = 2000
"""Most rows one DELETE removes (``delete_chunk``): with ``DELETE_BYTES``, what keeps a
drop's statements far below the statement timeout, however large the drop."""
DELETE_BYTES = 32 << 20
"""Most bytes of batches one DELETE removes (its first row whole, whatever its size)."""

_NO_BOUND = (1 << 63) - 1

_CHUNK_ROWS = ("partition_id = %(p)s AND base_offset >= %(l)s AND last_offset < %(u)s"
               " AND (%(s)s::bigint[] IS NULL OR segment_base = ANY(%(s)s))")
"""The rows ``delete_chunk`` may delete (from ``low`` on: a range of the primary key)."""

_INDEX_ORDER = ("SELECT set_config('enable_bitmapscan', 'off', true),"
                " set_config('enable_seqscan', 'off', true)")
"""For the rest of the transaction, a walk of the primary key in order is the only plan:
with statistics that underrate a partition's rows (a partition filled since the last
ANALYZE) the planner would otherwise read and sort every row left in the range at each
chunk, quadratic in the rows dropped."""


def delete_chunk(conn: Conn, pid: int, low: int, high: int, *, last_below: int = _NO_BOUND,
                 segments: Sequence[int] | None = None) -> list[Deleted]:
    """Delete the first rows by base offset in [``low``, ``high``) whose last offset is
    below ``last_below`` (and whose segment is one of ``segments``, if given): at most
    ``DELETE_ROWS`` rows and ``DELETE_BYTES`` bytes, in one statement: the first rows are
    found by the primary key (a LIMIT, then their running size), and the DELETE takes the
    key range up to the last of them, so neither reads past the chunk (``_INDEX_ORDER``,
    in ``conn``'s transaction). What it deleted, per segment in offset order (for
    ``pg_segments.take``, once the partition's row is locked); nothing: nothing was left
    to delete."""
    conn.execute(_INDEX_ORDER)
    rows = conn.execute(
        f"WITH gone AS (DELETE FROM edge_entries WHERE {_CHUNK_ROWS} AND base_offset <= ("
        " SELECT max(base_offset) FROM (SELECT base_offset, sum(size) OVER (ORDER BY"
        "  base_offset) AS upto, row_number() OVER (ORDER BY base_offset) AS nth FROM"
        f"  (SELECT base_offset, size FROM edge_entries WHERE {_CHUNK_ROWS}"
        "   AND base_offset < %(h)s ORDER BY base_offset LIMIT %(n)s) AS first_rows)"
        "  AS chunk WHERE nth = 1 OR upto <= %(b)s)"
        " RETURNING segment_base, base_offset, last_offset, size)"
        " SELECT segment_base, min(base_offset), max(last_offset) + 1, sum(size)"
        " FROM gone GROUP BY segment_base ORDER BY segment_base",
        {"p": pid, "l": low, "h": high, "u": last_below,
         "s": None if segments is None else list(segments), "n": DELETE_ROWS,
         "b": DELETE_BYTES}).fetchall()
    return [Deleted(*(int(str(value)) for value in row)) for row in rows]


def any_below(conn: Conn, pid: int, offset: int) -> bool:
    """Whether a row wholly below ``offset`` is stored (a fresh look, by the primary key:
    a DELETE that came back empty may have skipped rows another transaction was deleting,
    and that transaction may have rolled back, or inserted rows of its own)."""
    return conn.execute(
        "SELECT EXISTS (SELECT 1 FROM edge_entries WHERE partition_id = %s"
        " AND base_offset < %s AND last_offset < %s)", (pid, offset, offset)
    ).fetchone() == (True,)


class SwapRefused(Exception):
    """The partition is no longer owned at the epoch, or its rows or log start changed:
    the swap's transaction rolls back."""


def swap_segments(conn: Conn, pid: int, epoch: int | None, segments: Sequence[SealedSegment],
                  batches: Sequence[BatchInfo]) -> int:
    """In ``conn``'s transaction: delete the segments' rows and insert ``batches`` (as rows
    of the first segment), the bytes reclaimed; :class:`SwapRefused` (roll back) unless the
    rows deleted are the segments as given, the batches begin at or above the log start,
    and, at the end, the partition is owned at ``epoch`` with that log start. The bulk
    work goes first, each statement bounded (``delete_chunk``, ``MAX_ENTRIES``), without
    the partition's row: its lock is taken last, just before the commit (and the segments'
    summaries then, as ``pg_segments.take`` says why), so the group commits of the
    partition (and of every partition committed with it) wait for no more than that."""
    first = segments[0]
    start = conn.execute("SELECT log_start FROM edge_partitions WHERE id = %s",
                         (pid,)).fetchone()
    if start is None:
        raise SwapRefused
    log_start = int(str(start[0]))
    if batches and batches[0].last_offset < log_start:
        raise SwapRefused  # read before the log start last moved: the rows it deletes and
        # those reinserted would leave a hole below the log start (cleaned next round)
    idents = [segment.ident for segment in segments]
    found: dict[int, tuple[int, int, int]] = {}
    low, high = first.first_offset, segments[-1].next_offset
    while chunk := delete_chunk(conn, pid, low, high, segments=idents):
        for gone in chunk:
            was = found.get(gone.segment)
            found[gone.segment] = (gone.first_offset, gone.next_offset, gone.size_bytes) \
                if was is None else (was[0], gone.next_offset, was[2] + gone.size_bytes)
        low = chunk[-1].next_offset
    as_given = {s.ident: (s.first_offset, s.next_offset, s.size_bytes) for s in segments}
    if found != as_given:
        raise SwapRefused
    insert_entries(conn, [(pid, info.base_offset, info.last_offset, first.ident,
                           info.broker_timestamp, info.max_timestamp, bytes(info.batch))
                          for info in batches])
    reclaimed = sum(s.size_bytes for s in segments) - sum(len(info.batch) for info in batches)
    if conn.execute(
            "UPDATE edge_partitions SET size_bytes = size_bytes - %(r)s WHERE id = %(p)s"
            " AND owner_epoch = coalesce(%(e)s, owner_epoch) AND log_start = %(s)s"
            " RETURNING 1", {"r": reclaimed, "p": pid, "e": epoch, "s": log_start}
    ).fetchone() is None:
        raise SwapRefused
    pg_segments.take(conn, pid, [Deleted(ident, *found[ident]) for ident in idents])
    pg_segments.add(conn, pid, first.ident, batches)
    return reclaimed
