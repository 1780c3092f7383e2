"""The protocol of a connection ready for Kafka frames: a buffered protocol, so that the
transport reads into the buffers its :class:`ConnectionReader` lends (a large frame's own
buffer), with an ``asyncio.StreamWriter`` for the connection's answers.

It does what ``asyncio.StreamReaderProtocol`` does for a server (feeds the reader, hands
reader and writer to the connection's coroutine, flow control for ``drain``, EOF and
connection loss), but is no ``asyncio.Protocol``: uvloop reads into a protocol's buffer
only then (for one, it copies every read into a new ``bytes``). Its TLS transport serves
such a protocol too, decrypting into the lent buffer.
"""

from __future__ import annotations

import asyncio
import copy
from collections import deque
from collections.abc import Callable, Coroutine
from typing import cast

from listeners.reader import ConnectionReader

Connected = Callable[[ConnectionReader, asyncio.StreamWriter], Coroutine[object, object, None]]


class FrameProtocol(asyncio.BufferedProtocol):
    """One connection's protocol: ``connected(reader, writer)`` runs as a task once the
    connection is made."""

    def __init__(self, reader: ConnectionReader, connected: Connected) -> None:
        self.reader = reader
        self.connected = connected
        self.task: asyncio.Task[None] | None = None
        self.over_tls = False
        self._paused = False
        self._drain_waiters: deque[asyncio.Future[None]] = deque()
        self._lost = False
        self._closed: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        loop = asyncio.get_running_loop()
        self._closed = loop.create_future()
        self.over_tls = transport.get_extra_info("sslcontext") is not None
        self.reader.set_transport(transport)
        # no reader for the writer: its drain raises the loss from _drain_helper instead
        writer = asyncio.StreamWriter(cast(asyncio.WriteTransport, transport), self, None, loop)
        self.task = loop.create_task(self.connected(self.reader, writer))
        self.task.add_done_callback(self._served)

    def _served(self, _task: asyncio.Task[None]) -> None:
        self.task = None

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.reader.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self.reader.buffer_updated(nbytes)

    def eof_received(self) -> bool:
        self.reader.feed_eof()
        # keep a plain TCP connection open for the answers still due (a TLS one cannot
        # be half-closed)
        return not self.over_tls

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is None:
            self.reader.feed_eof()
        else:
            self.reader.set_exception(exc)
        self.reader.forget_transport()
        self._lost = True
        while self._drain_waiters:
            waiter = self._drain_waiters.popleft()
            if not waiter.done():
                if exc is None:
                    waiter.set_result(None)
                else:  # a copy each: a raise adds its frames to the error's traceback
                    waiter.set_exception(copy.copy(exc))
        if self._closed is not None and not self._closed.done():
            # closed either way: the error, kept here, would hold the frames it was raised
            # through (the reader reports it)
            self._closed.set_result(None)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        while self._drain_waiters:
            waiter = self._drain_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    async def _drain_helper(self) -> None:
        """What ``StreamWriter.drain`` awaits: until the transport takes writes again."""
        if self._lost:
            raise ConnectionResetError("Connection lost")
        if not self._paused:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._drain_waiters.append(waiter)
        await waiter

    def _get_close_waiter(self, _stream: asyncio.StreamWriter) -> asyncio.Future[None]:
        """What ``StreamWriter.wait_closed`` awaits."""
        assert self._closed is not None
        return self._closed
