"""The PostgreSQL change feed (``pg_listen``): two storages on one real database, no
broker process. A change another broker acts on wakes the channel that names it; a
heartbeat or an append wakes nobody; a lost listening connection is connected again (one
log line) and wakes every subscriber; closing ends the listener's thread."""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from broker_core.storage import LogConfig, open_storage
from broker_core.storage.cluster import BrokerRecord, MarkerRequest
from broker_core.storage.feed import CHANGES, CHANNELS, MARKERS, REGISTRY
from broker_core.storage.pg_database import LISTENER_NAME
from broker_core.storage.postgres import PgStorage
from tests.batches import make_batch
from tests.postgres_server import shared_server
from tests.storage_helpers import headed
from tests.wakeups import thread_wakeups

TOPIC = "public/default/t"
WAIT_S = 30.0


class Heard:
    """The channels a storage's feed woke, in order."""

    def __init__(self, storage: PgStorage) -> None:
        self.woken: queue.SimpleQueue[str] = queue.SimpleQueue()
        for channel in CHANNELS:
            storage.feed.subscribe(channel, functools.partial(self.woken.put, channel))

    def until(self, channel: str) -> list[str]:
        """Every wake-up up to and including the next one of ``channel``."""
        seen: list[str] = []
        while not seen or seen[-1] != channel:
            seen.append(self.woken.get(timeout=WAIT_S))
        return seen

    def drain(self) -> None:
        while not self.woken.empty():
            self.woken.get()


@pytest.fixture
def url() -> str:
    return shared_server().new_database_url()


@pytest.fixture
def pair(url: str) -> Iterator[tuple[PgStorage, PgStorage]]:
    first = open_storage(url, LogConfig())
    second = open_storage(url, LogConfig())
    assert isinstance(first, PgStorage) and isinstance(second, PgStorage)
    yield first, second
    first.close()
    second.close()


def listeners() -> int:
    """Listener threads alive in this process."""
    return sum(1 for t in threading.enumerate() if t.name == "edge-listener" and t.is_alive())


def listening(storage: PgStorage, heard: Heard) -> None:
    """Until the feed listens (it wakes every channel once when it starts)."""
    for channel in CHANNELS:
        heard.until(channel)
    assert storage.feed.live
    heard.drain()


def test_each_change_wakes_its_channel_and_nothing_else(
        pair: tuple[PgStorage, PgStorage]) -> None:
    first, second = pair
    heard = Heard(first)
    listening(first, heard)
    second.create_topic(TOPIC, 2, {})
    assert heard.until(CHANGES) == [CHANGES]
    second.kv.put("some-key", b"v")
    assert heard.until(CHANGES) == [CHANGES]
    second.cluster.register(BrokerRecord(1, None, ()), 60_000)
    assert heard.until(REGISTRY) == [REGISTRY]
    assert second.cluster.claim([(TOPIC, 0)]) == {(TOPIC, 0): 1}
    assert heard.until(REGISTRY) == [REGISTRY]
    # a heartbeat, a claim that changes no owner and an append notify nobody: the marker
    # request after them is the next thing heard (notifications arrive in commit order)
    assert second.cluster.heartbeat(60_000).renewed
    assert second.cluster.claim([(TOPIC, 0)]) == {(TOPIC, 0): 2}
    found = second.partition(TOPIC, 0)
    assert found is not None and found.append(*headed(make_batch(1))) == 0
    (marker,) = second.cluster.request_markers([MarkerRequest(TOPIC, 1, 7, 0, True)])
    assert heard.until(MARKERS) == [MARKERS]
    second.cluster.markers_done([marker])
    assert heard.until(MARKERS) == [MARKERS]
    second.cluster.deregister()
    assert heard.until(REGISTRY) == [REGISTRY]


def test_the_heartbeat_stamp_moves_with_what_a_reconcile_reads(
        pair: tuple[PgStorage, PgStorage]) -> None:
    first, second = pair
    first.create_topic(TOPIC, 2, {})
    first.cluster.register(BrokerRecord(0, None, ()), 60_000)
    stamp = first.cluster.heartbeat(60_000).stamp
    assert stamp is not None and first.cluster.heartbeat(60_000).stamp == stamp
    stamps: list[str | None] = [stamp]
    second.cluster.register(BrokerRecord(1, None, ()), 60_000)  # a broker joins
    stamps.append(first.cluster.heartbeat(60_000).stamp)
    second.cluster.claim([(TOPIC, 1)])  # an owner changes
    stamps.append(first.cluster.heartbeat(60_000).stamp)
    second.create_topic("public/default/u", 1, {})  # a topic appears
    stamps.append(first.cluster.heartbeat(60_000).stamp)
    second.cluster.deregister()  # a broker leaves
    stamps.append(first.cluster.heartbeat(60_000).stamp)
    assert len(set(stamps)) == len(stamps), stamps


def test_an_idle_listener_sleeps_until_a_change(pair: tuple[PgStorage, PgStorage]) -> None:
    """While nothing changes the listener's thread is never woken (psycopg's own wait for
    notifications woke it ten times a second, in every broker); a change still is heard."""
    first, second = pair
    running = set(threading.enumerate())
    heard = Heard(first)
    listening(first, heard)
    (thread,) = [t for t in threading.enumerate()
                 if t.name == "edge-listener" and t not in running]
    before = thread_wakeups(thread)
    time.sleep(1.0)
    assert thread_wakeups(thread) - before <= 1
    second.create_topic(TOPIC, 1, {})
    assert heard.until(CHANGES) == [CHANGES]


def test_a_lost_listener_connects_again_and_wakes_everyone(
        url: str, pair: tuple[PgStorage, PgStorage], caplog: pytest.LogCaptureFixture) -> None:
    first, second = pair
    heard = Heard(first)
    listening(first, heard)
    with caplog.at_level(logging.INFO, logger="broker_core.storage.pg_listen"):
        with psycopg.connect(url, autocommit=True) as admin:
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = %s AND datname = current_database()",
                (LISTENER_NAME,)).fetchone()
        assert killed is not None and killed[0] == 1
        heard.until(CHANGES)  # woken as it is lost (the storage polls meanwhile) ...
        heard.until(CHANGES)  # ... and once it listens again (after its log line)
        second.create_topic(TOPIC, 1, {})
        heard.until(CHANGES)  # notifications flow again
        lines = [r.getMessage() for r in caplog.records if "listening again" in r.getMessage()]
    assert len(lines) == 1, lines
    assert first.feed.live


def test_closing_ends_the_listener(pair: tuple[PgStorage, PgStorage]) -> None:
    first, _ = pair
    heard = Heard(first)
    listening(first, heard)
    running = listeners()
    assert running >= 1
    first.close()
    assert not first.feed.live
    assert listeners() == running - 1
