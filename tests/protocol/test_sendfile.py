"""Responses of buffers and file regions reach the socket whole and in order.

A real TCP connection on loopback, with uvloop (as the broker runs) and the stock
asyncio loop; the reader is slow at first so that the socket fills up and the writer has
to hand the tail of a region to the transport.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
import uvloop

from broker_core.storage import FileRegion
from listeners.sendfile import Part, write_parts

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}


def _responses(path: Path) -> tuple[list[list[Part]], bytes]:
    data = os.urandom(8 << 20)
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        big = FileRegion(fd, 5, (8 << 20) - 10, b"")
        small = FileRegion(fd, 1000, 70_000, b"")
        again = FileRegion(fd, 0, 100, b"")
    finally:
        os.close(fd)
    first: list[Part] = [b"head-1", memoryview(b"mv" * 1000), big, b"between", small]
    second: list[Part] = [b"head-2", again]
    expected = (b"head-1" + b"mv" * 1000 + data[5:(8 << 20) - 5] + b"between"
                + data[1000:71_000] + b"head-2" + data[:100])
    return [first, second], expected


async def _exchange(responses: list[list[Part]], use_socket_fd: bool, total: int) -> bytes:
    done = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket") if use_socket_fd else None
        for parts in responses:
            await write_parts(writer, parts, sock)
        await done.wait()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)  # before connecting
    client.connect(("127.0.0.1", port))
    client.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=client)
    await asyncio.sleep(0.2)  # let the server fill the socket and queue the rest
    received = await reader.readexactly(total)
    done.set()
    writer.close()
    server.close()
    return received


@pytest.mark.parametrize("loop_name", sorted(LOOPS))
@pytest.mark.parametrize("use_socket_fd", [True, False], ids=["sendfile", "transport"])
def test_parts_arrive_whole_and_in_order(tmp_path: Path, loop_name: str,
                                         use_socket_fd: bool) -> None:
    responses, expected = _responses(tmp_path / "ledger")
    loop = LOOPS[loop_name]()
    try:
        got = loop.run_until_complete(asyncio.wait_for(
            _exchange(responses, use_socket_fd, len(expected)), 30))
    finally:
        loop.close()
    assert got == expected
    regions = [p for parts in responses for p in parts if isinstance(p, FileRegion)]
    assert regions and all(r.fd == -1 for r in regions)  # every region was released
