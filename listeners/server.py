"""Asyncio servers for listeners: framing, in-order pipelining, limits and graceful stop.

Requests of one connection take effect in the order they arrived, and their responses
leave in that order, as Kafka requires. Kafka gets both by handling one request per
connection at a time; here each request has two stages (:class:`Request`): its
``answer`` coroutine is the *dispatch stage*, run strictly one request after another: the
next frame is not even prepared until the dispatch stage before it has returned, however
many awaits it holds. What it returns may be a *waiting stage* (an awaitable giving the
response), and only waiting stages overlap with later requests: a produce waiting for its
commit, a long-poll fetch, a group member waiting for its group. A write loop sends the
responses in request order. What a frame means, and what belongs to which stage, is the
connection handler's business; this module only knows sizes, order and timeouts.

Memory is bounded twice. Per connection: before a request starts, its handler says how
large its response may grow (:attr:`Request.response_bound`), and the request is started
only when that, the bounds of the requests still running and the responses finished but
not yet written fit in ``max_pending_response_bytes`` together, or when nothing else is
held (so one request larger than the limit still runs, alone). Until then the connection
is not read: a client that pipelines fetches and never reads, or parks long polls that
wake together, stops being read instead of filling the broker.

Per server: a connection whose handler reports a frame limit (one that has not logged
in) may send frames up to that limit only. Such a connection is read one small piece at a
time and not at all while its request runs; a frame of up to ``SMALL_FRAME_BYTES`` (any
real login) is read as it is, a larger one draws on one :class:`ReadBudget` shared by the
broker's listeners as its bytes arrive, so that nobody can fill the budget by declaring
sizes, and a full budget never stops a login.

A handler may mute its connection until a moment (``muted_until``, a client throttled by
a quota, KIP-219): until then no frame is read or started and the transport is paused, so
the client's requests wait in its socket, whether it honours ``throttle_time_ms`` or not.

The handler factory may refuse a new connection (:class:`ConnectionRefused`, a quota on
new connections): it is closed before anything is read.

On a TLS listener each connection does its handshake in :mod:`listeners.handshake`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import ssl
import struct
import termios
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, TypeVar, cast

from listeners.handshake import TlsHandshake, os_reason, peer_address
from listeners.sendfile import FileRegion, write_parts

log = logging.getLogger(__name__)
_SIZE = struct.Struct(">i")
_T = TypeVar("_T")

SMALL_FRAME_BYTES = 16 * 1024
"""Frames of connections not logged in up to this size are not counted against the shared
:class:`ReadBudget`: ApiVersions, SaslHandshake, a PLAIN login and an OAUTHBEARER token
(one carrying 200 group ids, the most Entra ID puts in a token, signed RS256 with a
4096-bit key, measures about 12.5 KiB). Before login a connection's read buffer is this
size too."""
_READ_LIMIT = 1 << 20
"""The read buffer of a logged-in connection (the StreamReader pauses at twice this)."""
_BUDGET_CHUNK = 64 * 1024
_PEER_ERRNOS = frozenset({errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH,
                          errno.ENETDOWN, errno.EHOSTDOWN, errno.ECONNREFUSED})

Response = bytes | Sequence[bytes | memoryview | FileRegion]
"""One framed response: a single ``bytes``, or buffers and file regions sent in order."""
Answer = Response | None | Awaitable[Response | None]
"""What a request's dispatch stage gives: its response (None: none is due), or its waiting
stage, an awaitable giving the response that may overlap with the next requests."""


class FrameError(Exception):
    """A handler's verdict that the connection must be closed (garbage on the wire, or a
    failed login). ``final`` is a last response written before the connection closes;
    ``logged``: the handler has said why already (the listener adds no line)."""

    def __init__(self, message: str, final: bytes | None = None, *,
                 logged: bool = False) -> None:
        super().__init__(message)
        self.final = final
        self.logged = logged


class ConnectionRefused(Exception):
    """A handler factory's verdict that a new connection is not served (a quota on new
    connections): it is closed at once, and the factory has said why."""


@dataclass(frozen=True, slots=True)
class Request:
    """A request frame as its handler read it: the most bytes its response may put on the
    wire, and the work that answers it, not begun until the listener calls ``answer``.

    ``answer`` is the request's dispatch stage: the listener calls the ``answer`` of the
    connection's next request only once this one has returned. It returns the response,
    None when no response is due, or an awaitable (the waiting stage) giving either; both
    stages may raise :class:`FrameError` to close the connection after the earlier
    responses are sent."""

    response_bound: int
    answer: Callable[[], Awaitable[Answer]]


class ConnectionHandler(Protocol):
    """Turns request frames of one connection into response frames."""

    @property
    def frame_limit(self) -> int | None:
        """The largest frame the connection may send now, or None when the listener's
        ``max_frame_bytes`` applies. A limited connection's frames larger than
        ``SMALL_FRAME_BYTES`` are also counted against the server's :class:`ReadBudget`
        (for connections not yet logged in)."""
        ...

    def prepare(self, frame: memoryview) -> Request:
        """Read one request frame (no size prefix) without acting on it yet. Called in
        the order frames arrive, each once the dispatch stage before it has returned."""
        ...

    @property
    def muted_until(self) -> float:
        """Until when (``time.monotonic()``) the connection is not to be read: a client
        throttled by a quota (KIP-219). No frame is read or started before then."""
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
    """Bytes that large frames of limited connections (see
    ``ConnectionHandler.frame_limit``) may hold at once, across every listener sharing the
    budget; taken as the bytes arrive."""

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


def _peer_gone(exc: OSError) -> bool:
    """Whether an error of a socket read or write means the peer is unreachable or gone."""
    return isinstance(exc, ConnectionError | ssl.SSLError) or exc.errno in _PEER_ERRNOS


def _usable(tls: ssl.SSLObject) -> bool:
    """Whether a TLS session is still up (a fatal error undoes its handshake)."""
    try:
        tls.getpeercert()
    except ValueError:
        return False
    return True


def _log_lost(peer: str, listener: str, exc: OSError | None) -> None:
    """One INFO line for a connection the peer reset, closed or garbled."""
    log.info("connection from %s on %s lost: %s", peer, listener,
             "closed" if exc is None else os_reason(exc))


class _Reader(asyncio.StreamReader):
    """A StreamReader whose buffer limit changes at login."""

    def set_limit(self, limit: int) -> None:
        """Pause the transport once more than twice ``limit`` bytes are buffered."""
        self._limit = limit


def response_size(response: Response | None) -> int:
    """The bytes a response puts on the wire (what it holds until it is written)."""
    if response is None:
        return 0
    if isinstance(response, bytes):
        return len(response)
    return sum(len(part) for part in response)


class _Connection:
    """One client connection: a read loop feeding an ordered write loop."""

    def __init__(self, reader: _Reader, writer: asyncio.StreamWriter,
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
        # what the kernel holds of what was sent: a client reading it is not idle
        sock = writer.get_extra_info("socket")
        self.kernel_queue: int | None = sock.fileno() if hasattr(termios, "TIOCOUTQ") \
            and sock is not None else None

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
            prefix = await self._until_idle(lambda: self.reader.readexactly(4))
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
        if limit is None or size <= SMALL_FRAME_BYTES:
            try:
                # before login a frame must arrive within the idle timeout
                frame = await asyncio.wait_for(self.reader.readexactly(size),
                                               None if limit is None else idle)
            except asyncio.IncompleteReadError as exc:
                self._closed_inside(len(exc.partial), size)
                return None
            except TimeoutError:
                self._incomplete(size)
                return None
            return memoryview(frame), 0
        return await self._read_counted(size, idle)

    async def _read_counted(self, size: int, idle: float | None) -> tuple[memoryview, int] | None:
        """A large frame before login: its bytes are taken from the shared budget as they
        arrive, and the whole frame must arrive within the idle timeout."""
        frame = bytearray()
        done = False
        try:
            async with asyncio.timeout(idle):
                while len(frame) < size:
                    chunk = await self.reader.read(min(size - len(frame), _BUDGET_CHUNK))
                    if not chunk:
                        self._closed_inside(len(frame), size)
                        return None
                    if not self.budget.take(len(chunk)):
                        log.warning("closing connection from %s on %s: frames of connections "
                                    "not logged in already hold %d of %d bytes", self.info.peer,
                                    self.info.listener, self.budget.used, self.budget.total)
                        self._reject("buffer for connections not logged in is full")
                        return None
                    frame += chunk
            done = True
            return memoryview(frame), size
        except TimeoutError:
            self._incomplete(size)
            return None
        finally:
            if not done:
                self.budget.give_back(len(frame))

    def _closed_inside(self, got: int, size: int) -> None:
        log.warning("connection from %s closed after %d of %d frame bytes",
                    self.info.peer, got, size)

    def _incomplete(self, size: int) -> None:
        log.info("closing connection from %s on %s: a frame of %d bytes before "
                 "authentication was not complete within the idle timeout",
                 self.info.peer, self.info.listener, size)

    def _reject(self, reason: str) -> None:
        if self.on_reject is not None:
            self.on_reject(self.info.peer, reason)

    async def _read_loop(self) -> None:
        last: asyncio.Task[Response | None] | None = None
        while True:
            if last is not None and self.handler.frame_limit is not None:
                # not logged in: one whole request at a time, with nothing read meanwhile
                # (a failed login waits, a token may need a JWKS), so that the limit of the
                # next frame is the one in force after this request (a login)
                await self._without_reading(asyncio.wait([last]))
            await self._while_muted()
            self.reader.set_limit(_READ_LIMIT if self.handler.frame_limit is None
                                  else SMALL_FRAME_BYTES)
            try:
                read = await self._read_frame()
            except OSError as exc:
                self._lost(exc)
                return
            if read is None:
                return
            frame, held = read
            await self._while_muted()  # a throttle known only once the frame was read
            started: tuple[asyncio.Task[Response | None], asyncio.Future[None]] | None = None
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
            last, dispatched = started
            await self.pending.put(last)
            # the order rule: nothing more is read until this request's dispatch stage
            # has returned; its waiting stage may go on. The request runs first in the next
            # turn of the loop, and most dispatch stages end in it.
            await asyncio.sleep(0)
            if not dispatched.done():
                await dispatched

    async def _without_reading(self, wait: Awaitable[object]) -> None:
        """Await ``wait`` with the transport paused (unless the reader paused it)."""
        transport = cast(asyncio.Transport, self.writer.transport)  # uvloop's is no subclass
        paused = transport.is_reading()
        if paused:
            transport.pause_reading()
        try:
            await wait
        finally:
            if paused and not transport.is_closing():
                transport.resume_reading()

    async def _while_muted(self) -> None:
        """Read nothing until the handler's mute ends (it may be extended meanwhile)."""
        while (remaining := self.handler.muted_until - time.monotonic()) > 0:
            await self._without_reading(asyncio.sleep(remaining))

    def _prepare(self, frame: memoryview) -> Request:
        """The handler's reading of a frame; should the handler fail, a request that fails
        alike when answered (so the connection closes in order, with one log line)."""
        try:
            return self.handler.prepare(frame)
        except Exception as exc:  # a handler's fault, not the client's: logged in order
            return Request(0, partial(_fail, exc))

    def _start(self, request: Request, held: int
               ) -> tuple[asyncio.Task[Response | None], asyncio.Future[None]]:
        """Run a request, its response bound counted until it has finished; the future is
        done once its dispatch stage has returned (or failed)."""
        bound = max(request.response_bound, 0)
        self.running_bytes += bound
        loop = asyncio.get_running_loop()
        dispatched: asyncio.Future[None] = loop.create_future()
        task = loop.create_task(self._run(request, dispatched))

        def finished(_task: asyncio.Task[Response | None]) -> None:
            if not dispatched.done():  # cancelled before it began (the connection broke)
                dispatched.set_result(None)
            self.budget.give_back(held)
            self.running_bytes -= bound
            self.room.set()

        task.add_done_callback(finished)
        return task, dispatched

    def _fits(self, bound: int) -> bool:
        held = self.running_bytes + self.unsent_bytes
        return held == 0 or held + bound <= self.limits.max_pending_response_bytes

    async def _room_for(self, bound: int) -> bool:
        """Wait until a response of ``bound`` bytes fits beside what the connection holds;
        False (and the connection aborted) when the client reads nothing of the responses
        waiting for it for the idle timeout."""
        while not self._fits(bound):
            self.room.clear()
            try:
                await self._until_idle(self.room.wait)
            except TimeoutError:
                if not self.writing:
                    continue  # waiting for a request to finish (a long poll), not the client
                log.info("closing connection from %s on %s: %d response bytes not read "
                         "within the idle timeout", self.info.peer, self.info.listener,
                         self.unsent_bytes)
                self.writer.transport.abort()
                return False
        return True

    async def _until_idle(self, wait: Callable[[], Awaitable[_T]]) -> _T:
        """``await wait()``; TimeoutError once the connection has been idle for the idle
        timeout: nothing arrived and the client took none of the bytes sent to it. It looks
        four times per timeout, so a client reading a large response slowly stays."""
        if self.limits.idle_timeout_ms <= 0:
            return await wait()
        idle = self.limits.idle_timeout_ms / 1000
        loop = asyncio.get_running_loop()
        progress, since = self._progress(), loop.time()
        while True:
            try:
                return await asyncio.wait_for(wait(), idle / 4)
            except TimeoutError:
                if self._progress() != progress:
                    progress, since = self._progress(), loop.time()
                elif loop.time() - since >= idle:
                    raise

    def _progress(self) -> tuple[int, int, int]:
        """Changes whenever the client takes response bytes: the unsent bytes of finished
        responses drop, the transport's buffer does, or the socket's (Linux)."""
        queued = 0
        if self.kernel_queue is not None:
            with contextlib.suppress(OSError):
                queued = struct.unpack("i", fcntl.ioctl(self.kernel_queue, termios.TIOCOUTQ,
                                                        b"\0\0\0\0"))[0]
        return self.unsent_bytes, self.writer.transport.get_write_buffer_size(), queued

    async def _run(self, request: Request, dispatched: asyncio.Future[None]) -> Response | None:
        """Answer one request: its dispatch stage, then (``dispatched`` done, the next
        request may start) its waiting stage if it has one; count the response as unsent
        until the write loop sends it."""
        try:
            answer = await request.answer()
        finally:
            if not dispatched.done():  # the read loop may have stopped waiting (shutdown)
                dispatched.set_result(None)
        response = await answer if isinstance(answer, Awaitable) else answer
        self.unsent_bytes += response_size(response)
        return response

    def _lost(self, exc: OSError) -> None:
        """The peer reset, closed or garbled the connection under us, or cannot be reached:
        one INFO line for it."""
        if not self.lost:
            self.lost = True
            _log_lost(self.info.peer, self.info.listener, exc)

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
                if not exc.logged:
                    log.warning("closing connection from %s on %s: %s", self.info.peer,
                                self.info.listener, exc)
                if exc.final is not None:
                    self.writer.write(exc.final)
                broken = True
            except OSError as exc:
                if not (_peer_gone(exc) or self.writer.transport.is_closing()):
                    log.exception("request from %s failed; closing the connection",
                                  self.info.peer)
                else:
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
        self._handshakes: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        """Bind and listen; return the bound port (useful with port 0)."""
        loop = asyncio.get_running_loop()
        context = self.ssl_context
        factory: Callable[[], asyncio.BaseProtocol] = (
            self._stream if context is None else lambda: TlsHandshake(
                context, self.name, self._stream, self.on_reject, self._handshakes))
        self._server = await loop.create_server(factory, self.host or None, self.port)
        sockets = self._server.sockets
        self.port = int(sockets[0].getsockname()[1])
        return self.port

    def _stream(self) -> asyncio.StreamReaderProtocol:
        """The protocol of a connection ready for Kafka frames (after TLS, if any)."""
        return asyncio.StreamReaderProtocol(_Reader(SMALL_FRAME_BYTES), self._accept)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = peer_address(writer.transport)
        if not isinstance(reader, _Reader):  # the connection was lost before it was made
            writer.close()
            return
        if len(self._connections) >= self.limits.max_connections:
            log.warning("refusing connection from %s on %s: %d connections is the limit",
                        peer, self.name, self.limits.max_connections)
            if self.on_reject is not None:
                self.on_reject(peer, "connection limit reached")
            writer.close()
            return
        tls = writer.get_extra_info("ssl_object")
        if writer.transport.is_closing() or (tls is not None and not _usable(tls)):
            # lost already (garbage right after the handshake): say why, once
            lost: OSError | None = None
            try:
                await reader.read()  # until the transport tells the reader why it closed
            except OSError as exc:
                lost = exc
            _log_lost(peer, self.name, lost)
            writer.close()
            return
        info = ConnectionInfo(self.name, peer, tls)
        try:
            handler = self.factory(info)
        except ConnectionRefused:
            writer.close()
            return
        connection = _Connection(reader, writer, handler, info, self.limits,
                                 self.budget, self.on_reject)
        self._connections.add(connection)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await connection.serve()
        except asyncio.CancelledError:
            pass  # stopped after the grace period (a TLS peer that ignores close_notify)
        finally:
            self._connections.discard(connection)
            if task is not None:
                self._tasks.discard(task)

    async def stop(self, grace_seconds: float = 10.0) -> None:
        """Stop accepting, answer the requests already read, then close every connection."""
        if self._server is not None:
            self._server.close()
        for handshake in list(self._handshakes):
            handshake.cancel()
        for connection in list(self._connections):
            connection.stop_reading()
        if self._tasks:
            _done, late = await asyncio.wait(set(self._tasks), timeout=grace_seconds)
            for task in late:
                task.cancel()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
