"""Long-poll support: fetches wait for appends to the partitions they read, not for a timer."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

TopicPartition = tuple[str, int]


class AppendWaiters:
    """Futures parked per partition, completed when that partition gets new records."""

    def __init__(self) -> None:
        self._waiting: dict[TopicPartition, set[asyncio.Future[None]]] = {}

    def notify(self, key: TopicPartition) -> None:
        """Wake every fetch waiting on ``key``."""
        futures = self._waiting.pop(key, None)
        if futures:
            for future in futures:
                if not future.done():
                    future.set_result(None)

    def notify_all(self) -> None:
        """Wake every waiting fetch (at shutdown)."""
        for key in list(self._waiting):
            self.notify(key)

    async def wait_any(self, keys: Iterable[TopicPartition], timeout: float) -> bool:
        """Wait until one of ``keys`` is appended to or ``timeout`` seconds pass.

        Return True when woken by an append.
        """
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        registered = list(dict.fromkeys(keys))
        for key in registered:
            self._waiting.setdefault(key, set()).add(future)
        try:
            await asyncio.wait_for(future, timeout)
            return True
        except TimeoutError:
            return False
        finally:
            for key in registered:
                parked = self._waiting.get(key)
                if parked is not None:
                    parked.discard(future)
                    if not parked:
                        del self._waiting[key]
