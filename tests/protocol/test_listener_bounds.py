"""Hostile or broken clients against the listener's I/O (``listeners.connection``,
``listeners.reader``, ``listeners.protocol``), on uvloop as the broker runs, with a
handler of the test's own: what a connection may make the broker hold stays bounded, and
a closed connection leaves nothing for the cyclic collector.

- A client that pipelines requests answered at once and never reads: the responses the
  read loop writes itself stop once the transport holds any, so the connection holds
  about ``maxPendingResponseBytes`` and is then not read.
- A size prefix alone (of a frame up to the frame limit) takes no memory: a large frame
  is read into an anonymous mapping whose pages are taken as bytes arrive; and a frame
  whose bytes stop coming ends at the idle timeout.
- A stop while a request waits for the login gate gives its frame's read budget back.
- Connections closed cleanly, after a failed request, reset in the middle of a large
  frame, with a waiting stage pending, or at the idle timeout, over TCP and TLS, are freed
  by reference counting.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import uvloop

from listeners.admission import LoginGate
from listeners.connection import Connection
from listeners.frames import ReadBudget
from listeners.protocol import FrameProtocol
from listeners.reader import ConnectionReader
from listeners.server import (
    Answer,
    FrameError,
    Limits,
    ListenerServer,
    Request,
)
from tests.listener_helpers import StubHandler, frames
from tests.security_helpers import make_tls

_SIZE = struct.Struct(">i")
ANSWER_BYTES = 64 * 1024


class _Handler(StubHandler):
    """``now:N`` is answered at once with ``ANSWER_BYTES``; ``later:N`` after a waiting
    stage; ``hold:N`` waits in its dispatch stage for the test's event N; ``fail:N``
    fails. ``frame_limit`` set: the connection has not logged in."""

    def __init__(self, log: list[str], events: dict[str, asyncio.Event],
                 frame_limit: int | None = None) -> None:
        super().__init__(log, frame_limit)
        self.events = events

    def prepare(self, frame: memoryview) -> Request:
        kind, _, number = bytes(frame[:40]).decode(errors="replace").partition(":")
        answer_bytes = _SIZE.pack(ANSWER_BYTES) + b"x" * ANSWER_BYTES
        events, log = self.events, self.log

        async def later() -> bytes:
            await asyncio.sleep(0.05)
            return answer_bytes

        async def answer() -> Answer:
            log.append(f"dispatch {kind}")
            if kind == "fail":
                raise FrameError("failed")
            if kind == "hold":
                await events.setdefault(number[:1], asyncio.Event()).wait()
            if kind == "later":
                return later()
            return answer_bytes

        return Request(len(answer_bytes), answer)


def _run(test: Callable[[], Awaitable[None]]) -> None:
    loop = uvloop.new_event_loop()
    try:
        loop.run_until_complete(asyncio.wait_for(test(), 60))
    finally:
        loop.close()


async def _until(check: Callable[[], bool], seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


def _rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def _server_and_a_client_that_never_reads(
        log: list[str], limits: Limits) -> tuple[ListenerServer, socket.socket]:
    """A started server of ``_Handler``s, and a non-blocking client connected to it with a
    small receive buffer (it reads nothing)."""
    server = ListenerServer("TEST", "127.0.0.1", 0, lambda _i: _Handler(log, {}), limits)
    port = await server.start()
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect(("127.0.0.1", port))
    client.setblocking(False)
    return server, client


def test_answers_to_a_client_that_never_reads_stay_bounded() -> None:
    async def test() -> None:
        log: list[str] = []
        limits = Limits(idle_timeout_ms=60_000)
        server, client = await _server_and_a_client_that_never_reads(log, limits)
        try:
            await asyncio.get_running_loop().sock_sendall(
                client, frames(*(f"now:{n}" for n in range(2000))))
            await asyncio.sleep(1.5)
            (connection,) = server._connections
            held = connection.writer.transport.get_write_buffer_size() + connection.unsent_bytes
            assert held <= limits.max_pending_response_bytes + 2 * (ANSWER_BYTES + 4)
            assert sum(line.startswith("dispatch") for line in log) < 2000 // 10
        finally:
            client.close()
            await server.stop(grace_seconds=1)

    _run(test)


def test_a_stop_ends_a_connection_whose_client_reads_nothing() -> None:
    """Its answers fill the queue and the read loop waits for room; once the grace period
    is over the stop drops the connection and waits for it to end (its end marker used
    to wait for room in the full queue, for ever, and its write loop swallowed the
    cancellation: the broker logged that it stopped and did not exit)."""
    async def test() -> None:
        log: list[str] = []
        limits = Limits(idle_timeout_ms=60_000, max_queued_requests=4)
        server, client = await _server_and_a_client_that_never_reads(log, limits)
        try:
            await asyncio.get_running_loop().sock_sendall(
                client, frames(*(f"now:{n}" for n in range(200))))
            await _until(lambda: len(server._connections) == 1)
            (connection,) = server._connections
            await _until(lambda: connection.pending.full() and connection.dispatching)
            await server.stop(grace_seconds=0.2)
            assert log[-1] == "closed"  # the connection has ended, not left behind
            left = [task for task in asyncio.all_tasks()
                    if getattr(task.get_coro(), "__qualname__", "")
                    in ("Connection._write_loop", "ListenerServer._accept")]
            assert not left, left
        finally:
            client.close()

    _run(test)


def test_a_size_prefix_alone_takes_no_memory_and_ends_at_the_idle_timeout() -> None:
    async def test() -> None:
        limits = Limits(idle_timeout_ms=1_000)  # frames up to 100 MiB
        server = ListenerServer("TEST", "127.0.0.1", 0, lambda _i: _Handler([], {}), limits)
        port = await server.start()
        before = _rss_bytes()
        clients = []
        try:
            for _ in range(10):
                client = socket.create_connection(("127.0.0.1", port))
                client.sendall(_SIZE.pack(limits.max_frame_bytes) + b"y" * 100_000)
                clients.append(client)
            await _until(lambda: len(server._connections) == 10)
            await asyncio.sleep(0.3)
            assert _rss_bytes() - before < 100 << 20  # 10 frames of 100 MiB declared
            await _until(lambda: not server._connections)  # no more bytes: idle
        finally:
            for client in clients:
                client.close()
            await server.stop(grace_seconds=1)

    _run(test)


def test_a_stop_while_a_frame_waits_for_the_login_gate_gives_its_budget_back() -> None:
    async def test() -> None:
        log: list[str] = []
        events: dict[str, asyncio.Event] = {}
        budget = ReadBudget(1 << 20)
        server = ListenerServer("TEST", "127.0.0.1", 0,
                                lambda _i: _Handler(log, events, frame_limit=1 << 20),
                                Limits(idle_timeout_ms=60_000), budget=budget,
                                gate=LoginGate(1))
        port = await server.start()
        holder = socket.create_connection(("127.0.0.1", port))
        waiter = socket.create_connection(("127.0.0.1", port))
        try:
            holder.sendall(frames("hold:1"))  # the only permit, held
            await _until(lambda: "dispatch hold" in log)
            waiter.sendall(frames("big:" + "x" * (20 * 1024)))  # > 16 KiB: budgeted
            await _until(lambda: budget.used > 0)
            stopping = asyncio.create_task(server.stop(grace_seconds=5))
            await asyncio.sleep(0.2)
            events["1"].set()
            await stopping
            assert budget.used == 0
        finally:
            holder.close()
            waiter.close()

    _run(test)


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
def test_connections_closed_any_way_are_freed_without_the_collector(
        tmp_path: Path, tls: bool) -> None:
    files = make_tls(tmp_path) if tls else None
    server_tls = client_tls = None
    if files is not None:
        server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_tls.load_cert_chain(files.cert, files.key)
        client_tls = ssl.create_default_context(cafile=str(files.ca))

    async def one(port: int, kind: str) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_tls)
        try:
            if kind == "clean":
                writer.write(frames("now:1", "later:2", "now:3"))
                await reader.readexactly(3 * (ANSWER_BYTES + 4))
            elif kind == "fail":
                writer.write(frames("now:1", "fail:2", "now:3"))
                while await reader.read(1 << 16):
                    pass
            elif kind in ("reset", "abort"):  # in the middle of a large frame
                writer.write(_SIZE.pack(1 << 20) + b"x" * 100_000)
                await writer.drain()
                await asyncio.sleep(0.05)
                if kind == "reset":
                    writer.get_extra_info("socket").setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
                return
            elif kind == "pending":  # a waiting stage under way
                writer.write(frames("later:1", "now:2"))
                await asyncio.sleep(0.01)
                writer.transport.abort()
                return
            else:  # idle: closed by the broker
                await reader.read()
        finally:
            writer.close()

    async def test() -> None:
        server = ListenerServer("TEST", "127.0.0.1", 0, lambda _i: _Handler([], {}),
                                Limits(idle_timeout_ms=400),
                                tls_context=None if server_tls is None else lambda: server_tls)
        port = await server.start()
        try:
            kinds = ["clean", "fail", "reset", "abort", "pending", "idle"] * 3
            await asyncio.gather(*(one(port, kind) for kind in kinds), return_exceptions=True)
            await _until(lambda: not server._connections)
            await asyncio.sleep(0.3)  # the closed connections' last callbacks run
        finally:
            await server.stop(grace_seconds=1)

    gc.collect()
    gc.disable()
    try:
        _run(test)
        kinds = (Connection, FrameProtocol, ConnectionReader)
        left = {kind.__name__: sum(isinstance(obj, kind) for obj in gc.get_objects())
                for kind in kinds}
    finally:
        gc.enable()
    assert left == dict.fromkeys(left, 0)
