"""What makes the ``postgres://`` engine fast, and stays correct: group commit
(``broker_core/storage/pg_commits.py``): concurrent appends of many producers and
partitions share transactions, offsets stay continuous with nothing lost or twice, and a
commit that fails (the server stopped, the partition fenced by another owner's claim)
fails its appends with retriable errors and loses nothing acknowledged; read-ahead
(``pg_readahead.py``): a read that leaves more of the log behind it has the next page read
in a worker, and the next read of that page is answered from memory, with the same
batches a fresh read gives. On a real PostgreSQL server (``tests/postgres_server.py``)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import confluent_kafka
import psycopg
import pytest
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from broker_core.storage import DatabaseUnavailable, LogConfig, Storage, open_storage, pg_commits
from broker_core.storage.cluster import NotOwner
from broker_core.storage.errors import AppendFenced
from broker_core.storage.pg_commits import LANES
from broker_core.storage.pg_entries import MAX_ENTRIES
from broker_core.storage.pg_partition import PgPartition
from broker_core.storage.pg_readahead import WINDOW_PAGES
from tests.batches import make_batch
from tests.broker_process import BrokerProcess
from tests.clients import create_topic
from tests.postgres_server import PostgresServer, shared_server
from tests.raw import RawConnection
from tests.storage.test_storage_engines import TOPIC, append, partition
from tests.storage_helpers import batch_bytes, check_log, delivered_at, headed

PARTITIONS = 4
PRODUCERS = 6


def _values(producer: int, count: int) -> list[bytes]:
    return [f"p{producer}-{i}-".encode() * (1 + i % 5) for i in range(count)]


class Load:
    """``PRODUCERS`` idempotent confluent-kafka producers, each in its own thread, sending
    ``count`` records round-robin over the partitions; what each delivery report said."""

    def __init__(self, bootstrap: str, topic: str, count: int, timeout_ms: int = 60_000):
        self.topic = topic
        self.count = count
        self.delivered: dict[bytes, tuple[int, int]] = {}  # value -> (partition, offset)
        self.errors: list[str] = []
        self.failed_attempts = 0  # retriable errors seen by the clients on the way
        self.half = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(bootstrap, n, timeout_ms))
                         for n in range(PRODUCERS)]

    def _run(self, bootstrap: str, n: int, timeout_ms: int) -> None:
        producer = confluent_kafka.Producer({
            "bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
            "linger.ms": 1, "message.timeout.ms": timeout_ms, "retry.backoff.ms": 50})

        def report(err: confluent_kafka.KafkaError | None,
                   msg: confluent_kafka.Message) -> None:
            with self._lock:
                if err is not None:
                    self.errors.append(str(err))
                else:
                    self.delivered[msg.value() or b""] = delivered_at(msg)
                    if len(self.delivered) >= PRODUCERS * self.count // 2:
                        self.half.set()

        for i, value in enumerate(_values(n, self.count)):
            producer.produce(self.topic, value=value, partition=(i + n) % PARTITIONS,
                             on_delivery=report)
            producer.poll(0)
        assert producer.flush(timeout_ms / 1000 + 30) == 0

    def start(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def join(self) -> None:
        for thread in self._threads:
            thread.join()

    def all_values(self) -> set[bytes]:
        return {v for n in range(PRODUCERS) for v in _values(n, self.count)}


def transactions(url: str) -> tuple[int, int, int]:
    """(entry rows, transactions that inserted them, most partitions in one of those)."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT sum(n), count(*), max(parts) FROM (SELECT count(*) AS n,"
            " count(DISTINCT partition_id) AS parts FROM edge_entries GROUP BY xmin::text)"
            " AS e").fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def test_concurrent_producers_share_commits_and_get_continuous_offsets(
        tmp_path: Path, topic_name: str) -> None:
    url = shared_server().new_database_url()
    broker = BrokerProcess(tmp_path / "data", {"storageUrl": url}).start()
    try:
        create_topic(broker.bootstrap, topic_name, PARTITIONS)
        load = Load(broker.bootstrap, topic_name, 1500).start()
        load.join()
        assert load.errors == []
        assert len(load.delivered) == PRODUCERS * 1500
        check_log(broker.bootstrap, load.topic, load.delivered, PRODUCERS * 1500, PARTITIONS)
        rows, commits, widest = transactions(url)
        assert commits < rows  # batches that waited together were committed together
        assert widest > 1  # ... across partitions
        assert broker.stop() == 0
    finally:
        if broker.alive():
            broker.kill()


