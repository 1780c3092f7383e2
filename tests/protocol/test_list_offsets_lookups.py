"""ListOffsets' lookups by time against a real store (each engine; PostgreSQL is where a
read forward costs what it holds): the answer, and what a lookup holds in memory while it
looks (traced by ``tracemalloc`` in this process: the rows a query returns are bytes
objects), which must not grow with the log after the batch that answers."""

from __future__ import annotations

import asyncio
import os
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_core.apis.list_offsets import MAX_TIMESTAMP, _looked_up, _lookup
from broker_core.storage import ENGINES, LogConfig, PartitionStore, Storage, open_storage
from tests.batches import build_batch
from tests.postgres_server import shared_server
from tests.storage_helpers import headed

BIG = 1 << 20
"""The size of the large batches the log goes on with."""
BIG_BATCHES = 24
HELD = 8 << 20
"""What a lookup may hold at its peak: a few large batches, not the log's 24 MiB."""


@pytest.fixture(params=sorted(set(ENGINES) - {"postgresql"}))  # an alias of postgres
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return shared_server().new_database_url()
    return (tmp_path / "data").as_uri() if request.param == "file" else "memory://"


@pytest.fixture
def storage(url: str) -> Iterator[Storage]:
    opened = open_storage(url, LogConfig(segment_bytes=1 << 30))
    opened.create_topic("t", 1, {})
    yield opened
    opened.close()


def _partition(storage: Storage) -> PartitionStore:
    partition = storage.partition("t", 0)
    assert partition is not None
    return partition


def _go_on_big(partition: PartitionStore, timestamp: int) -> None:
    """BIG_BATCHES batches of one incompressible BIG record, stamped from ``timestamp``."""
    for i in range(BIG_BATCHES):
        partition.append(*headed(build_batch([(None, os.urandom(BIG))],
                                             timestamp=timestamp + i)))


def _peak(partition: PartitionStore, target: int) -> tuple[tuple[int, int], int]:
    """The lookup's answer and the most memory it held meanwhile."""
    tracemalloc.start()
    try:
        found = _lookup(partition, target)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return found, peak


def test_by_time_holds_the_answering_batch_not_the_rows_after_it(storage: Storage) -> None:
    """The first batch stamped at or after the target answers from its records: the log
    after it is not read (PostgreSQL read 64 rows of any size after it)."""
    partition = _partition(storage)
    _go_on_big(partition, 1_000)
    found, peak = _peak(partition, 1_003)
    assert found == (3, 1_003)
    assert peak < HELD


def _never_read_on(partition: PartitionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail a lookup that reads the log on batch by batch (rather than asking the store
    for the batch it needs: what a straddling batch costs must not grow with the log)."""
    def read_on(offset: int) -> None:
        raise AssertionError(f"the log read on from offset {offset}")

    monkeypatch.setattr(partition, "batches_from", read_on)
    monkeypatch.setattr(partition, "headers_from", read_on)


def test_by_time_asks_on_when_the_found_batch_answers_nothing(
        storage: Storage, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch straddling the log start whose only late record lies below it: the answer
    is in a later batch, which the store finds (the batches between are not read)."""
    partition = _partition(storage)
    _never_read_on(partition, monkeypatch)
    partition.append(*headed(build_batch([(None, b"a"), (None, b"b")], timestamp=9_000,
                                         timestamp_step=-8_000)))  # 9000, 1000
    for _ in range(3):  # passed over by their max timestamp
        partition.append(*headed(build_batch([(None, b"x")], timestamp=1_500)))
    partition.append(*headed(build_batch([(None, b"c"), (None, b"d")], timestamp=2_000,
                                         timestamp_step=4_000)))  # 2000, 6000
    assert partition.delete_records_before(1) == 1
    assert _lookup(partition, 5_000) == (6, 6_000)
    assert _lookup(partition, 1_000) == (1, 1_000)
    assert _lookup(partition, 7_000) == (-1, -1)


def test_max_timestamp_straddling_the_log_start_reads_no_batch_after_it(
        storage: Storage, monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch of the largest max timestamp straddles the log start and its record
    after the start is the largest left: the store's best batch after it is weighed
    against it, and the log after it is neither read on nor held."""
    partition = _partition(storage)
    _never_read_on(partition, monkeypatch)
    partition.append(*headed(build_batch([(None, b"a"), (None, b"b")], timestamp=9_001,
                                         timestamp_step=-1_001)))  # 9001, 8000
    _go_on_big(partition, 1_000)
    assert partition.delete_records_before(1) == 1
    found, peak = _peak(partition, MAX_TIMESTAMP)
    assert found == (1, 8_000)
    assert peak < HELD


def test_max_timestamp_straddling_the_log_start_finds_a_later_record(
        storage: Storage, monkeypatch: pytest.MonkeyPatch) -> None:
    partition = _partition(storage)
    _never_read_on(partition, monkeypatch)
    partition.append(*headed(build_batch([(None, b"a"), (None, b"b")], timestamp=9_001,
                                         timestamp_step=-8_001)))  # 9001, 1000
    partition.append(*headed(build_batch([(None, b"c"), (None, b"d"), (None, b"e")],
                                         timestamp=3_000, timestamp_step=2_000)))
    partition.append(*headed(build_batch([(None, b"f")], timestamp=7_000)))
    assert partition.delete_records_before(1) == 1
    assert _lookup(partition, MAX_TIMESTAMP) == (4, 7_000)  # the first of the largest


def test_a_lookup_overtaken_by_a_drop_is_done_again_off_the_event_loop(
        storage: Storage, monkeypatch: pytest.MonkeyPatch) -> None:
    """A log start that moved while the lookup ran has it run again, in the lookups'
    thread too (on PostgreSQL a lookup is SQL, which never runs on the event loop)."""
    partition = _partition(storage)
    for i in range(3):
        partition.append(*headed(build_batch([(None, b"x"), (None, b"y")],
                                             timestamp=1_000 + 10 * i)))
    threads: list[str] = []
    find = partition.find_first_batch_with_timestamp_at_least

    def found_while_dropping(timestamp: int, from_offset: int = 0) -> object:
        threads.append(threading.current_thread().name)
        if len(threads) == 1:  # DeleteRecords overtakes the first lookup
            partition.delete_records_before(3)
        return find(timestamp, from_offset)

    monkeypatch.setattr(partition, "find_first_batch_with_timestamp_at_least",
                        found_while_dropping)

    async def looked_up() -> tuple[tuple[int, int], str]:
        answer = await _looked_up(partition, 1_000, lambda: partition.next_offset)
        return answer, threading.current_thread().name

    answer, loop_thread = asyncio.run(looked_up())
    assert answer == (3, 1_011)
    assert len(threads) == 2 and loop_thread not in threads
