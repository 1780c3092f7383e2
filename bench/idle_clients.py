"""``python -m bench.idle_clients``: hold many logged-in, idle connections to a broker.

Each connection is a raw non-blocking socket that sends ApiVersions, SaslHandshake (PLAIN)
and SaslAuthenticate (``tenant`` and ``token:<JWT>``), checks the answers and then stays
open doing nothing: about 1 KiB of this process per connection, so 10,000 fit in one
process. Prints ``logged-in <n> <seconds>`` once all are in (or the first failure and
exits 1), then holds them until stdin closes.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import socket
import struct
import sys
import time
from collections.abc import Sequence

from kafka.protocol.api_message import ApiMessage
from kafka.protocol.metadata import ApiVersionsRequest
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

CONCURRENT_LOGINS = 200
"""Logins under way at once (the broker validates tokens in worker threads)."""


def frame(request: ApiMessage, version: int, correlation: int) -> bytes:
    """A request with its v1 header (none of these three is flexible at these versions)."""
    api_key = request.API_KEY
    body = bytes(request.encode(version=version))
    client = b"bench-idle"
    header = struct.pack(">hhih", api_key, version, correlation, len(client)) + client
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


def login_frames(username: str, token: str) -> list[bytes]:
    """ApiVersions v0, SaslHandshake v1 (PLAIN), SaslAuthenticate v1."""
    message = f"\x00{username}\x00token:{token}".encode()
    return [frame(ApiVersionsRequest[0](), 0, 1),
            frame(SaslHandshakeRequest[1](mechanism="PLAIN"), 1, 2),
            frame(SaslAuthenticateRequest[1](auth_bytes=message), 1, 3)]


async def _read_frame(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> bytes:
    data = b""
    size = -1
    while True:
        if size < 0 and len(data) >= 4:
            size = struct.unpack_from(">i", data)[0]
        if size >= 0 and len(data) >= 4 + size:
            return data[4:4 + size]
        chunk = await loop.sock_recv(sock, 65536)
        if not chunk:
            raise ConnectionError("closed by the broker")
        data += chunk


async def login(port: int, frames: Sequence[bytes]) -> socket.socket:
    """One connection, logged in; raises on a refused login."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        await loop.sock_sendall(sock, frames[0])
        await _read_frame(loop, sock)
        await loop.sock_sendall(sock, frames[1])
        handshake = SaslHandshakeResponse[1].decode((await _read_frame(loop, sock))[4:])
        if handshake.error_code:
            raise ConnectionError(f"SaslHandshake error {handshake.error_code}")
        await loop.sock_sendall(sock, frames[2])
        answer = SaslAuthenticateResponse[1].decode((await _read_frame(loop, sock))[4:])
        if answer.error_code:
            raise ConnectionError(f"SaslAuthenticate error {answer.error_code}: "
                                  f"{answer.error_message}")
    except BaseException:
        sock.close()
        raise
    return sock


async def hold(port: int, count: int, username: str, token: str) -> int:
    """Log ``count`` connections in, report, and hold them until stdin closes."""
    frames = login_frames(username, token)
    gate = asyncio.Semaphore(CONCURRENT_LOGINS)

    async def one() -> socket.socket:
        async with gate:
            return await login(port, frames)

    started = time.perf_counter()
    results = await asyncio.gather(*(one() for _ in range(count)), return_exceptions=True)
    socks = [r for r in results if isinstance(r, socket.socket)]
    failures = [r for r in results if not isinstance(r, socket.socket)]
    if failures:
        print(f"failed {len(failures)} {failures[0]!r}", flush=True)
        for sock in socks:
            sock.close()
        return 1
    print(f"logged-in {len(socks)} {time.perf_counter() - started:.3f}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for sock in socks:
        sock.close()
    return 0


def raise_file_limit() -> None:
    """Let this process open as many files as the hard limit allows."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.idle_clients")
    parser.add_argument("--port", type=int, required=True, help="a SASL_PLAINTEXT listener")
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--username", default="bench")
    parser.add_argument("--token", required=True, help="a JWT the broker accepts")
    args = parser.parse_args(argv)
    raise_file_limit()
    return asyncio.run(hold(args.port, args.count, args.username, args.token))


if __name__ == "__main__":
    sys.exit(main())