def _lock_waits(url: str, like: str = "%") -> list[tuple[int, object]]:
    """(backend pid, statement start) of the sessions of ``url``'s database that wait
    for a lock, running a statement ``like`` that."""
    with psycopg.connect(url) as conn:
        return [(int(pid), started) for pid, started in conn.execute(
            "SELECT pid, query_start FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND query LIKE %s", (like,)).fetchall()]


def _blocked_on_a_lock(url: str) -> bool:
    return bool(_lock_waits(url))


def _held_up(url: str, locker: psycopg.Connection[tuple[object, ...]], held: PgPartition,
             count: int, pool: ThreadPoolExecutor) -> Future[int]:
    """Lock ``held``'s partition row through ``locker``, append ``count`` records to it in
    ``pool`` and return once its lane's commit waits for that lock (until ``locker`` rolls
    back or closes): the append's future."""
    locker.execute("SELECT 1 FROM edge_partitions WHERE id = %s FOR UPDATE",
                   (held.partition_id,))
    waiting = pool.submit(append, held, count)
    while not _blocked_on_a_lock(url):
        assert not waiting.done(), waiting.exception()
        time.sleep(0.01)
    return waiting


def test_a_marker_poll_waiting_for_the_database_holds_up_no_request(tmp_path: Path) -> None:
    """The marker relay asks the database for queued transaction markers 20 times a
    second; it does so from a worker thread, so while that statement waits (here for a
    lock another session holds on the table) the broker answers requests meanwhile."""
    url = shared_server().new_database_url()
    broker = BrokerProcess(tmp_path / "data", {"storageUrl": url}).start()
    conn = RawConnection(broker.port)
    try:
        with psycopg.connect(url) as locker:
            locker.execute("LOCK TABLE edge_marker_requests IN ACCESS EXCLUSIVE MODE")
            polls: list[tuple[int, object]] = []
            while not polls:  # the relay's poll waits for the lock
                polls = _lock_waits(url, "%FROM edge_marker_requests%")
                time.sleep(0.01)
            versions = conn.call(ApiVersionsRequest[0](), 0, ApiVersionsResponse)
            assert versions.error_code == 0
            # answered while that very statement still waited, not after it gave up
            assert set(polls) <= set(_lock_waits(url, "%FROM edge_marker_requests%"))
        assert broker.stop() == 0
    finally:
        conn.close()
        if broker.alive():
            broker.kill()


def test_a_commit_held_up_in_one_lane_holds_up_no_other_lane() -> None:
    """The group commit's lanes commit side by side: while the commit of one partition
    waits (here for a row lock another session holds), a lone append to a partition of
    another lane waits for it no longer than ``GATHER_S``, then is committed; the first is
    committed once the lock goes."""
    url = shared_server().new_database_url()
    storage = open_storage(url)
    try:
        storage.create_topic(TOPIC, 2, {})
        held, free = partition(storage, index=0), partition(storage, index=1)
        assert isinstance(held, PgPartition) and isinstance(free, PgPartition)
        assert held.partition_id % LANES != free.partition_id % LANES
        with ThreadPoolExecutor(1) as pool:
            with psycopg.connect(url) as locker:
                waiting = _held_up(url, locker, held, 2, pool)
                assert append(free, 3) == 0  # committed meanwhile
                assert not waiting.done()
            assert waiting.result() == 0  # the lock is gone: committed
        assert (held.next_offset, free.next_offset) == (2, 3)
    finally:
        storage.close()


async def _deferred(log: PgPartition, count: int) -> int:
    """Append from an event loop (as the produce path does); the base offset once committed."""
    base, commit = log.append_deferred(*headed(make_batch(count)))
    await commit
    return base


