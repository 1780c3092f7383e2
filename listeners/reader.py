"""A connection's read buffer: the chunks the transport delivered, taken out frame by frame.

asyncio's ``StreamReader`` keeps one ``bytearray``: each delivered chunk is appended to it
and each ``readexactly`` copies the bytes out twice and deletes them from its front, which
makes CPython move (or reallocate) what stays buffered. With a client pipelining produce
requests of ~100 KiB, the buffer holds several of them, and those copies were a quarter
of the event loop's CPU. :class:`ConnectionReader` keeps the chunks as delivered and
copies each byte once (into its frame), or not at all (a frame that is one whole chunk).

The transport reads into buffers the reader lends it (:meth:`ConnectionReader.get_buffer`,
through :class:`listeners.protocol.FrameProtocol`, a buffered protocol): while the read
loop waits for a frame of at least ``DIRECT_BYTES``, that is the frame itself, so the
kernel's copy is the only one its bytes get (uvloop's copy into a ``bytes`` and the join
of those chunks were a third of the CPU of a 100-byte-record produce); otherwise a buffer
shared by every connection of the loop (a read fills it and its bytes are taken out at
once), so an idle connection holds no read buffer.

It reads like asyncio's ``StreamReader`` (``feed_data`` works as its, the transport is
paused beyond twice the limit and resumed at the limit, EOF and errors are as asyncio's),
but only the reads the listener uses are served: ``readexactly``, ``read`` and ``at_eof``;
a large frame comes as the ``bytearray`` it was read into.
"""

from __future__ import annotations

import asyncio
import copy
import mmap
import struct
from collections import deque
from collections.abc import Iterable
from typing import SupportsIndex, cast

DIRECT_BYTES = 32 * 1024
"""A frame at least this large that has not fully arrived is read straight into its own
buffer; smaller ones are cut from the chunks read into the shared buffer."""
AHEAD = 16
"""A frame's buffer is an ordinary ``bytearray`` (zero-filled, at once resident, but
reused heap memory: no page faults) when the frame is at most this many times what has
arrived of it (a 1 MB produce once the first 64 KiB read is in); a larger one is an
anonymous mapping, whose pages are taken as bytes arrive (a size prefix alone costs
nothing, but every page faults once: a 1 KiB-record produce cost twice the CPU that way).
So what a connection holds up front is at most ``AHEAD`` times what it has sent."""
SHARED_BYTES = 64 * 1024
"""The buffer reads go to when no frame is being read into its own: one per process, used
by the event loop's thread only, emptied by each read (get_buffer, the read and
buffer_updated happen in one callback)."""
_SIZE = struct.Struct(">i")
_shared = bytearray(SHARED_BYTES)
_shared_view = memoryview(_shared)


