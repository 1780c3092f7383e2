"""Asyncio servers for listeners: framing, in-order pipelining, limits and graceful stop.

A connection is read by one task that keeps parsing frames while earlier requests wait;
responses leave in request order, as Kafka requires. What a frame means is the
connection handler's business; this module only knows sizes, order and timeouts.

Memory is bounded twice. Per connection: before a request starts, its handler says how
large its response may grow (:attr:`Request.response_bound`), and the request is started
only when that, the bounds of the requests still running and the responses finished but
not yet written fit in ``max_pending_response_bytes`` together, or when nothing else is
held (so one request larger than the limit still runs, alone). Until then the connection
is not read: a client that pipelines fetches and never reads, or parks long polls that
wake together, stops being read instead of filling the broker. A started request gets
one turn of the event loop at once (most finish in it).

Per server: a connection whose handler reports a frame limit (one that has not logged
in) may send frames up to that limit only, and the frames of all such connections are
counted against one :class:`ReadBudget` shared by the broker's listeners.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from listeners.sendfile import FileRegion, write_parts

log = logging.getLogger(__name__)
_SIZE = struct.Struct(">i")

Response = bytes | Sequence[bytes | memoryview | FileRegion]
"""One framed response: a single ``bytes``, or buffers and file regions sent in order."""


class FrameError(Exception):
    """A handler's verdict that the connection must be closed (garbage on the wire, or a
    failed login). ``final`` is a last response written before the connection closes."""

    def __init__(self, message: str, final: bytes | None = None) -> None:
        super().__init__(message)
        self.final = final


@dataclass(frozen=True, slots=True)
class Request:
    """A request frame as its handler read it: the most bytes its response may put on the
    wire, and the work that answers it, not begun until the listener calls ``answer``.
    ``answer`` returns None when no response is due, and raises :class:`FrameError` to
    close the connection after the earlier responses are sent."""

    response_bound: int
    answer: Callable[[], Awaitable[Response | None]]


class ConnectionHandler(Protocol):
    """Turns request frames of one connection into response frames."""

    @property
    def frame_limit(self) -> int | None:
        """The largest frame the connection may send now, or None when the listener's
        ``max_frame_bytes`` applies. A limited connection's frames are also counted
        against the server's :class:`ReadBudget` (for connections not yet logged in)."""
        ...

    def prepare(self, frame: memoryview) -> Request:
        """Read one request frame (no size prefix) without acting on it yet. Called in
        the order frames arrive, each once the one before has been started."""
        ...

    def closed(self) -> None:
        """The connection is gone."""
        ...


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """Who is on the other end of a connection, and on which listener."""

    listener: str
    peer: str
    tls: ssl.SSLObject | None


HandlerFactory = Callable[[ConnectionInfo], ConnectionHandler]


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-connection limits of a listener."""

    max_frame_bytes: int = 100 * 1024 * 1024
    max_queued_requests: int = 500
    idle_timeout_ms: int = 600_000
    max_connections: int = 10_000
    max_pending_response_bytes: int = 8 * 1024 * 1024


class ReadBudget:
    """Bytes that frames of limited connections (see ``ConnectionHandler.frame_limit``)
    may hold at once, across every listener sharing the budget."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0

    def take(self, size: int) -> bool:
        """Reserve ``size`` bytes; False (nothing reserved) when the budget cannot hold them."""
        if self.used + size > self.total:
            return False
        self.used += size
        return True

    def give_back(self, size: int) -> None:
        """Return bytes reserved by :meth:`take`."""
        self.used -= size


async def _fail(exc: Exception) -> None:
    raise exc


def response_size(response: Response | None) -> int:
    """The bytes a response puts on the wire (what it holds until it is written)."""
    if response is None:
        return 0
    if isinstance(response, bytes):
        return len(response)
    return sum(len(part) for part in response)


