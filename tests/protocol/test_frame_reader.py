"""The listener's read buffer (``listeners.reader``): frames cut from chunks of any size
come out byte for byte, whether fed or read into the buffers the reader lends (a large
frame's own: no copy but the transport's); EOF and errors surface as asyncio's
StreamReader gives them, and the transport is paused beyond twice the limit and resumed
once read down to it."""

from __future__ import annotations

import asyncio
import mmap
import random

import pytest

from listeners.reader import AHEAD, DIRECT_BYTES, ConnectionReader


class _Transport(asyncio.ReadTransport):
    def __init__(self) -> None:
        super().__init__()
        self.reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


def test_frames_cut_from_chunks_of_any_size() -> None:
    async def run() -> None:
        rng = random.Random(7)
        data = rng.randbytes(2_000_000)
        reader = ConnectionReader(1 << 16)
        chunks, at = [], 0
        while at < len(data):
            size = rng.choice([1, 3, 4, 7, 100, 65_536, 256_000])
            chunks.append(data[at:at + size])
            at += size

        async def feed() -> None:
            for number, chunk in enumerate(chunks):
                reader.feed_data(bytearray(chunk) if number % 5 == 0 else chunk)
                if number % 3 == 0:
                    await asyncio.sleep(0)
            reader.feed_eof()

        feeding = asyncio.create_task(feed())
        out = bytearray()
        with pytest.raises(asyncio.IncompleteReadError) as ended:
            while True:
                size = rng.choice([4, 1, 17, 95_000, 300_000])
                frame = await reader.readexactly(size)
                assert len(frame) == size
                out += frame
                if rng.random() < 0.2:
                    out += await reader.read(5000)
        out += ended.value.partial
        await feeding
        assert bytes(out) == data
        assert reader.at_eof()
        assert await reader.read() == b""

    asyncio.run(run())


def test_a_whole_chunk_is_not_copied() -> None:
    async def run() -> None:
        reader = ConnectionReader(1 << 16)
        chunk = b"x" * 1000
        reader.feed_data(chunk)
        assert await reader.readexactly(1000) is chunk

    asyncio.run(run())


def test_pauses_beyond_twice_the_limit_and_resumes_at_it() -> None:
    async def run() -> None:
        reader = ConnectionReader(100)
        transport = _Transport()
        reader.set_transport(transport)
        reader.feed_data(b"a" * 150)
        reader.feed_data(b"b" * 60)
        assert not transport.reading
        await reader.readexactly(50)
        assert not transport.reading  # 160 still buffered
        await reader.readexactly(60)
        assert transport.reading
        assert reader.buffered == 100

    asyncio.run(run())


def test_a_frame_larger_than_the_buffer_resumes_reading() -> None:
    async def run() -> None:
        reader = ConnectionReader(10)
        transport = _Transport()
        reader.set_transport(transport)
        reader.feed_data(b"a" * 30)
        assert not transport.reading
        waiting = asyncio.create_task(reader.readexactly(40))
        await asyncio.sleep(0)
        assert transport.reading  # waiting for more while paused would never end
        reader.feed_data(b"b" * 10)
        assert await waiting == b"a" * 30 + b"b" * 10

    asyncio.run(run())


def test_errors_and_eof_as_streamreader() -> None:
    async def run() -> None:
        reader = ConnectionReader(100)
        waiting = asyncio.create_task(reader.readexactly(4))
        await asyncio.sleep(0)
        reader.set_exception(ConnectionResetError("gone"))
        with pytest.raises(ConnectionResetError):
            await waiting
        with pytest.raises(ConnectionResetError):
            await reader.read(10)
        empty = ConnectionReader(100)
        empty.feed_data(b"ab")
        empty.feed_eof()
        with pytest.raises(asyncio.IncompleteReadError) as ended:
            await empty.readexactly(4)
        assert ended.value.partial == b"ab"
        assert await empty.read(10) == b""

    asyncio.run(run())


def _lend(reader: ConnectionReader, data: bytes) -> memoryview:
    """What a buffered transport does with ``data``: read it into the buffer the reader
    lends, as much as fits; return the buffer lent."""
    buffer = reader.get_buffer(-1)
    size = min(len(buffer), len(data))
    buffer[:size] = data[:size]
    reader.buffer_updated(size)
    return buffer


def test_frames_read_into_lent_buffers_come_out_byte_for_byte() -> None:
    async def run() -> None:
        rng = random.Random(11)
        data = rng.randbytes(3_000_000)
        reader = ConnectionReader(1 << 16)

        async def transport() -> None:
            at = 0
            while at < len(data):
                size = rng.choice([1, 4, 100, 5000, 65_536, 400_000])
                lent = _lend(reader, data[at:at + size])
                at += min(len(lent), size)
                if rng.random() < 0.5:
                    await asyncio.sleep(0)
            reader.feed_eof()

        feeding = asyncio.create_task(transport())
        out = bytearray()
        with pytest.raises(asyncio.IncompleteReadError) as ended:
            while True:
                size = rng.choice([4, 17, DIRECT_BYTES - 1, DIRECT_BYTES, 95_000, 300_000])
                frame = await reader.readexactly(size)
                assert len(frame) == size
                out += frame
        out += ended.value.partial
        await feeding
        assert bytes(out) == data

    asyncio.run(run())


