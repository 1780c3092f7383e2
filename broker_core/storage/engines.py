"""Choosing a storage engine by URL.

``file:///abs/path`` (or a plain path) opens the local-file managed ledger. Other
engines (for example a PostgreSQL one shared by several brokers) plug in here under
their own URL scheme.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlsplit

from .config import LogConfig
from .log_manager import LogManager
from .partition import wall_clock_ms


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


def open_storage(
    url: str,
    default_config: LogConfig | None = None,
    *,
    clock: Callable[[], int] = wall_clock_ms,
) -> LogManager:
    """Open the storage named by ``url`` (``file:///abs/path`` or a plain path)."""
    path = storage_path_from_url(url)
    return LogManager(path, default_config or LogConfig(), clock=clock)
