"""Writing a response made of buffers and file regions, with ``sendfile`` on plain TCP.

On a plain TCP connection whose transport has nothing queued, the response goes straight
to the socket: buffers with one ``writev``, file regions with ``sendfile`` (the kernel
copies from the page cache; Python never holds the bytes). Whatever the socket does not
take at once goes through the transport, in order, so it is sent when the socket drains;
file bytes go that way in chunks of ``CHUNK_BYTES``, each read only once the transport
has drained the one before, so a response sent to a slow reader (or over TLS, where
every byte is encrypted in user space) never has more than about one chunk of its file
bytes in memory. Between chunks, a plain TCP connection whose transport has emptied goes
back to ``sendfile``.

A response with file regions is sent with ``TCP_CORK`` set: otherwise the few bytes
before a region leave as a segment of their own, and the client wakes up for them alone
(librdkafka spent about a fifth more CPU consuming in ``make bench`` that way).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from common.frames import FileSpan

_IOV_MAX = 512
CHUNK_BYTES = 256 * 1024
"""File bytes read into memory at a time when a region cannot go by ``sendfile``."""


class Socket(Protocol):
    """What the writer needs of the transport's socket."""

    def fileno(self) -> int:
        """The socket's descriptor."""
        ...

    def setsockopt(self, level: int, option: int, value: int, /) -> None:
        """Set a socket option."""
        ...


Part = bytes | memoryview | FileSpan


_BUFFERS = bytes | bytearray | memoryview


@dataclass(slots=True)
class _Span:
    """The bytes of a region still to send: ``length`` bytes at ``offset`` of its file."""

    fd: int
    offset: int
    length: int


_Item = bytes | memoryview | _Span


async def write_parts(writer: asyncio.StreamWriter, parts: Sequence[Part],
                      sock: Socket | None) -> None:
    """Write ``parts`` in order; ``sock`` is the plain TCP socket, None on TLS."""
    try:
        rest: list[_Item] = [part if isinstance(part, _BUFFERS)
                             else _Span(part.fd, part.offset, len(part)) for part in parts]
        while rest:
            if sock is not None and writer.transport.get_write_buffer_size() == 0:
                rest = _send_corked(sock, rest)
                if not rest:
                    break
            rest = _queue_some(writer, rest)
            await writer.drain()
    finally:
        for part in parts:
            if not isinstance(part, _BUFFERS):
                part.release()


def send_now(writer: asyncio.StreamWriter, response: bytes | Sequence[Part],
             sock: Socket | None) -> bool:
    """Send a response held in memory without waiting: straight to the socket when it is
    plain TCP and its transport holds nothing, what the socket does not take (or all of
    it, on TLS) through the transport. False, and nothing sent, when the response has a
    file region (:func:`write_parts` sends it)."""
    parts: Sequence[Part] = [response] if isinstance(response, bytes) else response
    items: list[_Item] = [part for part in parts if isinstance(part, _BUFFERS)]
    if len(items) < len(parts):
        return False  # a file region among the parts
    if sock is not None and writer.transport.get_write_buffer_size() == 0:
        items = _send_directly(sock.fileno(), items)
    for item in items:
        assert not isinstance(item, _Span)
        writer.write(item)
    return True


def _queue_some(writer: asyncio.StreamWriter, items: list[_Item]) -> list[_Item]:
    """Hand the transport the buffers up to the next region and one chunk of it."""
    index = 0
    while index < len(items):
        item = items[index]
        if not isinstance(item, _Span):
            writer.write(item)
            index += 1
            continue
        size = min(item.length, CHUNK_BYTES)
        chunk = os.pread(item.fd, size, item.offset)
        if len(chunk) != size:
            raise OSError(f"short read of {len(chunk)} of {size} file bytes")
        writer.write(chunk)
        if size == item.length:
            return items[index + 1:]
        return [_Span(item.fd, item.offset + size, item.length - size), *items[index + 1:]]
    return []


def _send_corked(sock: Socket, items: list[_Item]) -> list[_Item]:
    """:func:`_send_directly`, corked when there is a file region among the items."""
    if not any(isinstance(item, _Span) for item in items):
        return _send_directly(sock.fileno(), items)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
    try:
        return _send_directly(sock.fileno(), items)
    finally:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)


def _send_directly(sock: int, items: list[_Item]) -> list[_Item]:
    """Send what the socket takes now; return the items (or their tails) left over."""
    index = 0
    while index < len(items):
        item = items[index]
        if not isinstance(item, _Span):
            run = _buffer_run(items, index)
            try:
                sent = os.writev(sock, run)
            except BlockingIOError:
                sent = 0
            index += len(run)
            leftover = _unsent_buffers(run, sent)
            if leftover:
                return [*leftover, *items[index:]]
            continue
        done = 0
        with contextlib.suppress(BlockingIOError):  # the socket's buffer is full: done so far
            while done < item.length:
                sent = os.sendfile(sock, item.fd, item.offset + done, item.length - done)
                if sent == 0:
                    break
                done += sent
        index += 1
        if done < item.length:
            return [_Span(item.fd, item.offset + done, item.length - done), *items[index:]]
    return []


def _buffer_run(items: list[_Item], start: int) -> list[memoryview]:
    """The buffers from ``start`` up to the next file region (at most ``_IOV_MAX``)."""
    run: list[memoryview] = []
    for item in items[start:start + _IOV_MAX]:
        if isinstance(item, _Span):
            break
        run.append(memoryview(item))
    return run


def _unsent_buffers(run: list[memoryview], sent: int) -> list[_Item]:
    """What ``writev`` left of ``run`` after sending ``sent`` bytes."""
    for position, buffer in enumerate(run):
        if sent < len(buffer):
            return [buffer[sent:], *run[position + 1:]]
        sent -= len(buffer)
    return []
