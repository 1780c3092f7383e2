"""The engine's background work: taking in what other brokers changed in a shared
storage, retention, the log cleaner's rounds, producer-state snapshots with the expiry of
idle producer ids, and the sum of each tenant's stored bytes.

:class:`BackgroundWork` starts these loops when the engine starts and stops them when it
stops; the engine's ``stop`` awaits the last round of each (``await_*``) among its steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from broker_core.compaction.cleaner import LogCleaner
from broker_core.durability import FlushScheduler
from broker_core.engine_config import EngineConfig
from broker_core.producer_states import ProducerStates
from broker_core.quotas.limits import TenantLimits
from broker_core.storage import PartitionStore, Storage, StorageError
from broker_core.storage.feed import CHANGES
from broker_core.storage.retention import RetentionCut, RetentionDue
from broker_core.wakeup import Wakeup
from common.log_fields import topic_fields

log = logging.getLogger(__name__)
CHECKPOINT_CHECK_S = 1.0
"""How often partitions are checked for a due producer-state snapshot."""
REFRESH_INTERVAL_S = 0.25
"""How often the storage is asked what other brokers sharing it changed while its change
feed is not live (``storage.feed``): their topic, ACL and config changes take effect here
within a second. While it is live, it is asked when the feed says so. A storage no other
broker shares (files, memory) is never asked: nothing changes it behind this broker."""
REFRESH_SAFETY_S = 5.0
"""How often the storage is asked anyway while its change feed is live."""


class BackgroundWork:
    """The engine's loops, their tasks and the cleaner's thread."""

    def __init__(self, config: EngineConfig, logs: Storage, producers: ProducerStates,
                 flusher: FlushScheduler, cleaner: LogCleaner,
                 forget_topic: Callable[[str, Sequence[PartitionStore]], None],
                 kv_readers: list[Callable[[], Awaitable[None]]]) -> None:
        self.config = config
        self.logs = logs
        self.producers = producers
        self.flusher = flusher
        self.cleaner = cleaner
        self._forget_topic = forget_topic
        self.kv_readers = kv_readers
        self._retention: asyncio.Task[None] | None = None
        self._cleaning: asyncio.Task[None] | None = None
        self._checkpoints: asyncio.Task[None] | None = None
        self._refresher: asyncio.Task[None] | None = None
        self._summing: asyncio.Task[None] | None = None
        self._wake_refresher: Callable[[], None] = lambda: None
        self._stopping = asyncio.Event()
        self._cleaner_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cleaner")

    def start(self, limits: TenantLimits | None) -> None:
        """Start the loops (the tenant usage sum when ``limits`` caps stored bytes)."""
        loop = asyncio.get_running_loop()
        self._retention = loop.create_task(self._retention_loop())
        if self.config.log_cleaner_enable:
            self._cleaning = loop.create_task(self._cleaner_loop())
        self._checkpoints = loop.create_task(self._checkpoint_loop())
        if self.logs.cluster.shared:  # else nobody else changes the storage: nothing to read
            self._refresher = loop.create_task(
                self._refresh_loop(Wakeup(self.logs.feed, CHANGES)))
        if limits is not None:
            self._summing = loop.create_task(limits.keep_summing(self._stopping))

    async def stop(self) -> None:
        """Cancel retention, tell the other loops to end and wait for the cleaner's round;
        the rounds under way of the others are awaited by the ``await_*`` steps."""
        if self._retention is not None:
            self._retention.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._retention
        self._stopping.set()
        self._wake_refresher()
        self.cleaner.stopping.set()
        if self._cleaning is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._cleaning
        self._cleaner_thread.shutdown(wait=False, cancel_futures=True)

    async def await_checkpoints(self) -> None:
        if self._checkpoints is not None:  # let a snapshot being written finish first
            await self._checkpoints

    async def await_summing(self) -> None:
        if self._summing is not None:
            await self._summing

    async def await_refresher(self) -> None:
        if self._refresher is not None:
            await self._refresher

    async def _refresh_loop(self, wakeup: Wakeup) -> None:
        """Take in what other brokers sharing the storage changed, when its feed says so
        (``REFRESH_SAFETY_S`` at the latest) or every ``REFRESH_INTERVAL_S`` while the
        feed is not live: forget deleted topics, let ``kv_readers`` read again. A storage
        that cannot be read (a database away) is logged once, and once more when it can
        be read again."""
        self._wake_refresher = wakeup.set
        failing = kv_pending = False
        while not self._stopping.is_set():
            await wakeup.wait(REFRESH_INTERVAL_S, REFRESH_SAFETY_S)
            if self._stopping.is_set():
                return
            try:
                changes = await asyncio.to_thread(self.logs.refresh)
                for internal, partitions in changes.gone.items():
                    log.info("topic %s was deleted through another broker", internal,
                             extra=topic_fields(internal))
                    self._forget_topic(internal, partitions)
                kv_pending = kv_pending or changes.kv_changed
                if kv_pending:
                    for read_again in self.kv_readers:
                        await read_again()
                    kv_pending = False
            except Exception as exc:  # keep refreshing: the next round retries
                if not failing:
                    reason = exc.strerror if isinstance(exc, OSError) else None
                    log.warning("storage: cannot take in what other brokers changed: %s; "
                                "retrying", reason or exc, exc_info=not isinstance(exc, OSError))
                failing = True
                continue
            if failing:
                log.info("storage: reading what other brokers changed works again")
                failing = False

    async def _retention_loop(self) -> None:
        """Every ``retention_check_interval_ms``: find what retention drops in a worker
        thread (on PostgreSQL a query per partition with sealed segments), drop it here,
        or in a worker thread too where the partition says so (``drops_in_thread``:
        PostgreSQL's transactions)."""
        interval = self.config.retention_check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                removed = await self.retention_round()
            except (StorageError, OSError) as exc:  # the database is away: next round
                log.warning("retention could not run: %s", exc)
                continue
            if removed:
                log.info("retention removed %d ledgers", removed)

    async def retention_round(self) -> int:
        """One round of retention (``_retention_loop``'s): what is due, found in a worker
        thread, held at the high watermark (``due_now``), then dropped. The segments
        dropped."""
        due = self.due_now(await asyncio.to_thread(self.logs.retention_due))
        removed = self.logs.drop_retained(
            [item for item in due if not item.store.drops_in_thread])
        in_thread = [item for item in due if item.store.drops_in_thread]
        if in_thread:
            removed += await asyncio.to_thread(self.logs.drop_retained, in_thread)
        return removed

    def due_now(self, due: Sequence[RetentionDue]) -> list[RetentionDue]:
        """``due`` with each cut kept at or below the offsets held from readers, as Kafka
        deletes only segments below the high watermark: records appended under
        ``flush.messages`` that wait for their fsync are not acknowledged yet, and are
        not dropped before they are (``retention.bytes=0`` would otherwise empty the log
        under them, and their producers be told they were written)."""
        kept = []
        for item in due:
            held = self.flusher.held_from(item.store)
            if held is not None and held < item.cut.keep_from:
                item = RetentionDue(item.store, RetentionCut(held, 0))  # fewer, or none
            kept.append(item)
        return kept

    async def _cleaner_loop(self) -> None:
        """Run the log cleaner in its thread every ``log_cleaner_backoff_ms``."""
        loop = asyncio.get_running_loop()
        interval = self.config.log_cleaner_backoff_ms / 1000
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), interval)
                return
            try:
                await loop.run_in_executor(self._cleaner_thread, self.cleaner.run_once)
            except Exception:  # the next round tries again
                log.exception("the log cleaner failed")

    async def _checkpoint_loop(self) -> None:
        """Snapshot producer state as partitions move on, so a crash replays little; forget
        idle producer ids every ``producer_id_expiration_check_interval_ms``."""
        expire_every = self.config.producer_id_expiration_check_interval_ms / 1000
        expired_at = time.monotonic()
        while not self._stopping.is_set():
            wait = min(CHECKPOINT_CHECK_S, max(expired_at + expire_every - time.monotonic(), 0))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), wait)
                return  # stopping: the shutdown snapshot follows
            try:
                if time.monotonic() - expired_at >= expire_every:
                    expired_at = time.monotonic()
                    self.producers.expire()
                await self.producers.checkpoint(self.flusher.flush)
            except Exception:  # keep taking snapshots; the next round retries
                log.exception("producer state snapshots failed")
