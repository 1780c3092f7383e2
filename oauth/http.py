"""Blocking HTTP for the OAuth modules (standard library only): one request with a timeout
and a size cap, and a JSON GET for discovery and JWKS documents.

Only ``http:`` and ``https:`` URLs are fetched. A redirect is followed only within the
URL's origin (scheme, host and port): never to another server, never from https to http.
The timeout bounds the whole request, redirects, name resolution and a slow answer included,
not each read alone: an issuer trickling its answer, or a resolver that stalls, is cut off
then (:class:`_Deadline`, :func:`_resolve`). Error answers
(4xx, 5xx) are returned as responses, not raised, so that callers can read an OAuth error
body.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import IO, Protocol
from urllib.parse import urlsplit

from common.json_types import JsonObject, JsonValue
from oauth.errors import FetchError

MAX_RESPONSE_BYTES = 1024 * 1024
"""The largest response body read; a longer one is an error."""

USER_AGENT = "edge-broker-oauth/1"


@dataclass(frozen=True)
class HttpResponse:
    """A status and a body."""

    status: int
    body: bytes

    def json(self) -> JsonValue:
        """The body parsed as JSON; raises FetchError when it is not JSON."""
        try:
            parsed: JsonValue = json.loads(self.body)
            return parsed
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise FetchError(f"HTTP {self.status} answer is not JSON") from None


def check_http_url(url: str, what: str) -> str:
    """Return ``url`` if it is an absolute http(s) URL with a host, else raise ValueError."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{what} must be an http:// or https:// URL, got {url!r}")
    return url


class _Readable(Protocol):
    def read(self, size: int, /) -> bytes: ...


def _read_capped(stream: _Readable) -> bytes:
    body = stream.read(MAX_RESPONSE_BYTES + 1)
    if len(body) > MAX_RESPONSE_BYTES:
        raise FetchError(f"answer larger than {MAX_RESPONSE_BYTES} bytes")
    return body


def origin(url: str) -> tuple[str, str, int | None]:
    """Scheme, host and port (the scheme's default when absent) of an http(s) URL;
    ValueError when its port is not a number."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or ""), parts.port or _DEFAULT_PORTS.get(scheme)


_DEFAULT_PORTS = {"http": 80, "https": 443}


class _SameOrigin(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to the origin of the URL asked for (FetchError otherwise)."""

    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int,
                         msg: str, headers: http.client.HTTPMessage, newurl: str
                         ) -> urllib.request.Request | None:
        if origin(newurl) != origin(req.full_url):
            fp.close()
            raise FetchError(f"{req.full_url} redirects to {newurl}: a redirect to another "
                             "origin (scheme, host, port) is not followed")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class _Deadline:
    """The end of one request, redirects included: a connection made for it waits at most
    the time left (connect, TLS handshake), and when the end comes a timer shuts its
    sockets down, which ends a read however slowly the answer comes."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    @property
    def expired(self) -> bool:
        """Whether the end has come."""
        return time.monotonic() >= self.end

    def left(self) -> float:
        """Seconds left; TimeoutError when none are."""
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        return left

    def watch(self, sock: socket.socket) -> None:
        """Shut ``sock`` down when the end comes (at once if it has)."""
        with self._lock:
            self._sockets.append(sock)
        if self.expired:
            self._expire()

    def cancel(self) -> None:
        """The request is over."""
        self._timer.cancel()

    def _expire(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):  # closed already
                # the descriptor, not a TLS layer's state another thread is reading with
                socket.socket.shutdown(sock, socket.SHUT_RDWR)


_DEADLINE: ContextVar[_Deadline | None] = ContextVar("oauth_http_deadline", default=None)
"""The deadline of the request this thread is making."""


_AddrInfo = tuple[socket.AddressFamily, socket.SocketKind, int, str,
                  tuple[str, int] | tuple[str, int, int, int] | tuple[int, bytes]]
"""One address ``socket.getaddrinfo`` gives."""


def _resolve(host: str, port: int, seconds: float) -> Sequence[_AddrInfo]:
    """``getaddrinfo`` for a TCP connection, waited for at most ``seconds``: it runs in a
    daemon thread of its own (a stalled resolver cannot be interrupted), left behind when
    the time is up (TimeoutError)."""
    found: list[Sequence[_AddrInfo]] = []
    failed: list[OSError] = []
    done = threading.Event()

    def run() -> None:
        try:
            found.append(socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM))
        except OSError as exc:
            failed.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="oauth-resolve", daemon=True).start()
    if not done.wait(seconds):
        raise TimeoutError(f"resolving {host!r} timed out")
    if failed:
        raise failed[0]
    return found[0]


def _connect_within(deadline: _Deadline, address: tuple[str, int], _timeout: float | None,
                    source_address: tuple[str, int] | None = None) -> socket.socket:
    """``socket.create_connection`` held to ``deadline``: the name resolved and each
    address tried within the time it leaves (the ``timeout`` given is ignored)."""
    host, port = address
    error: OSError | None = None
    for family, kind, proto, _name, sockaddr in _resolve(host, port, deadline.left()):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(deadline.left())
            if source_address is not None:
                sock.bind(source_address)
            sock.connect(sockaddr)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    raise error if error is not None else OSError(f"no address for {host!r}")


class _WatchedHTTP(http.client.HTTPConnection):
    """A connection held to the deadline of the request under way."""

    def connect(self) -> None:
        deadline = _DEADLINE.get()
        if deadline is not None:
            self.timeout = deadline.left()
            self._create_connection = functools.partial(_connect_within, deadline)
        super().connect()
        if deadline is not None:
            deadline.watch(self.sock)


class _WatchedHTTPS(_WatchedHTTP, http.client.HTTPSConnection):
    """The same over TLS (its handshake is within ``connect``'s timeout)."""


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_WatchedHTTP, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_WatchedHTTPS, req)


