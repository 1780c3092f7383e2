"""The contract between a listener and its connection handlers: frames, requests and
their two stages, responses, per-connection limits and the shared read budget (the
behaviour is described in :mod:`listeners.server`)."""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from common.frames import Frame

SMALL_FRAME_BYTES = 16 * 1024
"""Frames of connections not logged in up to this size are not counted against the shared
:class:`ReadBudget`: ApiVersions, SaslHandshake, a PLAIN login and an OAUTHBEARER token
(one carrying 200 group ids, the most Entra ID puts in a token, signed RS256 with a
4096-bit key, measures about 12.5 KiB). Before login a connection's read buffer is this
size too."""

Response = Frame
"""One framed response (``common.frames.Frame``)."""
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
    """A listener's ``on_accept`` verdict that a new connection is not served (a quota on
    new connections of its address): it is closed at once, before its TLS handshake, and
    ``on_accept`` has said why; or the handler factory's, after the handshake (a client
    certificate that names no principal): it has said why too."""


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


def response_size(response: Response | None) -> int:
    """The bytes a response puts on the wire (what it holds until it is written)."""
    if response is None:
        return 0
    if isinstance(response, bytes):
        return len(response)
    return sum(len(part) for part in response)
