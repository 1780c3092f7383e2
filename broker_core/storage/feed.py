"""Wake-ups when other brokers sharing the storage change something: the change feed.

A shared engine tells its brokers at once when a change they act on commits (PostgreSQL:
``pg_listen``), so that they need not poll for it fast. Three channels:

- ``CHANGES``: a topic or the broker-wide key-value area changed (``Storage.refresh``);
- ``MARKERS``: a transaction-marker request was queued or removed (``cluster.markers``);
- ``REGISTRY``: a broker registered or left, or a partition changed owner.

A notification can be lost (the feed's connection was down when it was sent), so a
subscriber still looks by itself now and then: slowly while the feed is :attr:`live`, at
its old fast pace while it is not. When the feed goes down and when it comes back, every
subscriber is woken (on coming back: to catch up on what it missed meanwhile).

Engines one process owns (files, memory) have nothing to follow: :data:`NO_FEED` never
wakes anyone and is never live, so their pollers keep their pace.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

CHANGES = "edge_changes"
MARKERS = "edge_markers"
REGISTRY = "edge_registry"
CHANNELS = (CHANGES, MARKERS, REGISTRY)
"""The channels, named as the schema's triggers notify them (``pg_schema``, version 3)."""

Wake = Callable[[], None]
"""Called in the feed's own thread: it must only hand the wake-up to its owner's thread
(say ``loop.call_soon_threadsafe``), never block."""


class ChangeFeed(Protocol):
    """Notifications of other brokers' changes, by channel."""

    @property
    def live(self) -> bool:
        """Whether notifications arrive now (else subscribers poll at their fast pace)."""
        ...

    def subscribe(self, channel: str, wake: Wake) -> None:
        """Call ``wake()`` on each notification of ``channel``, and when the feed goes down
        or comes back."""
        ...


class _NoFeed:
    """The feed of an engine one process owns: nothing to tell."""

    @property
    def live(self) -> bool:
        return False

    def subscribe(self, channel: str, wake: Wake) -> None:
        del channel, wake


NO_FEED: ChangeFeed = _NoFeed()
