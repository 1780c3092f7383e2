"""Blocking HTTP for the OAuth modules (standard library only): one request with a timeout
and a size cap, and a JSON GET for discovery and JWKS documents.

Only ``http:`` and ``https:`` URLs are fetched. Error answers (4xx, 5xx) are returned as
responses, not raised, so that callers can read an OAuth error body.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol
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


def request(url: str, *, timeout: float, data: bytes | None = None,
            headers: Mapping[str, str] | None = None) -> HttpResponse:
    """GET ``url`` (POST when ``data`` is given); raise FetchError if it cannot be done."""
    check_http_url(url, "URL")
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    req.add_header("User-Agent", USER_AGENT)
    req.add_header("Accept", "application/json")
    for name, value in (headers or {}).items():
        req.add_header(name, value)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as answer:
            return HttpResponse(answer.status, _read_capped(answer))
    except urllib.error.HTTPError as exc:
        with exc:
            return HttpResponse(exc.code, _read_capped(exc))
    except urllib.error.URLError as exc:
        raise FetchError(f"cannot reach {url}: {exc.reason}") from None
    except (OSError, ValueError) as exc:
        raise FetchError(f"cannot reach {url}: {exc}") from None


def get_json_object(url: str, *, timeout: float) -> JsonObject:
    """GET a JSON object; raise FetchError unless the answer is 200 with a JSON object."""
    answer = request(url, timeout=timeout)
    if answer.status != 200:
        raise FetchError(f"{url} answered HTTP {answer.status}")
    body = answer.json()
    if not isinstance(body, dict):
        raise FetchError(f"{url} did not answer a JSON object")
    return body
