"""The issuer fetch (``oauth.http``, ``oauth.discovery``): a redirect is followed within the
URL's origin only (never to another server, never from https to http), the timeout bounds
the whole request however slowly the answer trickles in, and an https issuer's discovery
document may not name plain http URLs."""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from oauth.discovery import discover
from oauth.errors import FetchError
from oauth.http import get_json_object, request
from tests.security_helpers import make_tls

KEYS: dict[str, object] = {"keys": []}
Route = Callable[[], tuple[int, dict[str, str], object]]


class Server(ThreadingHTTPServer):
    """A loopback HTTP(S) server answering each path with ``routes[path]()``:
    (status, headers, JSON body)."""

    daemon_threads = True

    def __init__(self, host: str = "127.0.0.1",
                 context: ssl.SSLContext | None = None) -> None:
        super().__init__((host, 0), _Handler)
        self.routes: dict[str, Route] = {}
        self.hits: list[str] = []
        if context is not None:
            self.socket = context.wrap_socket(self.socket, server_side=True)
        self.scheme = "https" if context is not None else "http"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        host, port = self.server_address[:2]
        return f"{self.scheme}://{host!s}:{port}{path}"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: Server

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the tests read what was asked from ``server.hits``."""

    def do_GET(self) -> None:
        self.server.hits.append(self.path)
        route = self.server.routes.get(self.path)
        status, headers, body = route() if route is not None else (404, {}, {})
        payload = json.dumps(body).encode()
        self.send_response(status)
        for name, value in {"Content-Length": str(len(payload)), **headers}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)


def redirect(to: str) -> Route:
    return lambda: (302, {"Location": to}, {})


def answering(body: object) -> Route:
    return lambda: (200, {}, body)


keys = answering(KEYS)


@pytest.fixture
def server() -> Iterator[Server]:
    started = Server()
    yield started
    started.stop()


@pytest.fixture
def other() -> Iterator[Server]:
    """Another origin on loopback (127.0.0.2)."""
    started = Server("127.0.0.2")
    yield started
    started.stop()


@pytest.fixture
def tls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    """An https server whose certificate the fetch trusts (its CA as SSL_CERT_FILE)."""
    files = make_tls(tmp_path / "certs")
    monkeypatch.setenv("SSL_CERT_FILE", str(files.ca))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(files.cert, files.key)
    started = Server(context=context)
    yield started
    started.stop()


def test_a_redirect_within_the_origin_is_followed(server: Server) -> None:
    server.routes = {"/jwks": redirect("/keys/"), "/keys/": keys}
    assert get_json_object(server.url("/jwks"), timeout=10) == KEYS


def test_a_redirect_to_another_server_is_refused(server: Server, other: Server) -> None:
    other.routes = {"/jwks": keys}
    for target in (other.url("/jwks"), server.url("/jwks").replace(
            str(server.server_address[1]), str(other.server_address[1]))):
        server.routes = {"/jwks": redirect(target)}
        with pytest.raises(FetchError, match="redirect to another origin"):
            get_json_object(server.url("/jwks"), timeout=10)
    assert other.hits == []


def test_a_redirect_from_https_to_http_is_refused(tls: Server, server: Server) -> None:
    server.routes = {"/jwks": keys}
    tls.routes = {"/jwks": redirect(server.url("/jwks")), "/good": keys}
    assert get_json_object(tls.url("/good"), timeout=10) == KEYS  # the CA is trusted
    with pytest.raises(FetchError, match="redirect to another origin"):
        get_json_object(tls.url("/jwks"), timeout=10)
    assert server.hits == []


def test_an_https_issuer_may_not_name_http_urls(tls: Server, server: Server) -> None:
    issuer = tls.url("")
    document = {"issuer": issuer, "jwks_uri": tls.url("/jwks"),
                "token_endpoint": tls.url("/token")}
    tls.routes = {"/.well-known/openid-configuration": answering(document)}
    assert discover(issuer, timeout=10).jwks_uri == tls.url("/jwks")
    for name in ("jwks_uri", "token_endpoint"):
        weaker = {**document, name: server.url("/" + name)}
        tls.routes = {"/.well-known/openid-configuration": answering(weaker)}
        with pytest.raises(FetchError, match=f"'{name}' is 'http://.*', not https like the "
                                             "issuer"):
            discover(issuer, timeout=10)


def trickle(at_once: bytes, slowly: bytes) -> tuple[int, threading.Event]:
    """A server answering its first client ``at_once``, then ``slowly`` a byte every 0.1 s:
    its port, and an event set once it stopped (the client went away, or all was sent)."""
    listener = socket.create_server(("127.0.0.1", 0))
    stopped = threading.Event()

    def serve() -> None:
        try:
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(at_once)
                for byte in slowly:
                    conn.sendall(bytes([byte]))
                    time.sleep(0.1)
        except OSError:
            pass  # the client cut it off
        finally:
            listener.close()
            stopped.set()

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1], stopped


@pytest.mark.parametrize("part", ["head", "body"])
def test_the_timeout_bounds_the_whole_answer(part: str) -> None:
    """Each byte comes well within the timeout of the one before (a read waits that
    long), but the answer as a whole takes many times longer: refused."""
    body = json.dumps(KEYS).encode() + b" " * 40
    head = b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
    port, stopped = trickle(b"", head + body) if part == "head" else trickle(head, body)
    with pytest.raises(FetchError, match=r"no complete answer from .* within 0\.5 s"):
        request(f"http://127.0.0.1:{port}/jwks", timeout=0.5)
    assert stopped.wait(30)


def test_the_timeout_bounds_name_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    """A resolver that stalls cannot be made for real on loopback (no /etc/hosts or
    resolv.conf of our own), so the system resolver itself is the seam: it stalls for one
    name, until the test lets it go.  The request must give up within its timeout while
    the resolution is still stalled (before: it waited for the resolver, whatever the
    timeout)."""
    real = socket.getaddrinfo
    release = threading.Event()

    def stalled(host: str, *args: object, **kwargs: object) -> object:
        if host == "stalled-resolver.test":
            release.wait(60)
        return real(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", stalled)
    outcome: list[BaseException] = []

    def fetch() -> None:
        try:
            request("http://stalled-resolver.test:1/jwks", timeout=0.5)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=fetch, daemon=True)
    thread.start()
    try:
        thread.join(30)
        assert not release.is_set() and not thread.is_alive(), \
            "the request waited for the stalled resolver"
    finally:
        release.set()
    assert len(outcome) == 1 and isinstance(outcome[0], FetchError), outcome
    assert "within 0.5 s" in str(outcome[0])
