"""The listener's two stages, seen from a plain socket with a handler of the test's own.

The read loop runs a request's dispatch stage itself and writes its response at once when
nothing is queued before it; only waiting stages get a task. These tests pin what that
must not change: responses leave in request order whatever mix of immediate answers and
waiting stages a connection pipelines; a stop (shutdown) during a dispatch stage lets it
finish and answers it, without reading the request behind it, and so does a stop while a
response waits for room in a full queue; a dispatch stage that fails
closes the connection only after the responses before it are sent, and nothing behind it
is run.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable

import pytest

from listeners.server import (
    Answer,
    ConnectionHandler,
    ConnectionInfo,
    FrameError,
    Limits,
    ListenerServer,
    Request,
)
from tests.listener_helpers import StubHandler, frames

_SIZE = struct.Struct(">i")


class _Handler(StubHandler):
    """Each frame is ``kind:number``: ``now`` answers at once, ``later`` waits for the
    test's event ``number`` in its waiting stage, ``hold`` waits for it in its dispatch
    stage, ``fail`` fails its dispatch stage. The answer is the frame itself."""

    def __init__(self, events: dict[int, asyncio.Event], log: list[str],
                 frame_limit: int | None = None) -> None:
        super().__init__(log, frame_limit)
        self.events = events

    def prepare(self, frame: memoryview) -> Request:
        text = bytes(frame).decode()
        kind, number = text.split(":")
        event = self.events.setdefault(int(number), asyncio.Event())
        response = _SIZE.pack(len(frame)) + bytes(frame)

        async def answer() -> Answer:
            self.log.append(f"dispatch {text}")
            if kind == "fail":
                raise FrameError(f"failed {text}")
            if kind == "hold":
                try:
                    await event.wait()
                except asyncio.CancelledError:
                    self.log.append(f"cancelled {text}")
                    raise
                self.log.append(f"dispatched {text}")
            if kind == "later":
                return _after(event, response)
            return response

        return Request(len(response), answer)


async def _after(event: asyncio.Event, response: bytes) -> bytes:
    await event.wait()
    return response


async def _serve(events: dict[int, asyncio.Event], log: list[str],
                 max_queued_requests: int = 500,
                 frame_limit: int | None = None) -> tuple[ListenerServer, int]:
    """A listener of :class:`_Handler`; its connections not logged in with a
    ``frame_limit``."""
    def factory(_info: ConnectionInfo) -> ConnectionHandler:
        return _Handler(events, log, frame_limit)

    limits = Limits(idle_timeout_ms=60_000, max_queued_requests=max_queued_requests)
    server = ListenerServer("TEST", "127.0.0.1", 0, factory, limits)
    return server, await server.start()


async def _read_answers(reader: asyncio.StreamReader, count: int) -> list[str]:
    answers = []
    for _ in range(count):
        (size,) = _SIZE.unpack(await reader.readexactly(4))
        answers.append((await reader.readexactly(size)).decode())
    return answers


def _run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 30))


def test_immediate_answers_never_overtake_a_waiting_stage() -> None:
    async def test() -> None:
        events: dict[int, asyncio.Event] = {}
        server, port = await _serve(events, [])
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(frames("now:1", "later:2", "now:3", "later:4", "now:5"))
            assert await _read_answers(reader, 1) == ["now:1"]
            await asyncio.sleep(0.2)  # every request has been dispatched by now
            events[4].set()  # the second waiting stage ends first
            await asyncio.sleep(0.1)
            events[2].set()
            assert await _read_answers(reader, 4) == ["later:2", "now:3", "later:4", "now:5"]
            writer.write(frames("now:6"))  # the queue is empty again: written at once
            assert await _read_answers(reader, 1) == ["now:6"]
            writer.close()
        finally:
            await server.stop()

    _run(test)


def test_a_stop_during_a_dispatch_stage_lets_it_finish_and_answers_it() -> None:
    async def test() -> None:
        events: dict[int, asyncio.Event] = {}
        log: list[str] = []
        server, port = await _serve(events, log)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(frames("now:1", "hold:2", "now:3"))
        assert await _read_answers(reader, 1) == ["now:1"]
        while "dispatch hold:2" not in log:
            await asyncio.sleep(0.01)
        stopping = asyncio.create_task(server.stop(grace_seconds=10))
        await asyncio.sleep(0.2)
        assert "cancelled hold:2" not in log
        events[2].set()
        assert await _read_answers(reader, 1) == ["hold:2"]
        await stopping
        assert await reader.read() == b""  # closed, the request behind it never read
        assert "dispatch now:3" not in log and "cancelled hold:2" not in log
        assert log[-1] == "closed"
        writer.close()

    _run(test)


def test_a_stop_while_the_queue_is_full_answers_the_request_waiting_for_room() -> None:
    """A request whose dispatch stage has run waits for room in the connection's full
    queue of responses when the broker stops: it is answered after the responses before
    it, then the connection closes, without reading the request behind it (it was dropped
    unanswered: its effect, a produce appended, was never acknowledged)."""

    async def test() -> None:
        events: dict[int, asyncio.Event] = {}
        log: list[str] = []
        server, port = await _serve(events, log, max_queued_requests=1)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        # the write loop waits for later:1, the queue holds later:2: now:3 waits for room
        writer.write(frames("later:1", "later:2", "now:3", "now:4"))
        while "dispatch now:3" not in log:
            await asyncio.sleep(0.01)
        stopping = asyncio.create_task(server.stop(grace_seconds=10))
        await asyncio.sleep(0.1)
        events[1].set()
        events[2].set()
        assert await _read_answers(reader, 3) == ["later:1", "later:2", "now:3"]
        await stopping
        assert await reader.read() == b""
        assert "dispatch now:4" not in log and log[-1] == "closed"
        writer.close()

    _run(test)


def test_a_stop_drops_a_connection_not_logged_in_at_once() -> None:
    """A client that has not logged in is owed nothing at a stop: its connection is
    dropped without waiting for the grace period, though its request waits (as a failed
    login waits out ``failedAuthenticationDelayMs``) and would not end before it."""

    async def test() -> None:
        events: dict[int, asyncio.Event] = {}
        log: list[str] = []
        server, port = await _serve(events, log, frame_limit=1024)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(frames("later:1"))
        while "dispatch later:1" not in log:
            await asyncio.sleep(0.01)
        await server.stop(grace_seconds=600)  # _run's bound is 30 s
        assert await reader.read() == b""
        assert log[-1] == "closed" and not events[1].is_set()
        writer.close()

    _run(test)


@pytest.mark.parametrize("before", [("now:1",), ("later:1",)])
def test_a_failed_dispatch_stage_closes_after_the_answers_before_it(
        before: tuple[str, ...]) -> None:
    async def test() -> None:
        events: dict[int, asyncio.Event] = {1: asyncio.Event()}
        events[1].set()
        log: list[str] = []
        server, port = await _serve(events, log)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(frames(*before, "fail:2", *(f"now:{n}" for n in range(3, 20))))
            assert await _read_answers(reader, 1) == [before[0]]
            assert await reader.read() == b""
            # a produce behind a corrupt request is not appended unanswered
            assert not any(line.startswith("dispatch now:") and line != "dispatch now:1"
                           for line in log)
            writer.close()
        finally:
            await server.stop()

    _run(test)
