"""Every storage engine, through the ``Storage`` / ``PartitionStore`` / ``KeyValueStore``
protocols only: the same behaviour from ``file://``, ``memory://`` and ``postgres://``."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from broker_core.codec.markers import marker_batch
from broker_core.partition_producers import PartitionProducers
from broker_core.storage import (
    ENGINES,
    KeyValueStore,
    LogClosed,
    LogConfig,
    OffsetOutOfRange,
    PartitionStore,
    Storage,
    TopicExists,
    UnknownTopic,
    open_storage,
)
from tests.batches import make_batch
from tests.postgres_server import shared_server
from tests.storage.pg_summaries import check_summaries
from tests.storage_helpers import batch_bytes, headed

TOPIC = "public/default/t"


class Clock:
    """A settable clock, in ms."""

    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture(params=sorted(set(ENGINES) - {"postgresql"}))  # an alias of postgres
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def storage(engine: str, tmp_path: Path, clock: Clock) -> Iterator[Storage]:
    if engine == "postgres":
        url = shared_server().new_database_url()
    else:
        url = (tmp_path / "data").as_uri() if engine == "file" else "memory://"
    opened = open_storage(url, LogConfig(segment_bytes=4096), clock=clock)
    yield opened
    opened.close()
    if engine == "postgres":
        check_summaries(url)


def append(log: PartitionStore, count: int, first_timestamp: int = 1_000,
           size: int = 50) -> int:
    return log.append(*headed(make_batch(count, first_timestamp, size)))


def partition(storage: Storage, name: str = TOPIC, index: int = 0) -> PartitionStore:
    log = storage.partition(name, index)
    assert log is not None
    return log


def test_a_batch_is_stored_from_the_request_bytes_as_they_are(storage: Storage) -> None:
    # a produced batch reaches the storage as a read-only view of the request's bytes (no
    # copy on the way): each engine stores it at its own offset and leaves it unchanged
    storage.create_topic(TOPIC, 1, {})
    log = partition(storage)
    batch, header = headed(make_batch(3))
    sent = bytes(batch)
    assert [log.append(memoryview(sent), header) for _ in range(2)] == [0, 3]
    assert sent == bytes(batch)
    stored = [batch_bytes(chunk) for chunk in log.read(0, 1 << 20)]
    assert [int.from_bytes(chunk[:8], "big") for chunk in stored] == [0, 3]
    assert [chunk[8:] for chunk in stored] == [sent[8:]] * 2


def test_offsets_are_continuous_and_reads_follow_them(storage: Storage) -> None:
    storage.create_topic(TOPIC, 2, {})
    log = partition(storage)
    bases = [append(log, n) for n in (3, 1, 5, 2)]
    assert bases == [0, 3, 4, 9]
    assert (log.log_start_offset, log.next_offset) == (0, 11)
    assert partition(storage, index=1).next_offset == 0
    chunks = log.read(4, 1)  # the first batch comes whole even beyond max_bytes
    assert len(chunks) == 1
    first = batch_bytes(chunks[0])
    assert int.from_bytes(first[:8], "big") == 4
    everything = log.read(0, 1 << 20)
    assert [int.from_bytes(batch_bytes(c)[:8], "big") for c in everything] == bases
    assert log.read(11, 100) == []
    with pytest.raises(OffsetOutOfRange):
        log.read(12, 100)
    assert [info.base_offset for info in log.batches_from(5)] == [4, 9]
    assert log.size_bytes > 0


def test_batches_from_follows_appends_made_while_iterating(storage: Storage) -> None:
    storage.create_topic(TOPIC, 1, {})
    log = partition(storage)
    append(log, 1)
    seen = []
    for info in log.batches_from(0):
        seen.append(info.base_offset)
        if len(seen) < 3:
            append(log, 1)
    assert seen == [0, 1, 2]


def test_headers_from_gives_each_header_and_control_batches_whole(engine: str,
                                                                 storage: Storage) -> None:
    """What the producer state is rebuilt from: on postgres:// only the 61-byte headers of
    data batches leave the database (not their records), control batches come whole, and
    the state rebuilt from them is the one rebuilt from the whole batches."""
    storage.create_topic(TOPIC, 1, {})
    log = partition(storage)
    append(log, 3, size=2000)
    log.append(*headed(make_batch(2, size=2000, producer_id=7)))  # a transaction...
    log.append(*headed(marker_batch(7, 0, False, 1_002)))  # ...aborted
    append(log, 1, size=2000)
    whole = list(log.batches_from(1))
    headers = list(log.headers_from(1))
    assert [h.base_offset for h in headers] == [b.base_offset for b in whole] == [0, 3, 5, 6]
    for header, batch in zip(headers, whole, strict=True):
        assert (header.last_offset, header.max_timestamp, header.broker_timestamp) == (
            batch.last_offset, batch.max_timestamp, batch.broker_timestamp)
        assert bytes(header.batch[:61]) == bytes(batch.batch[:61])
    assert bytes(headers[2].batch) == bytes(whole[2].batch)  # the control batch, whole
    data = [headers[i] for i in (0, 1, 3)]
    if engine == "postgres":
        assert [len(h.batch) for h in data] == [61, 61, 61]
    else:  # at hand: whole
        assert [bytes(h.batch) for h in data] == [bytes(whole[i].batch) for i in (0, 1, 3)]
    from_headers, from_batches = PartitionProducers(), PartitionProducers()
    for header, batch in zip(headers, whole, strict=True):
        from_headers.apply(header)
        from_batches.apply(batch)
    assert from_headers.aborted == from_batches.aborted == [(7, 3, 5)]
    assert from_headers.last_stable_offset(7, 0) == from_batches.last_stable_offset(7, 0) == 7


def test_timestamps_lookups(storage: Storage) -> None:
    storage.create_topic(TOPIC, 1, {})
    log = partition(storage)
    append(log, 2, first_timestamp=5_000)
    append(log, 2, first_timestamp=9_000)
    append(log, 2, first_timestamp=7_000)
    found = log.find_first_batch_with_timestamp_at_least(6_000)
    assert found is not None and found.base_offset == 2
    assert log.find_first_batch_with_timestamp_at_least(20_000) is None
    best = log.batch_with_max_timestamp()
    assert best is not None and (best.base_offset, best.max_timestamp) == (2, 9_001)


def test_delete_records_moves_the_log_start(storage: Storage) -> None:
    storage.create_topic(TOPIC, 1, {"segment.bytes": "300"})
    log = partition(storage)
    for _ in range(6):
        append(log, 2)
    assert log.delete_records_before(5) == 5
    assert log.log_start_offset == 5
    assert log.delete_records_before(1) == 5  # never backwards
    with pytest.raises(OffsetOutOfRange):
        log.read(3, 100)
    chunks = log.read(5, 1 << 20)
    assert int.from_bytes(batch_bytes(chunks[0])[:8], "big") == 4  # the batch holding 5
    with pytest.raises(OffsetOutOfRange):
        log.delete_records_before(13)
    assert log.delete_records_before(12) == 12
    assert log.read(12, 100) == []
    assert append(log, 1) == 12


def test_retention_by_time_and_by_size(storage: Storage, clock: Clock) -> None:
    storage.create_topic(TOPIC, 1, {"segment.bytes": "300", "retention.ms": "10000"})
    log = partition(storage)
    for _ in range(4):
        append(log, 2)  # each batch fills a segment of its own
    clock.now += 5_000
    append(log, 2)
    clock.now += 6_000  # the first four segments are 11 s old, the fifth 6 s
    assert storage.enforce_retention() == 4
    assert log.log_start_offset == 8
    storage.alter_topic_configs(TOPIC, {"segment.bytes": "300", "retention.ms": "-1",
                                        "retention.bytes": "1"})
    append(log, 2)
    assert storage.enforce_retention() == 1  # never the open segment
    assert (log.log_start_offset, log.next_offset) == (10, 12)


def test_retention_found_due_then_dropped_after_the_log_moved_on(storage: Storage,
                                                                 clock: Clock) -> None:
    """Retention's two steps (``retention_due`` in a worker thread, ``drop_retained`` on
    the loop) with the log moving in between: what was appended since is kept, and a
    DeleteRecords that went further first leaves nothing to drop."""
    storage.create_topic(TOPIC, 1, {"segment.bytes": "300", "retention.ms": "10000"})
    log = partition(storage)
    for _ in range(2):
        append(log, 2)  # a segment each
    clock.now += 11_000
    with ThreadPoolExecutor(1) as thread:
        due = thread.submit(storage.retention_due).result()
    assert [(item.cut.keep_from, item.cut.segments) for item in due] == [(4, 2)]  # all
    append(log, 2)  # the open one sealed meanwhile (as old as judged); this one is new
    assert storage.drop_retained(due) == 2
    assert (log.log_start_offset, log.next_offset) == (4, 6)
    clock.now += 11_000
    due = storage.retention_due()
    assert [(item.cut.keep_from, item.cut.segments) for item in due] == [(6, 1)]
    assert log.delete_records_before(6) == 6
    assert storage.drop_retained(due) == 0
    assert (log.log_start_offset, log.next_offset) == (6, 6)
    assert storage.enforce_retention() == 0  # an empty open segment never goes


def test_retention_by_time_empties_an_idle_partition(storage: Storage, clock: Clock) -> None:
    """As Kafka's ``deleteSegments``: when every segment is past ``retention.ms``, the open
    one included, a new segment is rolled at the end and the rest dropped; the log start
    is the log end, and appends and reads go on from there."""
    storage.create_topic(TOPIC, 1, {"segment.bytes": "300", "retention.ms": "10000"})
    log = partition(storage)
    for _ in range(3):
        append(log, 2)  # a segment each, the last one open
    clock.now += 5_000
    assert storage.enforce_retention() == 0  # none is due yet
    clock.now += 6_000
    assert storage.enforce_retention() == 3
    assert (log.log_start_offset, log.next_offset) == (6, 6)
    assert list(log.batches_from(6)) == []
    assert storage.enforce_retention() == 0
    assert append(log, 2) == 6
    assert [info.base_offset for info in log.batches_from(6)] == [6]
    assert log.log_start_offset == 6
    clock.now += 5_000
    assert storage.enforce_retention() == 0  # the new one is not due


def test_retention_by_size_keeps_the_open_segment_but_at_zero(storage: Storage) -> None:
    """Kafka's size rule: the oldest segments go while the partition still holds
    ``retention.bytes`` without them, so the open segment never goes while it holds
    something, but with ``retention.bytes`` 0."""
    storage.create_topic(TOPIC, 1, {"segment.bytes": "300", "retention.bytes": "1"})
    log = partition(storage)
    for _ in range(3):
        append(log, 2)
    assert storage.enforce_retention() == 2
    assert (log.log_start_offset, log.next_offset) == (4, 6)
    storage.alter_topic_configs(TOPIC, {"segment.bytes": "300", "retention.bytes": "0"})
    assert storage.enforce_retention() == 1
    assert (log.log_start_offset, log.next_offset) == (6, 6)
    assert storage.enforce_retention() == 0


def test_topic_configs_apply_to_the_partitions(storage: Storage) -> None:
    info = storage.create_topic(TOPIC, 1, {"retention.ms": "-1"})
    assert info.configs == {"retention.ms": "-1"}
    log = partition(storage)
    for _ in range(3):
        append(log, 2)
    assert storage.enforce_retention() == 0
    changed = storage.alter_topic_configs(TOPIC, {"segment.bytes": "300"})
    assert changed.configs == {"segment.bytes": "300"}
    topic = storage.topic(TOPIC)
    assert topic is not None and topic.configs == {"segment.bytes": "300"}
    with pytest.raises(ValueError, match=r"segment\.bytes"):
        storage.alter_topic_configs(TOPIC, {"segment.bytes": "0"})


def test_topics_are_created_grown_and_deleted(storage: Storage) -> None:
    info = storage.create_topic(TOPIC, 2, {})
    with pytest.raises(TopicExists):
        storage.create_topic(TOPIC, 1, {})
    with pytest.raises(ValueError, match="nests"):
        storage.create_topic(TOPIC + "/x", 1, {})
    with pytest.raises(ValueError, match="invalid topic name"):
        storage.create_topic("a//b", 1, {})
    assert storage.add_partitions(TOPIC, 3).num_partitions == 3
    with pytest.raises(ValueError):
        storage.add_partitions(TOPIC, 2)
    assert [name for name, _, _ in storage.all_partitions()] == [TOPIC] * 3
    log = partition(storage, index=2)
    append(log, 1)
    assert [t.topic_id for t in storage.topics()] == [info.topic_id]
    storage.delete_topic(TOPIC)
    assert storage.topic(TOPIC) is None and storage.partition(TOPIC, 0) is None
    with pytest.raises(UnknownTopic):
        storage.delete_topic(TOPIC)
    with pytest.raises(LogClosed):
        append(log, 1)
    again = storage.create_topic(TOPIC, 1, {})
    assert again.topic_id != info.topic_id
    assert partition(storage).next_offset == 0


def test_key_value_areas(storage: Storage) -> None:
    assert storage.kv.get("meta.properties") is None
    storage.kv.put("meta.properties", b"one")
    storage.kv.put("meta.properties", b"two", durable=False)
    assert storage.kv.get("meta.properties") == b"two"
    storage.create_topic(TOPIC, 1, {})
    log = partition(storage)
    log.state.put("producer-state.json", b"{}", durable=False)
    assert log.state.get("producer-state.json") == b"{}"
    assert storage.kv.get("producer-state.json") is None  # one area per partition
    storage.delete_topic(TOPIC)
    with pytest.raises(LogClosed):  # a snapshot of a deleted partition lands nowhere
        log.state.put("producer-state.json", b"{}")
    storage.create_topic(TOPIC, 1, {})
    assert partition(storage).state.get("producer-state.json") is None


def test_compare_and_set_stores_only_over_the_value_expected(storage: Storage) -> None:
    storage.create_topic(TOPIC, 1, {})
    log = partition(storage)
    for kv in (storage.kv, log.state):
        assert kv.compare_and_set("claim", None, b"one")
        assert not kv.compare_and_set("claim", None, b"two")  # there is a value now
        assert not kv.compare_and_set("claim", b"other", b"two")
        assert kv.get("claim") == b"one"
        assert kv.compare_and_set("claim", b"one", b"two")
        assert kv.get("claim") == b"two"
    storage.delete_topic(TOPIC)
    with pytest.raises(LogClosed):
        log.state.compare_and_set("claim", b"two", b"three")


def test_compare_and_set_loses_no_update_of_concurrent_writers(engine: str,
                                                               storage: Storage) -> None:
    """Threads add one to a counter with read-modify-write loops; on postgres half of them
    through a second storage on the same database (a second broker)."""
    views = [storage]
    if engine == "postgres":
        views.append(open_storage(storage.location))  # the test server trusts: no password
    threads, rounds = 4, 25

    def count(kv: KeyValueStore) -> None:
        for _ in range(rounds):
            while True:
                old = kv.get("counter")
                new = str(int(old or b"0") + 1).encode()
                if kv.compare_and_set("counter", old, new):
                    break

    try:
        with ThreadPoolExecutor(threads) as pool:
            for done in [pool.submit(count, views[i % len(views)].kv) for i in range(threads)]:
                done.result()
    finally:
        for other in views[1:]:
            other.close()
    assert storage.kv.get("counter") == str(threads * rounds).encode()


def test_closed_storage_refuses_changes(storage: Storage) -> None:
    storage.create_topic(TOPIC, 1, {})
    log = partition(storage)
    assert storage.close() == []
    with pytest.raises(LogClosed):
        storage.create_topic("public/default/other", 1, {})
    with pytest.raises(LogClosed):
        append(log, 1)


def test_memory_engine_location_and_disk_figures(tmp_path: Path) -> None:
    memory = open_storage("memory://")
    assert memory.location == "memory://" and memory.names_location("memory://")
    assert memory.disk_usage().total_bytes == -1  # no volume: unknown, as Kafka says
    memory.close()
    with pytest.raises(ValueError, match="nothing after"):
        open_storage("memory://somewhere")
    files = open_storage((tmp_path / "d").as_uri())
    assert files.location == str((tmp_path / "d").resolve())
    assert files.names_location(str(tmp_path / "d")) and not files.names_location("/nope")
    assert files.disk_usage().total_bytes > 0
    files.close()
