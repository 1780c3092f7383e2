"""Read-ahead of the ``postgres://`` engine (``broker_core/storage/pg_readahead.py``): a
read that leaves more of the log behind it has the next page read in a worker, and the
next read of that page is answered from memory, with the same batches a fresh read gives.
On a real PostgreSQL server (``tests/postgres_server.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from broker_core.storage import LogConfig, Storage, open_storage
from broker_core.storage.postgres import PgPartition
from tests.postgres_server import shared_server
from tests.storage_helpers import batch_bytes
from tests.test_storage_engines import TOPIC, append, partition


@pytest.fixture
def storage() -> Iterator[Storage]:
    opened = open_storage(shared_server().new_database_url(), LogConfig())
    opened.create_topic(TOPIC, 1, {})
    yield opened
    opened.close()


def bases(chunks: list[memoryview]) -> list[int]:
    return [int.from_bytes(batch_bytes(c)[:8], "big") for c in chunks]


def wait_for_page_ahead(log: PgPartition) -> None:
    """Until the page read ahead is in memory (the worker's future is done)."""
    ahead = log._ahead  # the one page a partition keeps ahead
    assert ahead is not None, "no page is read ahead"
    ahead[2].result(30)


def test_the_next_page_is_read_ahead_and_served_from_memory(storage: Storage) -> None:
    log = partition(storage)
    assert isinstance(log, PgPartition)
    offsets = [append(log, 10, size=100) for _ in range(12)]
    page = len(bytes(log.read(0, 1 << 20)[0]))  # one batch's size: a page per batch
    first = log.read(0, page)
    assert bases(first) == offsets[:1]
    wait_for_page_ahead(log)
    with psycopg.connect(storage.location, autocommit=True) as conn:
        # the stored rows go away behind the broker's back: only a page already in
        # memory can still answer (nothing the broker does deletes rows above log start)
        conn.execute("DELETE FROM edge_entries WHERE base_offset = %s", (offsets[1],))
    second = log.read(offsets[1], page)
    assert bases(second) == offsets[1:2]
    wait_for_page_ahead(log)  # and on: the third page is read ahead in turn
    assert bases(log.read(offsets[2], page)) == offsets[2:3]


def test_pages_read_ahead_give_what_fresh_reads_give(storage: Storage) -> None:
    log = partition(storage)
    assert isinstance(log, PgPartition)
    offsets = [append(log, n, size=300) for n in (3, 1, 4, 1, 5, 9, 2, 6)]
    fresh = [bytes(c) for c in log.read(0, 1 << 20)]
    read: list[bytes] = []
    offset = 0
    while offset < log.next_offset:
        chunks = log.read(offset, 2500)  # a few batches a page, read ahead after each
        assert chunks
        read += [bytes(c) for c in chunks]
        head = batch_bytes(chunks[-1])
        offset = int.from_bytes(head[:8], "big") + int.from_bytes(head[23:27], "big") + 1
    assert read == fresh and bases([memoryview(b) for b in read]) == offsets
    assert log.read(log.next_offset, 2500) == []
    added = append(log, 2, size=300)  # a reader at the end sees new appends at once
    assert bases(log.read(added, 2500)) == [added]
    other = log.read(0, 100)  # another size: the page ahead is not used
    assert bases(other) == offsets[:1]
