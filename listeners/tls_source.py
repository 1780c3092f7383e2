"""The server context of TLS listeners, built again when its files change: certificates
rotated under a running broker (cert-manager's short-lived ones) reach new connections
without a restart, as Kafka reloads its key and trust stores at runtime (KIP-226).

A :class:`TlsContextSource` wraps the function that builds a context from files (the one
start-up uses; or the contexts of several kinds of listener from the same files, which
then succeed or fail together, with one line) and the paths it reads. When a connection is
accepted it stats those files (device, inode, size, modification time), at most once per
:data:`CHECK_SECONDS`; when they changed it builds a fresh context and gives it to the
connections accepted from then on. The context in use is never loaded again in place (a
key half written would leave certificate and key mismatched in it), and connections
already open keep their session. A build that fails (files half written, a key of another
certificate) keeps the previous context with one WARNING per change of the files; the next
change is tried again. ``check("SIGHUP")`` (the broker's SIGHUP) builds again whatever the
files say."""

from __future__ import annotations

import logging
import os
import ssl
import time
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

Built = TypeVar("Built")
"""What a source builds from the files: a server context, or a mapping of them."""
CHECK_SECONDS = 1.0
"""How often, at most, accepting a connection looks at the files (a few ``stat`` calls)."""

FileStamp = tuple[int, int, int, int] | str
"""A file's device, inode, size and modification time (ns), or why it cannot be read."""


def file_stamps(paths: Iterable[str]) -> tuple[FileStamp, ...]:
    """The stamp of each path (through symbolic links: Kubernetes swaps a secret's files
    by moving a link)."""
    stamps: list[FileStamp] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError as exc:
            stamps.append(exc.strerror or type(exc).__name__)
        else:
            stamps.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(stamps)


class TlsContextSource(Generic[Built]):
    """The current server context of TLS listeners (or contexts), built by ``build`` from
    ``files``.

    ``build`` raises ValueError, OSError or ssl.SSLError when the files cannot be used; at
    construction that error propagates (the broker does not start), later it is logged and
    the previous context stays. ``name`` says whose context it is in the log lines."""

    def __init__(self, name: str, build: Callable[[], Built], files: Iterable[str],
                 check_seconds: float = CHECK_SECONDS) -> None:
        self.name = name
        self.files = tuple(dict.fromkeys(path for path in files if path))
        self.check_seconds = check_seconds
        self._build = build
        self._stamps = file_stamps(self.files)
        self._context = build()
        self._failed: tuple[FileStamp, ...] | None = None
        """The stamps of files that failed to build (logged once), until they change."""
        self._checked = time.monotonic()

    def current(self) -> Built:
        """The context for a connection accepted now (after a look at the files if the
        last one is :attr:`check_seconds` old)."""
        now = time.monotonic()
        if now - self._checked >= self.check_seconds:
            self._checked = now
            self.check()
        return self._context

    def check(self, forced_by: str | None = None) -> bool:
        """Build a fresh context if the files changed since the last build (``forced_by``:
        whether or not they did, on that request, e.g. ``"SIGHUP"``); True when a fresh one
        is served from now on."""
        stamps = file_stamps(self.files)  # before the build: a change during it is seen next
        if forced_by is None and stamps in (self._stamps, self._failed):
            return False
        why = forced_by or "the files changed"
        try:
            context = self._build()
        except (ValueError, OSError, ssl.SSLError) as exc:
            self._failed = stamps
            log.warning("cannot reload the TLS files of %s (%s), the previous certificate is "
                        "still served (tried again when they change): %.500s", self.name, why,
                        exc)
            return False
        self._context = context
        self._stamps = stamps
        self._failed = None
        log.info("reloaded the TLS files of %s (%s): new connections get the certificate "
                 "and trusted CAs they hold now", self.name, why)
        return True