def test_a_large_frame_is_read_into_its_own_buffer() -> None:
    async def run() -> None:
        reader = ConnectionReader(1 << 16)
        frame = bytes(range(256)) * 400  # 102,400 bytes
        _lend(reader, frame[:1000])  # the first read went to the shared buffer
        waiting = asyncio.create_task(reader.readexactly(len(frame)))
        await asyncio.sleep(0)
        lent = _lend(reader, frame[1000:])
        assert len(lent) == len(frame) - 1000  # the rest of the frame, exactly
        got = await waiting
        assert got == frame
        assert isinstance(got, memoryview)  # the buffer the transport read into
        assert _lend(reader, b"next").nbytes > 4  # then the shared buffer again
        assert await reader.readexactly(4) == b"next"

    asyncio.run(run())


def test_a_direct_read_cancelled_keeps_what_arrived() -> None:
    async def run() -> None:
        reader = ConnectionReader(1 << 16)
        frame = b"z" * (2 * DIRECT_BYTES)
        _lend(reader, frame[:10])
        waiting = asyncio.create_task(reader.readexactly(len(frame)))
        await asyncio.sleep(0)
        _lend(reader, frame[10:500])
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert reader.buffered == 500
        _lend(reader, frame[500:])
        assert await reader.readexactly(len(frame)) == frame

    asyncio.run(run())


def test_eof_inside_a_direct_read_gives_what_arrived() -> None:
    async def run() -> None:
        reader = ConnectionReader(1 << 16)
        waiting = asyncio.create_task(reader.readexactly(DIRECT_BYTES * 2))
        await asyncio.sleep(0)
        _lend(reader, b"q" * 300)
        reader.feed_eof()
        with pytest.raises(asyncio.IncompleteReadError) as ended:
            await waiting
        assert ended.value.partial == b"q" * 300

    asyncio.run(run())


def test_the_start_of_a_large_frame_pauses_the_transport_until_it_is_asked_for() -> None:
    """Framed (logged in): a read that starts a large frame pauses reading, also when it
    comes right after the frame before completed, in the same turn; the rest of the frame
    is read into its own buffer once the read loop asks for it."""
    async def run() -> None:
        reader = ConnectionReader(1 << 20)
        reader.set_limit(1 << 20, framed=True)
        transport = _Transport()
        reader.set_transport(transport)
        first = bytes(range(200)) * 500  # 100,000 bytes
        second = bytes(range(100)) * 900
        stream = (len(first).to_bytes(4, "big") + first
                  + len(second).to_bytes(4, "big") + second)
        _lend(reader, stream[:1000])
        assert not transport.reading  # a large frame begun: nothing more until asked
        assert await reader.readexactly(4) == stream[:4]
        waiting = asyncio.create_task(reader.readexactly(len(first)))
        await asyncio.sleep(0)
        assert transport.reading
        at = 1000 + len(_lend(reader, stream[1000:]))  # the rest of the first frame
        assert at == 4 + len(first)
        _lend(reader, stream[at:at + 5000])  # the same turn: the second frame begins
        assert not transport.reading
        assert await waiting == first
        assert await reader.readexactly(4) == stream[at:at + 4]
        waiting = asyncio.create_task(reader.readexactly(len(second)))
        await asyncio.sleep(0)
        assert len(_lend(reader, stream[at + 5000:])) == len(second) - 4996
        assert await waiting == second

    asyncio.run(run())


def test_a_frame_far_larger_than_what_arrived_takes_no_memory_up_front() -> None:
    """A frame at most AHEAD times what has arrived of it gets an ordinary buffer; a larger
    one (a size prefix and little else) an anonymous mapping, whose pages are taken only
    as bytes arrive."""
    async def run() -> None:
        for arrived, size, kind in ((DIRECT_BYTES, AHEAD * DIRECT_BYTES, bytearray),
                                    (DIRECT_BYTES, AHEAD * DIRECT_BYTES + 1, mmap.mmap)):
            reader = ConnectionReader(1 << 16)
            _lend(reader, b"a" * arrived)
            waiting = asyncio.create_task(reader.readexactly(size))
            await asyncio.sleep(0)
            _lend(reader, b"b" * (size - arrived))
            got = await waiting
            assert isinstance(got, memoryview) and isinstance(got.obj, kind)
            assert got == b"a" * arrived + b"b" * (size - arrived)

    asyncio.run(run())
