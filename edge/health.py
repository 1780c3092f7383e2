"""Health checks for the process supervisor and the load balancer, served beside
``/metrics`` on the metrics port.

``/healthz`` answers 200 while the process runs (its HTTP thread answers at all).
``/readyz`` answers 200 when the broker serves: its storage is open and recovered, every
listener bound, and, when the storage is shared (``storageUrl=postgres://``), it is a
registered cluster member whose lease is fresh; else 503 with the checks that fail, one a
line. It turns 503 again as soon as the broker begins to stop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

Check = Callable[[], bool]


@dataclass
class Readiness:
    """Named checks; ready when every one holds. The event loop sets, the HTTP thread
    reads (plain attribute reads and writes)."""

    checks: dict[str, Check] = field(default_factory=dict)

    def add(self, name: str, check: Check) -> None:
        """Add (or replace) the check ``name``."""
        self.checks[name] = check

    def failing(self) -> list[str]:
        """The names of the checks that do not hold now."""
        failed = []
        for name, check in list(self.checks.items()):
            try:
                ok = check()
            except Exception:  # a check that cannot tell counts as not ready
                ok = False
            if not ok:
                failed.append(name)
        return failed


StartResponse = Callable[[str, list[tuple[str, str]]], object]
WsgiApp = Callable[[dict[str, object], StartResponse], Iterable[bytes]]


def health_app(readiness: Readiness, fallback: WsgiApp) -> WsgiApp:
    """A WSGI app answering ``/healthz`` and ``/readyz``, and every other path with
    ``fallback`` (the metrics)."""

    def app(environ: dict[str, object], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO")
        if path == "/healthz":
            return _answer(start_response, "200 OK", "ok\n")
        if path == "/readyz":
            failing = readiness.failing()
            if failing:
                return _answer(start_response, "503 Service Unavailable",
                               "".join(f"not ready: {name}\n" for name in failing))
            return _answer(start_response, "200 OK", "ready\n")
        return fallback(environ, start_response)

    return app


def _answer(start_response: StartResponse, status: str, text: str) -> list[bytes]:
    body = text.encode()
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                            ("Content-Length", str(len(body)))])
    return [body]
