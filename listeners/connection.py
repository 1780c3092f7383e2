"""One client connection of a listener: a read loop that runs each request's dispatch
stage itself, and an ordered write loop for the responses that cannot leave at once, with
the order rule, the memory bounds, the idle timeout and muting described in
:mod:`listeners.server`.

A request costs no task of its own unless it has a waiting stage: its dispatch stage runs
in the read loop (which reads nothing more until it has returned, the order rule), and
its response, when nothing is queued before it and the transport holds nothing, is
written from there too. The idle timeout is one timer per connection that looks at the
read loop's wait four times per timeout, not a timer armed and cancelled per request."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import inspect
import logging
import ssl
import struct
import termios
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TypeVar, cast

from listeners.admission import LoginGate
from listeners.frames import (
    SMALL_FRAME_BYTES,
    ConnectionHandler,
    ConnectionInfo,
    FrameError,
    Limits,
    ReadBudget,
    Request,
    Response,
    response_size,
)
from listeners.handshake import os_reason
from listeners.pacing import TurnPacer
from listeners.reader import ConnectionReader
from listeners.sendfile import send_now, write_parts

# the logger name operators know from the broker's log (this code was listeners.server)
log = logging.getLogger("listeners.server")
_SIZE = struct.Struct(">i")
TLS_HANDSHAKE_PREFIX = b"\x16\x03"
"""How a TLS record of a handshake (a ClientHello) starts: content type 22, version 3.x;
as a frame size more than 369 million bytes, beyond any frame limit."""
_T = TypeVar("_T")
_READ_LIMIT = 1 << 20
"""The read buffer of a logged-in connection (the StreamReader pauses at twice this)."""
TURN_SECONDS = 0.001
"""How long a connection's requests may run in one turn of the event loop while its client
pipelines them (the next frame already buffered, so reading it would not wait): then the
read loop lets the loop run the other connections first. Kafka mutes a channel while its
request is handled (one request per connection per poll); a turn per request here cost a
tenth of the throughput of a client pipelining ApiVersions, a few percent of produces."""
_BUDGET_CHUNK = 64 * 1024
_PEER_ERRNOS = frozenset({errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH,
                          errno.ENETDOWN, errno.EHOSTDOWN, errno.ECONNREFUSED})


async def _fail(exc: Exception) -> None:
    try:
        raise exc
    finally:
        del exc  # no reference cycle (the exception's traceback holds this frame)


def _failed(loop: asyncio.AbstractEventLoop, exc: Exception
            ) -> asyncio.Future[Response | None]:
    """A response that failed with ``exc``, for the write loop to report in order (made
    here so that no frame on ``exc``'s traceback holds the future: no reference cycle)."""
    failed: asyncio.Future[Response | None] = loop.create_future()
    failed.set_exception(exc)
    return failed


def _peer_gone(exc: OSError) -> bool:
    """Whether an error of a socket read or write means the peer is unreachable or gone."""
    return isinstance(exc, ConnectionError | ssl.SSLError) or exc.errno in _PEER_ERRNOS


def tls_usable(tls: ssl.SSLObject) -> bool:
    """Whether a TLS session is still up (a fatal error undoes its handshake)."""
    try:
        tls.getpeercert()
    except ValueError:
        return False
    return True


def log_lost(peer: str, listener: str, exc: OSError | None) -> None:
    """One INFO line for a connection the peer reset, closed or garbled."""
    log.info("connection from %s on %s lost: %s", peer, listener,
             "closed" if exc is None else os_reason(exc))


class Connection:
    """One client connection: a read loop feeding an ordered write loop."""

    def __init__(self, reader: ConnectionReader, writer: asyncio.StreamWriter,
                 handler: ConnectionHandler, info: ConnectionInfo, limits: Limits,
                 budget: ReadBudget, on_reject: Callable[[str, str], None] | None,
                 gate: LoginGate | None = None, closing: TurnPacer | None = None) -> None:
        self.reader = reader
        self.writer = writer
        self.handler = handler
        self.info = info
        self.limits = limits
        self.budget = budget
        self.on_reject = on_reject
        self.gate = gate
        self.closing = closing
        """Taken a turn of before tearing down (:mod:`listeners.pacing`)."""
        self.gated_requests = 0  # requests served before login (through the gate)
        self.pending: asyncio.Queue[asyncio.Future[Response | None] | None] = asyncio.Queue(
            maxsize=limits.max_queued_requests)
        self.queued = 0  # responses handed to the write loop and not yet done with
        self.dispatching = False  # the read loop is in a request's dispatch stage or
        # handing its response to the write loop (a full queue: it waits for room)
        self.stop_requested = False  # stop reading once that request is handed over
        self.broken = False  # the write loop gave up on the connection
        self.reading: asyncio.Task[object] | None = None
        self.write_task: asyncio.Task[None] | None = None
        """The write loop, started with the first response handed to it (most
        connections never need one: a login's answers all leave from the read loop)."""
        self.unsent_bytes = 0  # of responses finished and not yet written
        self.running_bytes = 0  # the response bounds of requests started and not finished
        self.room = asyncio.Event()  # set when either drops
        self.writing = False  # a response is being written (the client has it to read)
        self.lost = False
        self.ending = False  # the read loop is over: the write loop ends with the queue
        # sendfile needs the raw socket: plain TCP only (TLS encrypts in user space)
        self.socket = None if info.tls is not None else writer.get_extra_info("socket")
        # what the kernel holds of what was sent: a client reading it is not idle
        sock = writer.get_extra_info("socket")
        self.kernel_queue: int | None = sock.fileno() if hasattr(termios, "TIOCOUTQ") \
            and sock is not None else None
        # the idle timeout's watch (_idle_tick): the read loop's wait, if it is in one
        self._idle_timer: asyncio.TimerHandle | None = None
        self._waiting = False
        self._idle_hit = False
        self._quiet_ticks = -1
        self._last_progress: tuple[int, int, int, int] | None = None

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        self.reading = asyncio.current_task()
        if self.limits.idle_timeout_ms > 0:
            self._idle_timer = loop.call_later(self._quarter(), self._idle_tick)
        try:
            await self._read_loop()
        except asyncio.CancelledError:
            pass  # stop reading: shutdown, or the write side closed the connection
        finally:
            if self._idle_timer is not None:
                self._idle_timer.cancel()
                self._idle_timer = None
            if self.closing is not None:
                with contextlib.suppress(asyncio.CancelledError):  # torn down all the same
                    await self.closing.turn()
            self.ending = True
            writing = self.write_task
            if writing is not None:
                # a full queue: the write loop is busy, and ends once the queue is empty
                # (awaiting room could hang)
                if not self.pending.full():
                    self.pending.put_nowait(None)
                with contextlib.suppress(asyncio.CancelledError):
                    await writing
            self.handler.closed()
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()

    def stop_reading(self) -> None:
        """Stop taking new requests; those already read are still answered (a dispatch
        stage under way is not interrupted, nor the hand-over of its response to a full
        queue: reading stops once the response is queued)."""
        if self.dispatching:
            self.stop_requested = True
        elif self.reading is not None and not self.reading.done():
            self.reading.cancel()

    async def _read_frame(self) -> tuple[memoryview, int] | None:
        """The next frame and the bytes it holds of the read budget; None to close."""
        idle = self.limits.idle_timeout_ms / 1000 if self.limits.idle_timeout_ms > 0 else None
        try:
            if self.reader.buffered >= 4:  # pipelined: no wait, so no idle timer either
                prefix = await self.reader.readexactly(4)
            else:
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
            if self.info.tls is None and prefix[:2] == TLS_HANDSHAKE_PREFIX:
                log.warning("closing connection from %s on %s: TLS on a listener without TLS "
                            "(the client sent a TLS handshake record)",
                            self.info.peer, self.info.listener)
            else:
                log.warning("closing connection from %s on %s: frame size %d outside "
                            "1..%d%s", self.info.peer, self.info.listener, size, most,
                            "" if limit is None else " (before authentication)")
            if limit is not None:
                self._reject(f"frame of {size} bytes before authentication (limit {most})")
            return None
        if limit is None or size <= SMALL_FRAME_BYTES:
            try:
                if self.reader.buffered >= size:
                    frame = await self.reader.readexactly(size)
                elif limit is None:  # the rest must keep coming: no byte for the idle timeout
                    frame = await self._until_idle(lambda: self.reader.readexactly(size))
                else:  # before login a frame must arrive within the idle timeout
                    async with asyncio.timeout(idle):  # (wait_for made a task per frame)
                        frame = await self.reader.readexactly(size)
            except asyncio.IncompleteReadError as exc:
                self._closed_inside(len(exc.partial), size)
                return None
            except TimeoutError:
                self._incomplete(size, limit is not None)
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

    def _incomplete(self, size: int, before_login: bool = True) -> None:
        log.info("closing connection from %s on %s: a frame of %d bytes%s was not complete "
                 "within the idle timeout", self.info.peer, self.info.listener, size,
                 " before authentication" if before_login else "")

    def _reject(self, reason: str) -> None:
        if self.on_reject is not None:
            self.on_reject(self.info.peer, reason)

    async def _read_loop(self) -> None:
        last: asyncio.Future[Response | None] | None = None
        run_started: float | None = None  # when the loop last gave this connection a turn
        while True:
            if last is not None and not last.done() and self.handler.frame_limit is not None:
                # not logged in: one whole request at a time, with nothing read meanwhile
                # (a failed login waits, a token may need a JWKS), so that the limit of the
                # next frame is the one in force after this request (a login)
                await self._without_reading(asyncio.wait([last]))
            await self._while_muted()
            logged_in = self.handler.frame_limit is None
            self.reader.set_limit(_READ_LIMIT if logged_in else SMALL_FRAME_BYTES,
                                  framed=logged_in)
            try:
                read = await self._read_frame()
            except OSError as exc:
                self._lost(exc)
                return
            if read is None:
                return
            if run_started is None:
                run_started = time.monotonic()
            frame, held = read
            permit = False
            try:
                ready = False
                try:  # the frame's read budget is given back whatever ends the wait
                    await self._while_muted()  # a throttle known only once the frame was read
                    if self._gated():  # a logged-in connection's requests never await here
                        await self._enter_gate()
                        permit = True
                    request = self._prepare(frame)
                    del frame
                    fits = False
                    if not self._fits(request.response_bound) and permit:
                        self._leave_gate()  # waiting for the client to read: no permit
                        permit = False
                        if await self._room_for(request.response_bound):
                            await self._enter_gate()
                            permit = True
                            fits = True
                    elif await self._room_for(request.response_bound):
                        fits = True
                    if fits and permit:  # before login: a turn of the loop first, so that a
                        # login storm's requests interleave with logged-in clients' I/O
                        # instead of running back to back within one turn
                        await asyncio.sleep(0)
                    ready = fits
                finally:
                    if not ready:
                        self.budget.give_back(held)
                if not ready:
                    return
                # the order rule: nothing more is read until this request's dispatch stage
                # has returned; its waiting stage may go on
                last = await self._dispatch(request, held)
                if last is not None:
                    self.queued += 1
                    await self._hand_over(last)
                if self.stop_requested:
                    return
            finally:
                if permit:
                    self._leave_gate()
            if self.reader.buffered < 4:
                run_started = None  # the next read waits: the other connections get a turn
            elif time.monotonic() - run_started >= TURN_SECONDS:
                await asyncio.sleep(0)  # pipelined: let the other connections run first
                run_started = None

    async def _hand_over(self, response: asyncio.Future[Response | None]) -> None:
        """Queue a response for the write loop, waiting while the queue is full; a stop
        meanwhile waits for it too (cancelled here, the request, whose dispatch stage has
        run, would go unanswered while the responses before it are sent)."""
        if self.write_task is None:
            self.write_task = asyncio.get_running_loop().create_task(self._write_loop())
        if self.pending.full():
            self.dispatching = True
            try:
                await self.pending.put(response)
            finally:
                self.dispatching = False
        else:
            self.pending.put_nowait(response)

    def _gated(self) -> bool:
        """Whether the next request needs a permit of the login gate
        (:mod:`listeners.admission`): the connection has not logged in."""
        return self.gate is not None and self.handler.frame_limit is not None

    async def _enter_gate(self) -> None:
        """Take a permit of the login gate for a request (:meth:`_gated`)."""
        assert self.gate is not None
        await self.gate.enter(self.gated_requests)
        self.gated_requests += 1

    def _leave_gate(self) -> None:
        assert self.gate is not None
        self.gate.leave()

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

    async def _dispatch(self, request: Request, held: int
                        ) -> asyncio.Future[Response | None] | None:
        """Run a request's dispatch stage here, its response bound counted until the request
        has finished; its waiting stage, if it has one, in a task of its own. The response
        for the write loop, or None when there is none or it has been written already."""
        bound = max(request.response_bound, 0)
        self.running_bytes += bound
        loop = asyncio.get_running_loop()
        self.dispatching = True
        try:
            answer = await request.answer()
        except Exception as exc:  # the write loop closes the connection in order
            self._finished(held, bound)
            self.stop_requested = True  # and nothing behind it is read or run
            return _failed(loop, exc)
        except BaseException:
            self._finished(held, bound)
            raise
        finally:
            self.dispatching = False
        if isinstance(answer, Awaitable):
            task = loop.create_task(self._wait(answer))

            def waited(task: asyncio.Task[Response | None]) -> None:
                self._finished(held, bound)
                if task.cancelled() and inspect.iscoroutine(answer) \
                        and inspect.getcoroutinestate(answer) == inspect.CORO_CREATED:
                    answer.close()  # cancelled before it began (the connection broke)

            task.add_done_callback(waited)
            return task
        self._finished(held, bound)
        if answer is None:
            return None
        transport = self.writer.transport
        if not (self.queued or self.broken or transport.is_closing()
                or transport.get_write_buffer_size()):  # else the write loop, which drains
            try:
                if send_now(self.writer, answer, self.socket):
                    return None
            except OSError as exc:  # the write loop says so, in order
                self.stop_requested = True
                return _failed(loop, exc)
        self.unsent_bytes += response_size(answer)
        done: asyncio.Future[Response | None] = loop.create_future()
        done.set_result(answer)
        return done

    def _finished(self, held: int, bound: int) -> None:
        """A request is over: its frame's read budget and its response bound are free."""
        self.budget.give_back(held)
        self.running_bytes -= bound
        self.room.set()

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
        """``await wait()`` in the read loop; TimeoutError once the connection has been
        idle for the idle timeout: nothing arrived and the client took none of the bytes
        sent to it (:meth:`_idle_tick` looks four times per timeout, so a client reading a
        large response slowly stays)."""
        if self._idle_timer is None or self.reading is None:
            return await wait()
        self._waiting = True
        self._quiet_ticks = -1
        try:
            return await wait()
        except asyncio.CancelledError:
            if not self._idle_hit:
                raise
            self._idle_hit = False
            if self.reading.uncancel() > 0:  # cancelled for another reason as well
                raise
            raise TimeoutError from None
        finally:
            self._waiting = False

    def _quarter(self) -> float:
        return self.limits.idle_timeout_ms / 4000

    def _idle_tick(self) -> None:
        """Every quarter of the idle timeout: while the read loop waits, the client's
        progress is looked at; unchanged at four looks in a row after the first look of
        this wait (a connection idle from the start is closed up to a quarter after the
        timeout, never earlier), the wait is ended with a TimeoutError."""
        self._idle_timer = asyncio.get_running_loop().call_later(self._quarter(),
                                                                 self._idle_tick)
        if not self._waiting or self.reading is None:
            return
        progress = self._progress()
        if self._quiet_ticks < 0 or progress != self._last_progress:
            self._last_progress = progress
            self._quiet_ticks = 0
            return
        self._quiet_ticks += 1
        if self._quiet_ticks >= 4 and not self._idle_hit:
            self._idle_hit = True
            self.reading.cancel()

    def _progress(self) -> tuple[int, int, int, int]:
        """Changes whenever the client sends bytes (a large frame arriving slowly) or takes
        response bytes: the unsent bytes of finished responses drop, the transport's buffer
        does, or the socket's (Linux)."""
        queued = 0
        if self.kernel_queue is not None:
            with contextlib.suppress(OSError):
                queued = struct.unpack("i", fcntl.ioctl(self.kernel_queue, termios.TIOCOUTQ,
                                                        b"\0\0\0\0"))[0]
        return (self.reader.received, self.unsent_bytes,
                self.writer.transport.get_write_buffer_size(), queued)

    async def _wait(self, answer: Awaitable[Response | None]) -> Response | None:
        """A request's waiting stage; its response counts as unsent until the write loop
        sends it."""
        response = await answer
        self.unsent_bytes += response_size(response)
        return response

    def _lost(self, exc: OSError) -> None:
        """The peer reset, closed or garbled the connection under us, or cannot be reached:
        one INFO line for it."""
        if not self.lost:
            self.lost = True
            log_lost(self.info.peer, self.info.listener, exc)

    def _sent(self, size: int) -> None:
        self.unsent_bytes -= size
        self.room.set()

    def abort(self) -> None:
        """Drop the connection at once, unsent responses and all (shutdown, once the grace
        period is over: a client that reads nothing would keep it open)."""
        self.writer.transport.abort()

    @property
    def logged_in(self) -> bool:
        """Whether the client has logged in, or its listener needs no login."""
        return self.handler.frame_limit is None

    def drop(self) -> None:
        """Drop the connection and end its loops at once (the write loop's end cancels the
        waiting stage it awaits): a shutdown owes a client that has not logged in nothing,
        and a failed login waiting out ``failedAuthenticationDelayMs`` would otherwise
        hold the stop for the grace period."""
        self.abort()
        for task in (self.write_task, self.reading):
            if task is not None:
                task.cancel()

    async def _write_loop(self) -> None:
        while True:
            if self.ending and self.pending.empty():
                return
            task = await self.pending.get()
            if task is None:
                return
            if self.broken:
                self.queued -= 1
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
                                self.info.listener, str(exc))  # not the error: no frames held
                if exc.final is not None:
                    self.writer.write(exc.final)
                self.broken = True
            except OSError as exc:
                if not (_peer_gone(exc) or self.writer.transport.is_closing()):
                    log.exception("request from %s failed; closing the connection",
                                  self.info.peer)
                else:
                    self._lost(exc)
                self.broken = True
            except asyncio.CancelledError:
                self.broken = True
                current = asyncio.current_task()
                if current is not None and current.cancelling():  # the loop itself: abort
                    self.writer.transport.abort()
                    raise
            except Exception:
                log.exception("request from %s failed; closing the connection", self.info.peer)
                self.broken = True
            self.writing = False
            self.queued -= 1
            self._sent(size)
            if self.broken:
                self.stop_reading()
                self.writer.close()
