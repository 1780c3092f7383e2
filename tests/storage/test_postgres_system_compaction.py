"""A system topic's compaction on PostgreSQL (``SystemTopic.compact``) deletes the rows its
snapshot replaces in a worker thread: the event loop, which serves every connection of the
broker, goes on meanwhile. A trigger holds the delete inside the database; the test, on
the loop, sees it held and the replaced rows still there (the old code deleted on the
loop: by the time the loop ran again the rows were gone), then the compaction end."""

from __future__ import annotations

import asyncio
import time

import psycopg

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
