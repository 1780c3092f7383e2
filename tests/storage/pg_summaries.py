"""A check that a PostgreSQL database's segment summaries (``edge_segments``,
``broker_core/storage/pg_segments.py``) say what its entry rows hold: for every segment
with rows, its first and next offsets and its bytes exactly; its timestamps as bounds
(a drop that deleted a segment's oldest rows may have taken its newest timestamps); no
summary of a segment without rows."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg

from broker_core.storage import LogConfig, Storage, open_storage
from tests.postgres_server import shared_server

_FROM_ROWS = (
    "SELECT partition_id, segment_base, min(base_offset), max(last_offset) + 1, sum(size),"
    " min(broker_ts), max(broker_ts), max(max_ts) FROM edge_entries"
    " GROUP BY partition_id, segment_base")
_SUMMARIES = (
    "SELECT partition_id, segment_base, first_offset, next_offset, size_bytes,"
    " min_broker_ts, max_broker_ts, max_ts FROM edge_segments")


def summary_problems(url: str) -> list[str]:
    """What the summaries of the database at ``url`` get wrong (empty: nothing)."""
    with psycopg.connect(url) as conn:
        rows = {(int(r[0]), int(r[1])): [int(v) for v in r[2:]]
                for r in conn.execute(_FROM_ROWS).fetchall()}
        summed = {(int(r[0]), int(r[1])): [int(v) for v in r[2:]]
                  for r in conn.execute(_SUMMARIES).fetchall()}
    problems = [f"segment {key}: no summary of its rows {rows[key]}"
                for key in rows.keys() - summed.keys()]
    problems += [f"segment {key}: a summary {summed[key]} without rows"
                 for key in summed.keys() - rows.keys()]
    for key in rows.keys() & summed.keys():
        (first, end, size, oldest, newest, largest) = rows[key]
        (s_first, s_end, s_size, s_oldest, s_newest, s_largest) = summed[key]
        if (s_first, s_end, s_size) != (first, end, size) or s_oldest > oldest \
                or s_newest < newest or s_largest < largest:
            problems.append(f"segment {key}: summary {summed[key]}, rows {rows[key]}")
    return problems


def check_summaries(url: str) -> None:
    """AssertionError unless the summaries of the database at ``url`` are right."""
    problems = summary_problems(url)
    assert not problems, problems


def checked_storage(config: LogConfig, topic: str, partitions: int) -> Iterator[Storage]:
    """A fixture's body: storage on a new database of the shared server with ``topic``
    created, closed after the test, its summaries checked then."""
    opened = open_storage(shared_server().new_database_url(), config)
    opened.create_topic(topic, partitions, {})
    yield opened
    opened.close()
    check_summaries(opened.location)
