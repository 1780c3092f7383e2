"""Connections take turns: one client pipelining requests without waiting for its answers
is not served for its whole buffered backlog while another connection's request waits
(``listeners.connection.TURN_SECONDS``; Kafka mutes a channel while its request is
handled, so each connection gets one request per poll). Shown by the order the handler
serves requests in, on uvloop as the broker runs, with a handler of the test's own."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import uvloop

from listeners.server import (
    Answer,
    ConnectionHandler,
    ConnectionInfo,
    Limits,
    ListenerServer,
    Request,
)
from tests.listener_helpers import SIZE, StubHandler, frames

BACKLOG = 3000
"""Requests the pipelining client has buffered in the broker when its turn begins."""


class _Handler(StubHandler):
    """A frame ``NAME:hold`` waits in its dispatch stage for the test's event; every frame
    is noted in the served order and echoed."""

    def __init__(self, log: list[str], served: list[str], release: asyncio.Event) -> None:
        super().__init__(log)
        self.served = served
        self.release = release

    def prepare(self, frame: memoryview) -> Request:
        text = bytes(frame).decode()
        response = SIZE.pack(len(text)) + text.encode()

        async def answer() -> Answer:
            if text.endswith(":hold"):
                await self.release.wait()
            self.served.append(text)
            return response

        return Request(len(response), answer)


async def _drain(reader: asyncio.StreamReader, count: int) -> None:
    for _ in range(count):
        (size,) = SIZE.unpack(await reader.readexactly(4))
        await reader.readexactly(size)


def test_a_pipelining_client_does_not_hold_the_loop_for_its_whole_backlog() -> None:
    async def test() -> None:
        served: list[str] = []
        release = asyncio.Event()

        def factory(_info: ConnectionInfo) -> ConnectionHandler:
            return _Handler([], served, release)

        server = ListenerServer("TEST", "127.0.0.1", 0, factory, Limits(idle_timeout_ms=60_000))
        port = await server.start()
        try:
            # A pipelines a held request and its backlog behind it; then B a held request
            # and one behind it: both held ones wait for the same event, A's first
            a_reader, a_writer = await asyncio.open_connection("127.0.0.1", port)
            a_writer.write(frames("A:hold", *(f"A:{i}" for i in range(BACKLOG))))
            await _until(lambda: len(server._connections) == 1
                         and next(iter(server._connections)).reader.buffered > 0)
            a = next(iter(server._connections))
            b_reader, b_writer = await asyncio.open_connection("127.0.0.1", port)
            b_writer.write(frames("B:hold", "B:1"))
            await _until(lambda: len(server._connections) == 2)
            b = next(c for c in server._connections if c is not a)
            backlog = len(frames(*(f"A:{i}" for i in range(BACKLOG))))
            await _until(lambda: a.reader.buffered == backlog and b.reader.buffered > 0)
            release.set()  # A's dispatch stage resumes first, then B's
            drains = [asyncio.create_task(_drain(a_reader, BACKLOG + 1)),
                      asyncio.create_task(_drain(b_reader, 2))]
            await asyncio.gather(*drains)
            before_b = served.index("B:1")
            a_before_b = sum(1 for text in served[:before_b] if text.startswith("A:"))
            # before: B's requests waited for all of A's backlog (BACKLOG + 1 of A first)
            assert a_before_b < BACKLOG // 2, a_before_b
            a_writer.close()
            b_writer.close()
        finally:
            await server.stop()

    loop = uvloop.new_event_loop()
    try:
        loop.run_until_complete(asyncio.wait_for(test(), 60))
    finally:
        loop.close()


async def _until(check: Callable[[], bool]) -> None:
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")
