"""The dev issuer's HTTP front: a threading server on loopback whose handler maps the
paths (discovery, ``/jwks``, ``/token``, ``/rotate``, ``/stats``) to an :class:`Endpoints`
object (the :class:`~oauth.dev_issuer.DevIssuer`) and answers JSON."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Protocol
from urllib.parse import parse_qs, urlsplit

from common.json_types import JsonObject
from oauth.discovery import WELL_KNOWN_PATH

if TYPE_CHECKING:
    from oauth.dev_issuer import JwksDocument

MAX_BODY_BYTES = 64 * 1024


class Endpoints(Protocol):
    """What the HTTP front asks of the issuer."""

    def count(self, name: str) -> None: ...

    def discovery(self) -> JsonObject: ...

    def jwks(self) -> JwksDocument: ...

    def stats(self) -> dict[str, int | list[str]]: ...

    def rotate(self, drop_previous: bool = False) -> str: ...

    def token_response(self, form: Mapping[str, list[str]],
                       authorization: str | None) -> tuple[int, JsonObject]: ...


def is_loopback(host: str) -> bool:
    """Whether ``host`` names a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class IssuerServer(ThreadingHTTPServer):
    """A threading HTTP server answering for ``issuer``."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], issuer: Endpoints) -> None:
        super().__init__(address, _Handler)
        self.issuer = issuer


class _Handler(BaseHTTPRequestHandler):
    server: IssuerServer
    protocol_version = "HTTP/1.1"
    server_version = "edge-dev-issuer/1"

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: tests and users read the ready line, not an access log."""

    def _send(self, status: int, body: Mapping[str, object],
              headers: Mapping[str, str] | None = None) -> None:
        # ``object``: json.dumps takes any document; Endpoints' types say what is sent.
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-store")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def _body(self) -> bytes | None:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit() or int(length) > MAX_BODY_BYTES:
            self._send(400, {"error": "invalid_request",
                             "error_description": "a body with Content-Length is required"})
            return None
        return self.rfile.read(int(length))

    def do_GET(self) -> None:
        issuer = self.server.issuer
        path = urlsplit(self.path).path
        if path == WELL_KNOWN_PATH:
            issuer.count("discovery_requests")
            self._send(200, issuer.discovery())
        elif path == "/jwks":
            issuer.count("jwks_requests")
            self._send(200, issuer.jwks())
        elif path == "/stats":
            self._send(200, issuer.stats())
        else:
            self._send(404, {"error": "not_found"})

    def do_POST(self) -> None:
        issuer = self.server.issuer
        parts = urlsplit(self.path)
        body = self._body()
        if body is None:
            return
        if parts.path == "/token":
            content_type = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
            if content_type != "application/x-www-form-urlencoded":
                self._send(400, {"error": "invalid_request", "error_description":
                                 "body must be application/x-www-form-urlencoded"})
                return
            try:
                form = parse_qs(body.decode("utf-8"), keep_blank_values=True,
                                strict_parsing=bool(body))
            except (UnicodeDecodeError, ValueError):
                self._send(400, {"error": "invalid_request",
                                 "error_description": "malformed form body"})
                return
            authorization = self.headers.get("Authorization")
            status, answer = issuer.token_response(form, authorization)
            headers = {"WWW-Authenticate": 'Basic realm="dev-issuer"'} \
                if status == 401 and authorization else None
            self._send(status, answer, headers)
        elif parts.path == "/rotate":
            if not is_loopback(self.client_address[0]):
                self._send(403, {"error": "forbidden"})
                return
            query = parse_qs(parts.query)
            drop = query.get("drop_previous", ["false"])[0].lower() in ("1", "true", "yes")
            self._send(200, {"kid": issuer.rotate(drop)})
        else:
            self._send(404, {"error": "not_found"})
