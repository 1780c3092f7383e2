"""A system topic's compaction on PostgreSQL (``SystemTopic.compact``) deletes the rows its
snapshot replaces in a worker thread: the event loop, which serves every connection of the
broker, goes on meanwhile. A trigger holds the delete inside the database; the test, on
the loop, sees it held and the replaced rows still there (the old code deleted on the
loop: by the time the loop ran again the rows were gone), then the compaction end."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from broker_core.appends import AppendPath
from broker_core.durability import FlushScheduler
from broker_core.storage import LogConfig, open_storage
from broker_core.system_topics import SystemTopic
from tests.postgres_server import shared_server

TOPIC = "public/__kafka/__consumer_offsets"


def _held_delete(conn: psycopg.Connection[tuple[object, ...]]) -> bool:
    """Whether a DELETE of entry rows is held by the trigger now."""
    return conn.execute(
        "SELECT 1 FROM pg_stat_activity WHERE wait_event = 'PgSleep'"
        " AND datname = current_database() AND query ILIKE '%DELETE FROM edge_entries%'"
    ).fetchone() is not None


def _rows(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    row = conn.execute("SELECT count(*) FROM edge_entries").fetchone()
    assert row is not None
    return int(str(row[0]))


def test_a_compaction_deletes_its_rows_off_the_event_loop() -> None:
    url = shared_server().new_database_url()
    logs = open_storage(url, LogConfig())

    async def scenario(conn: psycopg.Connection[tuple[object, ...]]) -> None:
        store = SystemTopic(logs, AppendPath(FlushScheduler(2**63 - 1, 0)),
                            "__consumer_offsets", 1, 1 << 20, 1)
        store.ensure(TOPIC)
        for value in range(5):  # five rows, each a record of key k
            await store.settle(store.append(TOPIC, 0, [(b"k", str(value).encode())]))
        assert _rows(conn) == 5
        conn.execute("CREATE FUNCTION held() RETURNS trigger LANGUAGE plpgsql AS $$"
                     " BEGIN PERFORM pg_sleep(3); RETURN NULL; END $$")
        conn.execute("CREATE TRIGGER held BEFORE DELETE ON edge_entries"
                     " FOR EACH STATEMENT EXECUTE FUNCTION held()")
        store.compact(TOPIC, 0, [(b"k", b"4")])  # the live state: one row more
        deadline = time.monotonic() + 30
        while not await asyncio.to_thread(_held_delete, conn):
            assert time.monotonic() < deadline, "no held delete seen from the event loop"
            await asyncio.sleep(0.01)
        # the loop runs while the delete is held: the replaced rows are still there
        assert await asyncio.to_thread(_rows, conn) == 6
        log = logs.partition(TOPIC, 0)
        assert log is not None
        while await asyncio.to_thread(_rows, conn) != 1:
            assert time.monotonic() < deadline, "the compaction's delete never ended"
            await asyncio.sleep(0.05)
        assert log.log_start_offset == 5 and log.next_offset == 6
        assert list(store.read(TOPIC, 0)) == [(b"k", b"4")]

    try:
        with psycopg.connect(url, autocommit=True) as conn:
            asyncio.run(scenario(conn))
    finally:
        logs.close()


def test_a_replay_waits_for_a_compactions_drop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay of the partition (``reread`` then ``read``, as a coordinator's load) that
    starts while a compaction's drop is still in its worker thread: the drop would move
    the log start past the replay's position, and the replay end early without a word,
    its state missing the snapshot (the old code: 64 keys of 200). ``reread`` waits for the
    drop first."""
    url = shared_server().new_database_url()
    logs = open_storage(url, LogConfig())

    async def scenario() -> set[bytes]:
        store = SystemTopic(logs, AppendPath(FlushScheduler(2**63 - 1, 0)),
                            "__consumer_offsets", 1, 1 << 20, 1)
        store.ensure(TOPIC)
        live = [(b"k%d" % i, b"v%d" % i) for i in range(200)]
        for record in live:
            await store.settle(store.append(TOPIC, 0, [record]))
        target = logs.partition(TOPIC, 0)
        assert target is not None
        flush = target.flush

        def late_flush() -> bool:  # the drop's thread is slow to get going
            time.sleep(0.5)
            return flush()

        monkeypatch.setattr(target, "flush", late_flush)
        store.compact(TOPIC, 0, live)  # the snapshot; its drop goes to a thread
        await asyncio.sleep(0.05)
        await store.reread(TOPIC, 0)
        keys = set()
        for count, (key, _) in enumerate(store.read(TOPIC, 0)):
            keys.add(key)
            if count == 0:
                await asyncio.sleep(1.0)  # a slow replay: the drop ends meanwhile
        return keys

    try:
        assert len(asyncio.run(scenario())) == 200
    finally:
        logs.close()
