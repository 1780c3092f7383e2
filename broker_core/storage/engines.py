"""Choosing a storage engine by URL, as Tansu does.

``file:///abs/path`` (or a plain path) opens the managed ledger on local files;
``memory://`` keeps everything in this process (tests, throwaway brokers);
``postgres://user@host:port/db`` keeps it in a PostgreSQL database (``postgres``). An engine is a
module with an opener ``(url, default config, clock) -> Storage``; adding one is that
module plus one line in ``ENGINES``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import unquote, urlsplit

from .config import LogConfig
from .log_manager import LogManager
from .memory import open_memory_storage
from .model import wall_clock_ms
from .postgres import open_postgres_storage, public_url
from .protocols import Storage

Opener = Callable[[str, LogConfig, Callable[[], int]], Storage]


def storage_path_from_url(url: str) -> Path:
    """The directory named by a ``file:`` URL or plain path; ValueError for other schemes."""
    if "://" not in url and not url.startswith("file:"):
        if not url:
            raise ValueError("empty storage URL")
        return Path(url)
    parts = urlsplit(url)
    if parts.scheme != "file":
        raise ValueError(f"unsupported storage URL scheme {parts.scheme!r} in {url!r}")
    if parts.netloc not in ("", "localhost"):
        raise ValueError(f"file storage URL must not name a host: {url!r}")
    if parts.query or parts.fragment:
        raise ValueError(f"file storage URL must not have a query or fragment: {url!r}")
    path = unquote(parts.path)
    if not path.startswith("/"):
        raise ValueError(f"file storage URL needs an absolute path: {url!r}")
    return Path(path)


def open_file_storage(url: str, default_config: LogConfig, clock: Callable[[], int]) -> Storage:
    """The managed ledger on local files under the directory ``url`` names."""
    return LogManager(storage_path_from_url(url), default_config, clock=clock)


ENGINES: Mapping[str, Opener] = {
    "file": open_file_storage,
    "memory": open_memory_storage,
    "postgres": open_postgres_storage,
    "postgresql": open_postgres_storage,
}
"""URL scheme -> engine opener."""


def shown_url(url: str) -> str:
    """``url`` without its password, for error messages (any string is accepted)."""
    try:
        return public_url(url)
    except ValueError:  # a port that is not a number
        return url.split("://", 1)[0] + "://..."


def storage_scheme(url: str) -> str:
    """The engine scheme of ``url`` (``file`` for a plain path); ValueError if unknown."""
    scheme = urlsplit(url).scheme if "://" in url or url.startswith("file:") else "file"
    if scheme not in ENGINES:
        raise ValueError(f"unsupported storage URL scheme {scheme!r} in {shown_url(url)!r} "
                         f"(known: {', '.join(sorted(ENGINES))})")
    return scheme


def open_storage(
    url: str,
    default_config: LogConfig | None = None,
    *,
    clock: Callable[[], int] = wall_clock_ms,
) -> Storage:
    """Open the storage named by ``url`` with the engine its scheme selects."""
    return ENGINES[storage_scheme(url)](url, default_config or LogConfig(), clock)
