"""Closed connections leave no cyclic garbage: a connection's objects (listener
connection, session, SASL state, reader, transport, tasks) are freed by reference counting
as it closes, so a login storm leaves nothing for the collector's rarer full collections
(``edge.gc_tuning``). The broker runs in this process, the collector switched off, and
after a batch of SASL logins and failed ones has closed, no connection object is left."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from edge.app import BrokerApp
from edge.config import load_config
from edge.session import Session
from listeners.connection import Connection
from sasl.connection_state import ConnectionSasl
from tests.security.test_login_storm import login_frames
from tests.security_helpers import TokenIssuer

LOGINS = 50


@pytest.fixture
def collector_off() -> Iterator[None]:
    """The cyclic collector off for the test (reference counting alone frees objects), and
    no log records made (pytest keeps them, and a record's arguments may hold an error)."""
    thresholds = gc.get_threshold()
    gc.collect()
    gc.disable()
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)
        gc.enable()
        gc.set_threshold(*thresholds)
        gc.collect()


def _left() -> dict[str, int]:
    """Connection objects the collector still tracks (alive, or garbage in a cycle)."""
    kinds = (Connection, Session, ConnectionSasl)
    found = {kind.__name__: 0 for kind in kinds}
    for obj in gc.get_objects():
        if isinstance(obj, kinds):
            found[type(obj).__name__] += 1
    return found


async def _login(port: int, frames: list[bytes]) -> asyncio.StreamWriter:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for request in frames:
        writer.write(request)
        size = int.from_bytes(await reader.readexactly(4), "big")
        await reader.readexactly(size)
    return writer


async def _storm(app: BrokerApp, port: int, frames: list[list[bytes]]) -> None:
    writers = await asyncio.wait_for(asyncio.gather(*(_login(port, f) for f in frames)), 120)
    for writer in writers:
        writer.close()
    for writer in writers:
        await writer.wait_closed()
    connections = [server._connections for _spec, server in app.servers]
    async with asyncio.timeout(60):  # the broker sees every close
        while any(connections):
            await asyncio.sleep(0.02)
    await asyncio.sleep(0.1)  # the closed connections' last callbacks run


def test_closed_connections_are_freed_without_the_collector(
        tmp_path: Path, collector_off: None) -> None:
    issuer = TokenIssuer("rsa", tmp_path / "keys")
    config = load_config(None, [f"dataDir={tmp_path / 'data'}",
                                "kafkaListeners=SASL_PLAINTEXT://127.0.0.1:0",
                                "failedAuthenticationDelayMs=0",
                                *(f"{key}={value}" for key, value in issuer.settings.items())])
    bad = login_frames("not-a-token")

    async def run() -> dict[str, int]:
        app = BrokerApp(config)
        bound = await app.start()
        gc.disable()  # start-up collected and froze; switched off again
        try:
            frames = [login_frames(issuer.token(f"user-{n}")) for n in range(LOGINS)]
            await _storm(app, bound[0].port, [*frames, bad[:2]])
            # a failed login: its answer, then the broker closes the connection
            reader, writer = await asyncio.open_connection("127.0.0.1", bound[0].port)
            for request in bad:
                writer.write(request)
            while await reader.read(65536):
                pass
            writer.close()
            await _storm(app, bound[0].port, [])
            return _left()
        finally:
            await app.stop()

    assert asyncio.run(run()) == {"Connection": 0, "Session": 0, "ConnectionSasl": 0}