class _Connection:
    """One client connection: a read loop feeding an ordered write loop."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 handler: ConnectionHandler, info: ConnectionInfo, limits: Limits,
                 budget: ReadBudget, on_reject: Callable[[str, str], None] | None) -> None:
        self.reader = reader
        self.writer = writer
        self.handler = handler
        self.info = info
        self.limits = limits
        self.budget = budget
        self.on_reject = on_reject
        self.pending: asyncio.Queue[asyncio.Task[Response | None] | None] = asyncio.Queue(
            maxsize=limits.max_queued_requests)
        self.reading: asyncio.Task[Any] | None = None
        self.unsent_bytes = 0  # of responses finished and not yet written
        self.running_bytes = 0  # the response bounds of requests started and not finished
        self.room = asyncio.Event()  # set when either drops
        self.writing = False  # a response is being written (the client has it to read)
        self.lost = False
        # sendfile needs the raw socket: plain TCP only (TLS encrypts in user space)
        self.socket = None if info.tls is not None else writer.get_extra_info("socket")

    async def serve(self) -> None:
        writing = asyncio.get_running_loop().create_task(self._write_loop())
        self.reading = asyncio.current_task()
        try:
            await self._read_loop()
        except asyncio.CancelledError:
            pass  # stop reading: shutdown, or the write side closed the connection
        finally:
            await self.pending.put(None)
            with contextlib.suppress(asyncio.CancelledError):
                await writing
            self.handler.closed()
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()

    def stop_reading(self) -> None:
        """Stop taking new requests; those already read are still answered."""
        if self.reading is not None and not self.reading.done():
            self.reading.cancel()

    async def _read_frame(self) -> tuple[memoryview, int] | None:
        """The next frame and the bytes it holds of the read budget; None to close."""
        idle = self.limits.idle_timeout_ms / 1000 if self.limits.idle_timeout_ms > 0 else None
        try:
            prefix = await asyncio.wait_for(self.reader.readexactly(4), idle)
        except TimeoutError:
            log.info("closing idle connection from %s on %s", self.info.peer, self.info.listener)
            return None
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                log.warning("connection from %s closed inside a size prefix", self.info.peer)
            return None
        (size,) = _SIZE.unpack(prefix)
        limit = self.handler.frame_limit
        most = self.limits.max_frame_bytes if limit is None else limit
        if size <= 0 or size > most:
            log.warning("closing connection from %s on %s: frame size %d outside 1..%d%s",
                        self.info.peer, self.info.listener, size, most,
                        "" if limit is None else " (before authentication)")
            if limit is not None:
                self._reject(f"frame of {size} bytes before authentication (limit {most})")
            return None
        held = 0 if limit is None else size
        if held and not self.budget.take(held):
            log.warning("closing connection from %s on %s: frames of connections not "
                        "logged in already hold %d of %d bytes", self.info.peer,
                        self.info.listener, self.budget.used, self.budget.total)
            self._reject("buffer for connections not logged in is full")
            return None
        read = False
        try:
            # before login a frame must arrive within the idle timeout: a client may not
            # hold part of the shared budget by sending slowly
            frame = memoryview(await asyncio.wait_for(self.reader.readexactly(size),
                                                      idle if held else None))
            read = True
            return frame, held
        except asyncio.IncompleteReadError as exc:
            log.warning("connection from %s closed after %d of %d frame bytes",
                        self.info.peer, len(exc.partial), size)
            return None
        except TimeoutError:
            log.info("closing connection from %s on %s: a frame of %d bytes before "
                     "authentication was not complete within the idle timeout",
                     self.info.peer, self.info.listener, size)
            return None
        finally:
            if not read:
                self.budget.give_back(held)

    def _reject(self, reason: str) -> None:
        if self.on_reject is not None:
            self.on_reject(self.info.peer, reason)

    async def _read_loop(self) -> None:
        last: asyncio.Task[Response | None] | None = None
        while True:
            if last is not None and self.handler.frame_limit is not None:
                # not logged in: one request at a time, as Kafka does, so that the limit
                # of the next frame is the one in force after this request (a login)
                await asyncio.wait([last])
            try:
                read = await self._read_frame()
            except ConnectionError as exc:
                self._lost(exc)
                return
            if read is None:
                return
            frame, held = read
            started: asyncio.Task[Response | None] | None = None
            try:
                request = self._prepare(frame)
                del frame
                if await self._room_for(request.response_bound):
                    started = self._start(request, held)
            finally:
                if started is None:
                    self.budget.give_back(held)
            if started is None:
                return
            last = started
            await self.pending.put(last)
            await asyncio.sleep(0)  # one turn for the request: most finish in it

    def _prepare(self, frame: memoryview) -> Request:
        """The handler's reading of a frame; should the handler fail, a request that fails
        alike when answered (so the connection closes in order, with one log line)."""
        try:
            return self.handler.prepare(frame)
        except Exception as exc:  # a handler's fault, not the client's: logged in order
            return Request(0, partial(_fail, exc))

    def _start(self, request: Request, held: int) -> asyncio.Task[Response | None]:
        """Run a request, its response bound counted until it has finished."""
        bound = max(request.response_bound, 0)
        self.running_bytes += bound
        task = asyncio.get_running_loop().create_task(self._run(request))

        def finished(_task: asyncio.Task[Response | None]) -> None:
            self.budget.give_back(held)
            self.running_bytes -= bound
            self.room.set()

        task.add_done_callback(finished)
        return task

    def _fits(self, bound: int) -> bool:
        held = self.running_bytes + self.unsent_bytes
        return held == 0 or held + bound <= self.limits.max_pending_response_bytes

    async def _room_for(self, bound: int) -> bool:
        """Wait until a response of ``bound`` bytes fits beside what the connection holds;
        False (and the connection aborted) when the client reads nothing of the responses
        waiting for it for the idle timeout."""
        idle = self.limits.idle_timeout_ms / 1000 if self.limits.idle_timeout_ms > 0 else None
        while not self._fits(bound):
            self.room.clear()
            try:
                await asyncio.wait_for(self.room.wait(), idle)
            except TimeoutError:
                if not self.writing:
                    continue  # waiting for a request to finish (a long poll), not the client
                log.info("closing connection from %s on %s: %d response bytes not read "
                         "within the idle timeout", self.info.peer, self.info.listener,
                         self.unsent_bytes)
                self.writer.transport.abort()
                return False
        return True

    async def _run(self, request: Request) -> Response | None:
        """Answer one request; count its response as unsent until the write loop sends it."""
        response = await request.answer()
        self.unsent_bytes += response_size(response)
        return response

    def _lost(self, exc: ConnectionError) -> None:
        """The peer reset or closed the connection under us: one INFO line for it."""
        if not self.lost:
            self.lost = True
            log.info("connection from %s on %s lost: %s", self.info.peer, self.info.listener,
                     exc.strerror or type(exc).__name__)

    def _sent(self, size: int) -> None:
        self.unsent_bytes -= size
        self.room.set()

    async def _write_loop(self) -> None:
        broken = False
        while True:
            task = await self.pending.get()
            if task is None:
                return
            if broken:
                task.cancel()
                if task.done() and not task.cancelled() and task.exception() is None:
                    self._sent(response_size(task.result()))
                continue
            size = 0
            try:
                response = await task
                size = response_size(response)
                self.writing = True
                if isinstance(response, bytes):
                    self.writer.write(response)
                    await self.writer.drain()
                elif response is not None:
                    await write_parts(self.writer, response, self.socket)
            except FrameError as exc:
                log.warning("closing connection from %s on %s: %s", self.info.peer,
                            self.info.listener, exc)
                if exc.final is not None:
                    self.writer.write(exc.final)
                broken = True
            except ConnectionError as exc:
                self._lost(exc)
                broken = True
            except asyncio.CancelledError:
                broken = True
            except Exception:
                log.exception("request from %s failed; closing the connection", self.info.peer)
                broken = True
            self.writing = False
            self._sent(size)
            if broken:
                self.stop_reading()
                self.writer.close()


class ListenerServer:
    """One listening socket and the connections it accepted."""

    def __init__(self, name: str, host: str, port: int, factory: HandlerFactory,
                 limits: Limits, ssl_context: ssl.SSLContext | None = None,
                 on_reject: Callable[[str, str], None] | None = None,
                 budget: ReadBudget | None = None) -> None:
        self.name = name
        self.host = host
        self.port = port
        self.factory = factory
        self.limits = limits
        self.ssl_context = ssl_context
        self.on_reject = on_reject
        self.budget = budget or ReadBudget(limits.max_frame_bytes)
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self) -> int:
        """Bind and listen; return the bound port (useful with port 0)."""
        self._server = await asyncio.start_server(
            self._accept, self.host or None, self.port, ssl=self.ssl_context,
            limit=1 << 20,
        )
        sockets = self._server.sockets
        self.port = int(sockets[0].getsockname()[1])
        return self.port

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peername = writer.get_extra_info("peername")
        peer = f"{peername[0]}:{peername[1]}" if isinstance(peername, tuple) else str(peername)
        if len(self._connections) >= self.limits.max_connections:
            log.warning("refusing connection from %s on %s: %d connections is the limit",
                        peer, self.name, self.limits.max_connections)
            if self.on_reject is not None:
                self.on_reject(peer, "connection limit reached")
            writer.close()
            return
        info = ConnectionInfo(self.name, peer, writer.get_extra_info("ssl_object"))
        connection = _Connection(reader, writer, self.factory(info), info, self.limits,
                                 self.budget, self.on_reject)
        self._connections.add(connection)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await connection.serve()
        finally:
            self._connections.discard(connection)
            if task is not None:
                self._tasks.discard(task)

    async def stop(self, grace_seconds: float = 10.0) -> None:
        """Stop accepting, answer the requests already read, then close every connection."""
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            connection.stop_reading()
        if self._tasks:
            _done, late = await asyncio.wait(set(self._tasks), timeout=grace_seconds)
            for task in late:
                task.cancel()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
