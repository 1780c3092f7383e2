"""An idle engine sleeps: with no client, its background work (the periodic fsync and
writeback, taking in other brokers' changes, producer snapshots, the cluster heartbeat)
wakes its event loop a few times a second at most, on the file engine and as a broker on
PostgreSQL. Each wake-up of an idle broker is CPU that every record of a short benchmark
phase pays for; counted here (``tests.wakeups``), not timed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker_core.engine import Engine
from broker_core.engine_config import EngineConfig
from broker_core.storage import LogConfig, open_storage
from broker_core.storage.cluster import BrokerRecord
from tests.postgres_server import shared_server
from tests.wakeups import CountingLoop, run_counting

IDLE_S = 2.0
MOST_PER_S = 6
"""Wake-ups a second an idle engine may cost (about four on PostgreSQL: the heartbeat and
its statement's answer from the cluster's thread, the snapshot check, the change feed's
safety nets; one on files); the periodic fsync round alone used to cost twenty, the
refresh of a file engine eight more."""


@pytest.mark.parametrize("engine", ["file", "postgres"])
def test_an_idle_engine_wakes_its_loop_rarely(tmp_path: Path, engine: str) -> None:
    url = shared_server().new_database_url() if engine == "postgres" else tmp_path.as_uri()

    async def scenario(loop: CountingLoop) -> None:
        broker = Engine(EngineConfig(), open_storage(url, LogConfig()))
        broker.start()
        try:
            await broker.join(BrokerRecord(0, None, ()))
            broker.logs.create_topic("public/default/t", 3, {})
            await asyncio.sleep(2.0)  # the start's own work (the claims) settles
            before = loop.wakeups
            await asyncio.sleep(IDLE_S)
            woken = loop.wakeups - before - 1  # not this test's own sleep
            assert woken <= MOST_PER_S * IDLE_S, woken
        finally:
            await broker.stop()

    run_counting(scenario)
