"""A connection's read buffer: the chunks the transport delivered, taken out frame by frame.

asyncio's ``StreamReader`` keeps one ``bytearray``: each delivered chunk is appended to it
and each ``readexactly`` copies the bytes out twice and deletes them from its front, which
makes CPython move (or reallocate) what stays buffered. With a client pipelining produce
requests of ~100 KiB, the buffer holds several of them, and those copies were a quarter
of the event loop's CPU. :class:`ConnectionReader` keeps the chunks as delivered and
copies each byte once (into its frame), or not at all (a frame that is one whole chunk).

It is still a ``StreamReader`` (``StreamReaderProtocol`` feeds it, the transport is paused
beyond twice the limit and resumed at the limit, EOF and errors are as asyncio's), but only
the reads the listener uses are served: ``readexactly``, ``read`` and ``at_eof``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable
from typing import SupportsIndex, cast


class ConnectionReader(asyncio.StreamReader):
    """A StreamReader keeping the delivered chunks, whose buffer limit changes at login.

    Every method that touches the buffer or the waiter is its own (asyncio's privates
    are not relied on); ``readline`` and ``readuntil`` are not served."""

    _loop: asyncio.AbstractEventLoop  # set by StreamReader's constructor

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self._limit = limit
        self._chunks: deque[bytes] = deque()
        self._start = 0
        """Where the first chunk's unread bytes begin."""
        self._size = 0
        """The unread bytes buffered."""
        self._eof = False
        self._exception: Exception | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._transport: asyncio.ReadTransport | None = None
        self._paused = False

    @property
    def buffered(self) -> int:
        """The bytes received and not read yet."""
        return self._size

    def set_limit(self, limit: int) -> None:
        """Pause the transport once more than twice ``limit`` bytes are buffered."""
        self._limit = limit

    def set_transport(self, transport: asyncio.BaseTransport) -> None:
        assert self._transport is None, "Transport already set"
        self._transport = cast(asyncio.ReadTransport, transport)  # uvloop's is no subclass

    def exception(self) -> Exception | None:
        return self._exception

    def set_exception(self, exc: Exception) -> None:
        self._exception = exc
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.cancelled():
            waiter.set_exception(exc)

    def _wakeup_waiter(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.cancelled():
            waiter.set_result(None)

    def feed_eof(self) -> None:
        self._eof = True
        self._wakeup_waiter()

    def at_eof(self) -> bool:
        return self._eof and not self._size

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        assert not self._eof, "feed_data after feed_eof"
        # kept as delivered; a transport that lends its own buffer gets it copied
        chunk = data if type(data) is bytes else bytes(data)
        if not chunk:
            return
        self._chunks.append(chunk)
        self._size += len(chunk)
        self._wakeup_waiter()
        if self._transport is not None and not self._paused \
                and self._size > 2 * self._limit:
            try:
                self._transport.pause_reading()
            except NotImplementedError:
                # a transport that cannot pause: the buffer is bounded by the reader alone
                self._transport = None
            else:
                self._paused = True

    def _resume(self) -> None:
        self._paused = False
        assert self._transport is not None
        self._transport.resume_reading()

    def _maybe_resume_transport(self) -> None:
        if self._paused and self._size <= self._limit:
            self._resume()

    async def _wait_for_data(self, func_name: str) -> None:
        """Until ``feed_data``, ``feed_eof`` or ``set_exception`` (a paused transport is
        resumed first: a frame larger than the limit must still arrive)."""
        if self._waiter is not None:
            raise RuntimeError(f"{func_name}() called while another coroutine is "
                               "already waiting for incoming data")
        assert not self._eof, "_wait_for_data after EOF"
        if self._paused:
            self._resume()
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _take(self, n: int) -> bytes:
        """The next ``n`` (at most :attr:`buffered`) bytes, removed from the buffer."""
        chunks, start = self._chunks, self._start
        self._size -= n
        first = chunks[0]
        end = start + n
        if end <= len(first):
            if end == len(first):
                chunks.popleft()
                self._start = 0
                return first if start == 0 else first[start:]
            self._start = end
            return first[start:end]
        parts = []  # joined at once: one copy, and no zero-filled buffer first
        left = n
        while left:
            chunk = chunks[0]
            size = min(len(chunk) - start, left)
            parts.append(memoryview(chunk)[start:start + size])
            left -= size
            if start + size == len(chunk):
                chunks.popleft()
                start = 0
            else:
                start += size
        self._start = start
        return b"".join(parts)

    async def readexactly(self, n: int) -> bytes:
        """Exactly ``n`` bytes; IncompleteReadError with what arrived if the stream ends
        first."""
        if n < 0:
            raise ValueError("readexactly size can not be less than zero")
        if self._exception is not None:
            raise self._exception
        if n == 0:
            return b""
        while self._size < n:
            if self._eof:
                incomplete = self._take(self._size) if self._size else b""
                raise asyncio.IncompleteReadError(incomplete, n)
            await self._wait_for_data("readexactly")
        data = self._take(n)
        self._maybe_resume_transport()
        return data

    async def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes once some are buffered (b"" at EOF); all until EOF when
        ``n`` is negative."""
        if self._exception is not None:
            raise self._exception
        if n == 0:
            return b""
        if n < 0:
            while not self._eof:
                await self._wait_for_data("read")
            n = self._size
        elif not self._size and not self._eof:
            await self._wait_for_data("read")
        data = self._take(min(n, self._size)) if self._size else b""
        self._maybe_resume_transport()
        return data
