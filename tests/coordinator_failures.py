"""Helpers for the tests of coordinators whose system-topic write fails: an engine driven
directly on a real PostgreSQL database (or through a proxy that can lose its answers:
``tests/pg_proxy.py``), one commit of a coordinator's partition made to fail (its row
locked by another session, the waiting commit's backend terminated), or made to happen
with its answer lost, and a partition handed over and replayed (as after a move to another
broker)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg

from broker_core.engine import Engine
from broker_core.engine_config import EngineConfig
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.storage import LogConfig, open_storage
from broker_core.storage.cluster import BrokerRecord
from broker_core.storage.pg_partition import PgPartition
from broker_core.system_topics import StateCoordinator
from tests.pg_proxy import PgProxy
from tests.postgres_server import shared_server
from tests.storage.test_postgres_speed import _lock_waits

TOPIC = "public/default/t"
"""A data topic of three partitions."""
STATE_TOPIC = "public/__kafka/__transaction_state"
OFFSETS_TOPIC = "public/__kafka/__consumer_offsets"
_T = TypeVar("_T")


def run_engine(scenario: Callable[[str, Engine], Awaitable[None]],
               offsets_partitions: int = 1) -> None:
    """Run ``scenario(url, engine)``: an engine on a database of its own, coordinator topics
    of one partition each (``__consumer_offsets`` of ``offsets_partitions``), and
    ``TOPIC``."""
    url = shared_server().new_database_url()
    asyncio.run(_with_engine(url, lambda engine: scenario(url, engine), offsets_partitions))


def run_proxied(scenario: Callable[[str, PgProxy, Engine], Awaitable[None]]) -> None:
    """Run ``scenario(url, proxy, engine)``: as :func:`run_engine`, the engine reaching its
    database (``url``) through ``proxy``."""
    url = shared_server().new_database_url()
    with PgProxy(url) as proxy:
        asyncio.run(_with_engine(proxy.url, lambda engine: scenario(url, proxy, engine)))


async def _with_engine(url: str, scenario: Callable[[Engine], Awaitable[None]],
                       offsets_partitions: int = 1) -> None:
    config = EngineConfig(offsets_topic_partitions=offsets_partitions, txn_topic_partitions=1)
    engine = Engine(config, open_storage(url, LogConfig()))
    engine.start()
    try:
        await engine.join(BrokerRecord(0, None, ()))
        engine.logs.create_topic(TOPIC, 3, {})
        await engine.leadership.ready([(TOPIC, p) for p in range(3)])
        await scenario(engine)
    finally:
        await engine.stop()


async def until(what: str, check: Callable[[], object]) -> None:
    """Wait until ``check()`` holds (30 s at most)."""
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def served(coordinator: StateCoordinator, topic: str, key: str) -> PgPartition:
    """Wait until ``coordinator`` serves ``key``; the partition of ``topic`` holding it."""
    await until(f"{key} served", lambda: coordinator.serving_error(topic, key)
                 == ErrorCode.NONE)
    found = coordinator.store.logs.partition(topic, coordinator.place(topic, key))
    assert isinstance(found, PgPartition)
    return found


@contextmanager
def row_locked(url: str, partition: PgPartition) -> Iterator[psycopg.Connection[Any]]:
    """A session holding ``partition``'s row locked (its commits wait) until it rolls back
    or the block ends."""
    with psycopg.connect(url) as locker:
        locker.execute("SELECT 1 FROM edge_partitions WHERE id = %s FOR UPDATE",
                       (partition.partition_id,))
        yield locker


async def commit_waits(url: str, task: asyncio.Future[_T]) -> None:
    """Wait until ``task``'s commit waits for a row lock (it is not answered before)."""
    await until("a commit waiting for the row lock", lambda: task.done() or _lock_waits(url))
    assert not task.done(), task.result()


def terminate_waiting(url: str) -> None:
    """Make the commits waiting for a row lock fail (their backends terminated)."""
    with psycopg.connect(url, autocommit=True) as killer:
        for pid, _ in _lock_waits(url):
            killer.execute("SELECT pg_terminate_backend(%s)", (pid,))


async def fails(url: str, partition: PgPartition, action: Awaitable[_T],
                meanwhile: Callable[[], Awaitable[None]] | None = None) -> KafkaApiError:
    """Run ``action`` while ``partition``'s commits wait for a row lock; once its commit
    waits, run ``meanwhile`` (other requests while the write is under way), then make that
    commit fail (its backend terminated); the error ``action`` raised."""
    with row_locked(url, partition) as locker:
        task = asyncio.ensure_future(action)
        await commit_waits(url, task)
        if meanwhile is not None:
            await meanwhile()
        terminate_waiting(url)
        try:
            await asyncio.wait_for(task, 30)
        except KafkaApiError as error:
            failure = error
        else:
            raise AssertionError("the write whose commit failed was answered as done")
        locker.rollback()
    return failure


async def moved(coordinator: StateCoordinator, topic: str, key: str) -> None:
    """Hand the partition holding ``key`` over and take it back: its state in memory is
    what its log replays, as at the next coordinator after a move."""
    partition = coordinator.place(topic, key)
    coordinator.unload_partition(topic, partition)
    coordinator.load_partition(topic, partition)
    await until("the partition replayed", lambda: coordinator.is_loaded(topic, key))


def stored_end(url: str, topic: str) -> int:
    """The committed ends of ``topic``'s partitions, summed, as the database holds them (on
    a connection of the test's own)."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT coalesce(sum(next_offset), 0) FROM edge_partitions"
                           " WHERE topic = %s", (topic,)).fetchone()
    assert row is not None
    return int(row[0])


async def answer_lost(url: str, proxy: PgProxy, topic: str, action: Awaitable[_T],
                      meanwhile: Callable[[], Awaitable[None]] | None = None
                      ) -> _T | KafkaApiError:
    """Run ``action``, whose write to ``topic`` is committed but whose answer is lost: the
    proxy holds the database's answers until the commit is stored, then cuts the
    connections holding them. ``meanwhile`` runs once ``action`` is answered, the answers
    still held (nothing read from the database can change the broker's state), before
    they flow again. What ``action`` returned or raised."""
    before = stored_end(url, topic)
    proxy.hold()
    try:
        task = asyncio.ensure_future(action)
        await until("the commit stored", lambda: stored_end(url, topic) != before)
        cut = 0  # its answer lost: cut once it reaches the proxy (a moment later)
        deadline = time.monotonic() + 30
        while not task.done() and time.monotonic() < deadline:
            cut += proxy.cut()
            await asyncio.sleep(0.01)
        assert cut > 0
        outcome: _T | KafkaApiError
        try:
            outcome = await asyncio.wait_for(task, 30)
        except KafkaApiError as error:
            outcome = error
        if meanwhile is not None:
            await meanwhile()
        proxy.cut()  # whatever was sent meanwhile: it fails, and is tried again
    finally:
        proxy.release()
    return outcome