class ConnectionReader:
    """A stream reader keeping the delivered chunks, whose buffer limit changes at login."""

    def __init__(self, limit: int) -> None:
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
        self._frame: memoryview | None = None
        """The frame being read straight into its own buffer (:meth:`_read_direct`)."""
        self._filled = 0
        """The bytes of that frame received so far."""
        self.received = 0
        """Bytes received in all (the connection's idle timeout watches it)."""
        self._lent_frame = False
        """The last :meth:`get_buffer` lent the frame's buffer (not the shared one)."""
        self._framed = False

    @property
    def buffered(self) -> int:
        """The bytes received and not read yet."""
        return self._size

    def set_limit(self, limit: int, *, framed: bool = False) -> None:
        """Pause the transport once more than twice ``limit`` bytes are buffered; with
        ``framed`` (every read takes a whole size prefix or a whole frame, so what is
        buffered starts with a prefix), also once what is buffered starts a frame of at
        least ``DIRECT_BYTES`` not complete yet: the rest of it is read straight into its
        buffer when the frame is asked for (else the transport, reading while the
        frame before it is handled, would have read it all into the shared buffer)."""
        self._limit = limit
        self._framed = framed

    def set_transport(self, transport: asyncio.BaseTransport) -> None:
        assert self._transport is None, "Transport already set"
        self._transport = cast(asyncio.ReadTransport, transport)  # uvloop's is no subclass

    def _failure(self) -> Exception:
        """The stored error, as a copy without a traceback: each raise of the stored one
        would add the frames it passes through to its traceback, and those frames hold
        this reader (a reference cycle for every connection reset)."""
        assert self._exception is not None
        return copy.copy(self._exception)

    def forget_transport(self) -> None:
        """The connection is gone: drop the transport (uvloop's TLS protocol keeps the
        buffered protocol's bound methods, a reference cycle through it)."""
        self._transport = None
        self._paused = False

    def set_exception(self, exc: Exception) -> None:
        self._exception = copy.copy(exc)  # (see _failure) not the transport's own
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.cancelled():
            waiter.set_exception(self._failure())

    def _wakeup_waiter(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.cancelled():
            waiter.set_result(None)

    def feed_eof(self) -> None:
        self._eof = True
        self._wakeup_waiter()

    def at_eof(self) -> bool:
        return self._eof and not self._size

    def get_buffer(self, sizehint: int) -> memoryview:
        """Where the transport is to read to: the rest of the frame being read, or the
        shared buffer."""
        del sizehint  # a frame takes what is left of it; the shared buffer is large
        frame = self._frame
        self._lent_frame = frame is not None and self._filled < len(frame)
        if self._lent_frame:
            assert frame is not None
            return frame[self._filled:]
        return _shared_view

    def buffer_updated(self, nbytes: int) -> None:
        """The transport read ``nbytes`` into the buffer :meth:`get_buffer` gave."""
        if self._lent_frame:
            assert self._frame is not None
            self.received += nbytes
            self._filled += nbytes
            if self._filled == len(self._frame):
                self._wakeup_waiter()
            return
        self.feed_data(_shared_view[:nbytes])

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        assert not self._eof, "feed_data after feed_eof"
        # kept as delivered; a transport that lends its own buffer gets it copied
        chunk = data if type(data) is bytes else bytes(data)
        if not chunk:
            return
        self.received += len(chunk)
        if self._frame is not None:  # the frame read into its buffer comes first
            chunk = self._fill(chunk)
            if not chunk:
                return
        self._chunks.append(chunk)
        self._size += len(chunk)
        self._wakeup_waiter()
        if self._transport is not None and not self._paused \
                and (self._size > 2 * self._limit or (self._framed and self._large_next())):
            try:
                self._transport.pause_reading()
            except NotImplementedError:
                # a transport that cannot pause: the buffer is bounded by the reader alone
                self._transport = None
            else:
                self._paused = True

    def _large_next(self) -> bool:
        """Whether what is buffered starts with the size prefix of a frame of at least
        ``DIRECT_BYTES`` that has not fully arrived."""
        first, start = self._chunks[0], self._start
        if len(first) - start < 4:
            return False  # a prefix split across reads: left to the limit
        size: int = _SIZE.unpack_from(first, start)[0]
        return size >= DIRECT_BYTES and self._size < size + 4

    def _resume(self) -> None:
        self._paused = False
        if self._transport is not None:
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
        self._waiter = asyncio.get_running_loop().create_future()
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

    def _fill(self, chunk: bytes) -> bytes:
        """Copy what a chunk holds of the frame being read into its buffer (a chunk fed by
        hand, or read after the frame was complete); the rest of the chunk."""
        assert self._frame is not None
        size = min(len(chunk), len(self._frame) - self._filled)
        if size:
            self._frame[self._filled:self._filled + size] = chunk[:size]
            self._filled += size
            if self._filled == len(self._frame):
                self._wakeup_waiter()
        return chunk[size:] if size else chunk

    async def _read_direct(self, n: int) -> memoryview:
        """A frame of ``n`` bytes, more than are buffered: what is buffered is copied into
        its buffer (see :data:`AHEAD`), the rest is read straight into it."""
        filled = self._size
        view = memoryview(bytearray(n) if n <= AHEAD * filled else mmap.mmap(-1, n))
        view[:filled] = self._take(filled) if filled else b""
        self._frame, self._filled = view, filled
        try:
            while self._filled < n:
                if self._exception is not None:
                    raise self._failure()
                if self._eof:
                    raise asyncio.IncompleteReadError(bytes(view[:self._filled]), n)
                await self._wait_for_data("readexactly")
        except BaseException:
            if self._filled and not self._eof:  # cancelled: what arrived stays buffered
                self._chunks.appendleft(bytes(view[:self._filled]))
                self._size += self._filled
            raise
        finally:
            self._frame = None
            self._filled = 0
            self._lent_frame = False
        self._maybe_resume_transport()
        return view

    async def readexactly(self, n: int) -> bytes | memoryview:
        """Exactly ``n`` bytes; IncompleteReadError with what arrived if the stream ends
        first."""
        if n < 0:
            raise ValueError("readexactly size can not be less than zero")
        if self._exception is not None:
            raise self._failure()
        if n == 0:
            return b""
        if self._size < n and n >= DIRECT_BYTES and not self._eof:
            return await self._read_direct(n)
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
            raise self._failure()
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