@pytest.mark.parametrize("lanes", [1, 2], ids=["one lane", "two lanes"])
def test_a_group_stores_the_partitions_that_moved_and_nothing_of_one_fenced(
        lanes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """One group commit carries the appends of two partitions queued behind a held-up
    commit, one of which another broker took (its epoch moved on) meanwhile: the one still
    owned is committed, the other's append fails as AppendFenced, and none of its rows is
    stored. Both in the held commit's lane, or one in each lane (a commit shared by lanes,
    which a backlog of two appends does not split)."""
    url = shared_server().new_database_url()
    storage = open_storage(url)
    try:
        if lanes == 1:
            held, kept, taken = _lanes(storage, 3)[0]
        else:
            monkeypatch.setattr(pg_commits, "GATHER_S", 600.0)
            (held, taken), (kept, *_) = _lanes(storage, 2)
        for log in (held, kept, taken):
            log.fence(0)  # owned here at the epoch the rows hold
        with ThreadPoolExecutor(3) as pool, psycopg.connect(url) as locker:
            first = _held_up(url, locker, held, 1, pool)
            results = [pool.submit(asyncio.run, _deferred(log, count))
                       for log, count in ((kept, 2), (taken, 3))]
            while kept._inflight + taken._inflight < 2:  # both queued behind it
                time.sleep(0.01)
            with psycopg.connect(url, autocommit=True) as other:
                other.execute("UPDATE edge_partitions SET owner_epoch = owner_epoch + 1"
                              " WHERE id = %s", (taken.partition_id,))
            locker.rollback()  # the lane goes on: the two are committed together
            assert first.result(60) == 0
            assert results[0].result(60) == 0
            with pytest.raises(AppendFenced):
                results[1].result(60)
        with psycopg.connect(url) as conn:
            rows = conn.execute("SELECT partition_id, base_offset, last_offset FROM"
                                " edge_entries ORDER BY partition_id").fetchall()
            ends = dict(conn.execute("SELECT id, next_offset FROM edge_partitions"
                                     " WHERE id = ANY(%s)",
                                     ([kept.partition_id, taken.partition_id],)).fetchall())
        assert sorted(rows) == sorted([(held.partition_id, 0, 0), (kept.partition_id, 0, 1)])
        assert ends == {kept.partition_id: 2, taken.partition_id: 0}
        assert (kept.next_offset, taken.next_offset) == (2, 0)
    finally:
        storage.close()


def test_more_appends_than_one_statement_holds_are_committed_in_order() -> None:
    """Appends queued behind a held-up commit, more than one statement can carry (each
    entry row is seven parameters; PostgreSQL takes 65,535 in a statement): the lane
    commits them in groups of at most ``MAX_ENTRIES``, every one stored at its offset."""
    url = shared_server().new_database_url()
    storage = open_storage(url)
    count = 65_535 // 7 + 100
    try:
        storage.create_topic(TOPIC, 2 * LANES, {})
        logs = [partition(storage, index=n) for n in range(2 * LANES)]
        lane = [log for log in logs if isinstance(log, PgPartition)
                and log.partition_id % LANES == logs[0].partition_id % LANES]
        held, busy = lane[:2]

        async def append_many() -> list[int]:
            queued = [busy.append_deferred(*headed(make_batch(1))) for _ in range(count)]
            await asyncio.gather(*(commit for _, commit in queued))
            return [base for base, _ in queued]

        with ThreadPoolExecutor(2) as pool, psycopg.connect(url) as locker:
            first = _held_up(url, locker, held, 1, pool)
            many = pool.submit(asyncio.run, append_many())
            while busy._inflight < count:  # all queued behind it
                assert not many.done(), many.exception()
                time.sleep(0.01)
            locker.rollback()
            assert first.result(60) == 0
            assert many.result(120) == list(range(count))
        rows, commits, _ = transactions(url)
        assert rows == count + 1 and commits >= 1 + count // MAX_ENTRIES
        assert busy.next_offset == count
    finally:
        storage.close()


def _lanes(storage: Storage, per_lane: int) -> list[list[PgPartition]]:
    """``per_lane`` partitions of a new topic in each lane of the group commit."""
    storage.create_topic(TOPIC, per_lane * LANES, {})
    logs = [partition(storage, index=n) for n in range(per_lane * LANES)]
    assert all(isinstance(log, PgPartition) for log in logs)
    lanes: list[list[PgPartition]] = [[] for _ in range(LANES)]
    for log in logs:
        assert isinstance(log, PgPartition)
        lanes[log.partition_id % LANES].append(log)
    return lanes


def _commits(url: str) -> dict[int, str]:
    """The transaction (``xmin``) that stored each partition's entries, by partition id."""
    with psycopg.connect(url) as conn:
        return {int(pid): str(xmin) for pid, xmin in conn.execute(
            "SELECT DISTINCT partition_id, xmin::text FROM edge_entries").fetchall()}


def test_appends_of_two_lanes_waiting_for_one_commit_share_the_next(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Few appends waiting while a commit is under way (fewer than ``OPEN_APPENDS``) wait
    for it, whatever their lane, and the next commit carries all of them: one commit for
    a partition of each lane, not one a lane. (``GATHER_S`` is raised so that the commit
    held up on a lock here is not outwaited.)"""
    monkeypatch.setattr(pg_commits, "GATHER_S", 600.0)
    url = shared_server().new_database_url()
    storage = open_storage(url)
    try:
        (held, own), (other, *_) = _lanes(storage, 2)
        with ThreadPoolExecutor(3) as pool, psycopg.connect(url) as locker:
            first = _held_up(url, locker, held, 1, pool)
            waiting = [pool.submit(asyncio.run, _deferred(log, count))
                       for log, count in ((own, 2), (other, 3))]
            while own._inflight + other._inflight < 2:  # both queued behind it
                assert not any(w.done() for w in waiting)
                time.sleep(0.01)
            locker.rollback()
            assert first.result(60) == 0
            assert [w.result(60) for w in waiting] == [0, 0]
        commits = _commits(url)
        assert commits[own.partition_id] == commits[other.partition_id]
        assert commits[held.partition_id] != commits[own.partition_id]
        assert (own.next_offset, other.next_offset) == (2, 3)
    finally:
        storage.close()


@pytest.mark.parametrize("appends, size", [
    (pg_commits.OPEN_APPENDS, 50),  # many small batches
    (2, pg_commits.OPEN_BYTES // 2 + 1000),  # few large ones
])
def test_a_backlog_opens_a_lane_beside_a_commit_under_way(
        monkeypatch: pytest.MonkeyPatch, appends: int, size: int) -> None:
    """``OPEN_APPENDS`` appends, or ``OPEN_BYTES``, waiting in one lane are committed
    while another lane's commit is still under way (here held up on a lock): under load
    the lanes commit side by side."""
    monkeypatch.setattr(pg_commits, "GATHER_S", 600.0)
    url = shared_server().new_database_url()
    storage = open_storage(url)
    try:
        (held, *_), (busy, *_) = _lanes(storage, 1)

        async def backlog() -> list[int]:
            queued = [busy.append_deferred(*headed(make_batch(1, size=size)))
                      for _ in range(appends)]
            await asyncio.gather(*(commit for _, commit in queued))
            return [base for base, _ in queued]

        with ThreadPoolExecutor(2) as pool, psycopg.connect(url) as locker:
            first = _held_up(url, locker, held, 1, pool)
            many = pool.submit(asyncio.run, backlog())
            assert many.result(120) == list(range(appends))
            assert not first.done()  # still waiting for the lock
            locker.rollback()
            assert first.result(60) == 0
    finally:
        storage.close()


def test_a_server_stopped_under_load_fails_commits_retriably_and_loses_nothing(
        own_server: PostgresServer, tmp_path: Path, topic_name: str) -> None:
    broker = BrokerProcess(tmp_path / "data",
                           {"storageUrl": own_server.new_database_url()}).start()
    try:
        create_topic(broker.bootstrap, topic_name, PARTITIONS)
        mark = len(broker.lines)
        load = Load(broker.bootstrap, topic_name, 3000, timeout_ms=180_000).start()
        assert load.half.wait(120)
        own_server.stop()  # commits in flight fail; the producers retry
        # a commit meets the stopped database, or (once the lease ran out) the broker
        # gives up its partitions until it can claim them again: either is said
        broker.wait_for_log(r"storage: cannot write .*PostgreSQL|registry unreachable", 60,
                            mark)
        own_server.start()
        load.join()
        assert load.errors == []
        assert len(load.delivered) == PRODUCERS * 3000
        check_log(broker.bootstrap, load.topic, load.delivered, PRODUCERS * 3000, PARTITIONS)
        assert broker.stop() == 0
    finally:
        if broker.alive():
            broker.kill()


@pytest.fixture
def storage() -> Iterator[Storage]:
    opened = open_storage(shared_server().new_database_url(), LogConfig())
    opened.create_topic(TOPIC, 1, {})
    yield opened
    opened.close()


def test_a_partition_claimed_away_fails_its_queued_appends_and_keeps_what_committed(
        storage: Storage) -> None:
    log = partition(storage)
    url = storage.location
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT id, owner_epoch FROM edge_partitions").fetchone()
        assert row is not None
        pid, epoch = int(row[0]), int(row[1])
        assert isinstance(log, PgPartition)
        log.fence(epoch)  # as the cluster does: this broker owns the partition at ``epoch``
        stored: dict[int, int] = {}  # base offset -> writer
        refused: list[BaseException] = []
        claimed = threading.Event()
        lock = threading.Lock()

        def write(writer: int) -> None:
            for _ in range(200):
                try:
                    base = log.append(*headed(make_batch(2, size=writer + 1)))
                except (DatabaseUnavailable, NotOwner) as exc:
                    with lock:
                        refused.append(exc)
                    continue
                with lock:
                    stored[base] = writer
                    if len(stored) == 300:
                        # another broker claims the partition: the epoch moves on
                        conn.execute("UPDATE edge_partitions SET owner_epoch = owner_epoch"
                                     " + 1 WHERE id = %s", (pid,))
                        claimed.set()

        writers = [threading.Thread(target=write, args=(n,)) for n in range(4)]
        for thread in writers:
            thread.start()
        for thread in writers:
            thread.join()
        assert claimed.is_set() and refused
        assert all(isinstance(exc, DatabaseUnavailable | NotOwner) for exc in refused)
        assert any(isinstance(exc, NotOwner) for exc in refused)  # found out, then refused
        rows = conn.execute("SELECT base_offset, batch FROM edge_entries ORDER BY base_offset"
                            ).fetchall()
        next_offset = conn.execute("SELECT next_offset FROM edge_partitions WHERE id = %s",
                                   (pid,)).fetchone()
    # what was acknowledged is there, at its offset, by its writer; nothing else is
    assert {int(base): bytes(b)[8:] for base, b in rows} == {
        base: bytes(make_batch(2, size=writer + 1))[8:] for base, writer in stored.items()}
    assert [int(base) for base, _ in rows] == list(range(0, 2 * len(rows), 2))
    assert next_offset is not None and int(next_offset[0]) == 2 * len(rows)


def bases(chunks: list[memoryview]) -> list[int]:
    return [int.from_bytes(batch_bytes(c)[:8], "big") for c in chunks]


def wait_for_window(log: PgPartition) -> None:
    """Until the window being read ahead is in memory (the worker's future is done)."""
    window = log._ahead._window  # the read a partition's buffer has under way
    assert window is not None, "nothing is read ahead"
    window.future.result(30)


def test_the_pages_after_a_read_are_read_ahead_and_served_from_memory(
        storage: Storage) -> None:
    log = partition(storage)
    assert isinstance(log, PgPartition)
    offsets = [append(log, 10, size=100) for _ in range(12)]
    page = len(bytes(log.read(0, 1 << 20)[0]))  # one batch's size: a page per batch
    assert bases(log.read(0, page)) == offsets[:1]
    wait_for_window(log)
    ahead = offsets[1:1 + WINDOW_PAGES]
    with psycopg.connect(storage.location, autocommit=True) as conn:
        # the stored rows go away behind the broker's back: only pages already in memory
        # can still answer (nothing the broker does deletes rows above the log start)
        conn.execute("DELETE FROM edge_entries WHERE base_offset = ANY(%s)", (ahead,))
    assert [bases(log.read(offset, page)) for offset in ahead] == [[o] for o in ahead]
    rest = offsets[1 + WINDOW_PAGES:]  # read ahead in turn, or afresh: the same batches
    assert [bases(log.read(offset, page)) for offset in rest] == [[o] for o in rest]


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


def test_a_retry_is_acknowledged_only_once_the_batch_it_repeats_is_committed() -> None:
    """An idempotent producer's retry that arrives while its original batch waits for its
    group commit is answered after that commit, never before (a failed commit would have
    made the early answer false)."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    from broker_core.engine import Engine
    from broker_core.engine_config import EngineConfig
    from broker_core.storage.cluster import BrokerRecord

    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=7, producer_epoch=0, base_sequence=0,
                                        batch_size=1 << 20)
    builder.append(0, timestamp=1_000, key=b"k", value=b"v", headers=[])
    batch = bytes(builder.build())

    async def scenario() -> None:
        engine = Engine(EngineConfig(), open_storage(shared_server().new_database_url(),
                                                     LogConfig()))
        engine.start()
        await engine.join(BrokerRecord(0, None, ()))
        engine.logs.create_topic(TOPIC, 1, {})
        await engine.leadership.ready([(TOPIC, 0)])  # as a produce request does
        first = engine.append(engine.admit(TOPIC, 0, batch, -1))
        retry = engine.append(engine.admit(TOPIC, 0, batch, -1))  # before the first one's commit
        assert retry.base_offset == first.base_offset == 0
        assert first.durable is not None and retry.durable is not None
        assert not retry.durable.done()
        await asyncio.gather(first.durable, retry.durable)
        assert engine.partition(TOPIC, 0).next_offset == 1  # stored once
        await engine.stop()

    asyncio.run(scenario())
