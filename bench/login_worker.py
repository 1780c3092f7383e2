"""The login load generator: ``python -m bench.login_worker rate|storm``, one JSON line out.

A login is what a Kafka client does before its first real request: connect, ApiVersions
(v0), SaslHandshake (v1) and SaslAuthenticate (v1) with PLAIN (``public NUL public NUL
token:<jwt>``) or OAUTHBEARER (RFC 7628's initial response), each answered before the
next is sent; then the connection is closed. The frames are encoded once, so the client's
CPU per login is a few socket calls. Tokens come from ``--tokens`` (one a line), used in
turn; asyncio on uvloop.

- ``rate``: ``--count`` logins by ``--concurrency`` loops; time = first connect to the last
  answer.
- ``storm``: after ``--delay``, ``--storms`` storms of ``--clients`` logins at once (all
  connect, log in and stay connected until the storm's last one is in, then all close),
  ``--every`` seconds apart (or back to back if one takes longer).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import struct
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from bench.secure import TENANT

_HEADER = struct.Struct(">hhih")
_CLIENT_ID = b"bench-login"


class LoginFailed(RuntimeError):
    """The broker answered a login step with an error code."""


def frame(api_key: int, version: int, correlation: int, body: bytes) -> bytes:
    """A request frame with header v1 (client id ``bench-login``)."""
    payload = _HEADER.pack(api_key, version, correlation, len(_CLIENT_ID)) + _CLIENT_ID + body
    return struct.pack(">i", len(payload)) + payload


def auth_bytes(mechanism: str, token: str) -> bytes:
    """The client's SASL message for ``token``."""
    if mechanism == "PLAIN":
        return f"{TENANT}\x00{TENANT}\x00token:{token}".encode()
    return f"n,,\x01auth=Bearer {token}\x01\x01".encode()


def login_frames(mechanism: str, token: str) -> list[bytes]:
    """ApiVersions v0, SaslHandshake v1, SaslAuthenticate v1."""
    name = mechanism.encode()
    message = auth_bytes(mechanism, token)
    return [frame(18, 0, 1, b""),
            frame(17, 1, 2, struct.pack(">h", len(name)) + name),
            frame(36, 1, 3, struct.pack(">i", len(message)) + message)]


async def _answer(reader: asyncio.StreamReader) -> int:
    """Read one response; its error code (the int16 after the correlation id)."""
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    body = await reader.readexactly(size)
    code: int = struct.unpack_from(">h", body, 4)[0]
    return code


async def login(port: int, frames: list[bytes]) -> asyncio.StreamWriter:
    """One login; returns the open connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for request in frames:
            writer.write(request)
            code = await _answer(reader)
            if code != 0:
                raise LoginFailed(f"error code {code}")
    except BaseException:
        writer.close()
        raise
    return writer


def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()


class Tokens:
    """The pre-encoded logins, handed out in turn."""

    def __init__(self, mechanism: str, tokens: list[str]) -> None:
        self._frames: Iterator[list[bytes]] = itertools.cycle(
            [login_frames(mechanism, token) for token in tokens])

    def next(self) -> list[bytes]:
        """The frames of the next login."""
        return next(self._frames)


async def run_rate(args: argparse.Namespace, tokens: Tokens) -> dict[str, Any]:
    """``count`` logins by ``concurrency`` loops."""
    left = [args.count]
    errors: list[str] = []

    async def loop() -> None:
        while left[0] > 0:
            left[0] -= 1
            try:
                _close(await login(args.port, tokens.next()))
            except (OSError, LoginFailed, asyncio.IncompleteReadError) as exc:
                errors.append(str(exc))

    cpu0, start = time.process_time(), time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(args.concurrency)))
    seconds = time.perf_counter() - start
    return {"logins": args.count - len(errors), "seconds": seconds, "errors": len(errors),
            "first_error": errors[0] if errors else "",
            "client_cpu_s": time.process_time() - cpu0}


async def run_storm(args: argparse.Namespace, tokens: Tokens) -> dict[str, Any]:
    """``storms`` storms of ``clients`` logins at once, ``every`` seconds apart."""
    errors: list[str] = []
    done = storms = 0
    longest = 0.0
    cpu0, start = time.process_time(), time.perf_counter()
    while storms < args.storms:
        began = time.perf_counter()
        results = await asyncio.gather(*(login(args.port, tokens.next())
                                         for _ in range(args.clients)),
                                       return_exceptions=True)
        longest = max(longest, time.perf_counter() - began)
        for result in results:
            if isinstance(result, asyncio.StreamWriter):
                done += 1
                _close(result)
            else:
                errors.append(str(result))
        storms += 1
        await asyncio.sleep(max(0.05, began + args.every - time.perf_counter()))
    seconds = time.perf_counter() - start
    return {"logins": done, "storms": storms, "seconds": seconds, "errors": len(errors),
            "first_error": errors[0] if errors else "", "longest_storm_s": longest,
            "client_cpu_s": time.process_time() - cpu0}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.login_worker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("rate", "storm"))
    parser.add_argument("--port", type=int, required=True, help="the SASL_PLAINTEXT listener")
    parser.add_argument("--mechanism", choices=("PLAIN", "OAUTHBEARER"), default="PLAIN")
    parser.add_argument("--tokens", required=True, help="file of tokens, one a line")
    parser.add_argument("--count", type=int, default=1000, help="rate: logins")
    parser.add_argument("--concurrency", type=int, default=32, help="rate: login loops")
    parser.add_argument("--clients", type=int, default=1000, help="storm: logins at once")
    parser.add_argument("--storms", type=int, default=1, help="storm: how many")
    parser.add_argument("--every", type=float, default=2.0, help="storm: seconds apart")
    parser.add_argument("--delay", type=float, default=0.0, help="storm: wait first")
    return parser


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    with open(args.tokens, encoding="ascii") as handle:
        tokens = Tokens(args.mechanism, [line.strip() for line in handle if line.strip()])
    if args.mode == "rate":
        return await run_rate(args, tokens)
    await asyncio.sleep(args.delay)
    return await run_storm(args, tokens)


def main(argv: Sequence[str] | None = None) -> int:
    """Run and print one JSON line."""
    args = _parser().parse_args(argv)
    try:
        import uvloop
        result = uvloop.run(_main(args))
    except ImportError:
        result = asyncio.run(_main(args))
    times = os.times()
    result["process_cpu_s"] = times.user + times.system
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