_OPENER = urllib.request.build_opener(_SameOrigin, _HTTPHandler, _HTTPSHandler)


def request(url: str, *, timeout: float, data: bytes | None = None,
            headers: Mapping[str, str] | None = None) -> HttpResponse:
    """GET ``url`` (POST when ``data`` is given), all of it within ``timeout`` seconds;
    raise FetchError if it cannot be done."""
    check_http_url(url, "URL")
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    req.add_header("User-Agent", USER_AGENT)
    req.add_header("Accept", "application/json")
    for name, value in (headers or {}).items():
        req.add_header(name, value)
    deadline = _Deadline(timeout)
    watched = _DEADLINE.set(deadline)
    try:
        answer = _exchange(req, timeout)
        if deadline.expired:  # a read cut off by the deadline may end without an error
            raise TimeoutError("timed out")
        return answer
    except (OSError, ValueError, http.client.HTTPException) as exc:
        if deadline.expired:
            raise FetchError(f"no complete answer from {url} within {timeout:g} s") from None
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise FetchError(f"cannot reach {url}: {reason}") from None
    finally:
        deadline.cancel()
        _DEADLINE.reset(watched)


def _exchange(req: urllib.request.Request, timeout: float) -> HttpResponse:
    try:
        answer = _OPENER.open(req, timeout=timeout)
    except urllib.error.HTTPError as exc:
        with exc:
            return HttpResponse(exc.code, _read_capped(exc))
    with answer:
        return HttpResponse(answer.status, _read_capped(answer))


def get_json_object(url: str, *, timeout: float) -> JsonObject:
    """GET a JSON object; raise FetchError unless the answer is 200 with a JSON object."""
    answer = request(url, timeout=timeout)
    if answer.status != 200:
        raise FetchError(f"{url} answered HTTP {answer.status}")
    body = answer.json()
    if not isinstance(body, dict):
        raise FetchError(f"{url} did not answer a JSON object")
    return body
