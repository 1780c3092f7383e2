"""Helpers for the tests of coordinators whose system-topic write fails: an engine driven
directly on a real PostgreSQL database, one commit of a coordinator's partition made to
fail (its row locked by another session, the waiting commit's backend terminated), and a
partition handed over and replayed (as after a move to another broker)."""

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

    async def run() -> None:
        config = EngineConfig(offsets_topic_partitions=offsets_partitions,
                              txn_topic_partitions=1)
        engine = Engine(config, open_storage(url, LogConfig()))
        engine.start()
        try:
            await engine.join(BrokerRecord(0, None, ()))
            engine.logs.create_topic(TOPIC, 3, {})
            await engine.leadership.ready([(TOPIC, p) for p in range(3)])
            await scenario(url, engine)
        finally:
            await engine.stop()

    asyncio.run(run())


async def _until(what: str, check: Callable[[], object]) -> None:
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def served(coordinator: StateCoordinator, topic: str, key: str) -> PgPartition:
    """Wait until ``coordinator`` serves ``key``; the partition of ``topic`` holding it."""
    await _until(f"{key} served", lambda: coordinator.serving_error(topic, key)
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
    await _until("a commit waiting for the row lock", lambda: task.done() or _lock_waits(url))
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
    await _until("the partition replayed", lambda: coordinator.is_loaded(topic, key))
