"""``flush_together``: flush many partitions at once, with one ``syncfs`` per file
system instead of an fsync per file (``PartitionLog.flush_begin`` / ``flush_end``)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Protocol

from .fsutil import sync_file_system_of
from .partition import PartitionLog
from .partition_files import FlushPoint

logger = logging.getLogger(__name__)


FLUSH_TOGETHER_MIN = 16
"""From this many partitions on, a flush of them all syncs their file system once
(``syncfs``: about the cost of one fsync) instead of fsyncing each file."""


def flush_together(stores: Sequence[_Flushable]) -> list[bool | OSError]:
    """Flush several partitions at once (from a worker thread): the flush points of all,
    one ``syncfs`` per file system they are on, then each records its flush. A failed
    syncfs falls back to fsyncing each file, so that a failure takes only its own
    partition offline. Other engines' partitions (and fewer than ``FLUSH_TOGETHER_MIN``)
    are flushed one by one. For each, whether it wrote a checkpoint, or its error."""
    logs = [store for store in stores if isinstance(store, PartitionLog)]
    if len(logs) < FLUSH_TOGETHER_MIN:
        return [_flush_one(store) for store in stores]
    if len(logs) < len(stores):
        together = iter(flush_together(logs))
        return [next(together) if isinstance(store, PartitionLog) else _flush_one(store)
                for store in stores]
    points: list[FlushPoint | OSError | None] = []
    for log in logs:
        try:
            points.append(log.flush_begin())
        except OSError as exc:
            points.append(exc)
    started = [point for point in points if isinstance(point, FlushPoint)]
    try:
        synced = _sync_devices(started)
        outcomes: list[bool | OSError] = []
        for log, point in zip(logs, points, strict=True):
            if point is None or isinstance(point, OSError):
                outcomes.append(point or False)
                continue
            try:
                if not synced:
                    for item in point.files:
                        log._fsync(item.fd)
                outcomes.append(log.flush_end(point))
            except OSError as exc:
                outcomes.append(exc)
        return outcomes
    finally:
        for point in started:
            point.release()


def _sync_devices(points: Sequence[FlushPoint]) -> bool:
    """syncfs once per file system the points' files are on; False if one failed (the
    caller then fsyncs each file to find whose write failed)."""
    devices: dict[int, int] = {}
    for point in points:
        for item in point.files:
            devices.setdefault(os.fstat(item.fd).st_dev, item.fd)
    try:
        for fd in devices.values():
            sync_file_system_of(fd)
    except OSError as exc:
        logger.warning("storage: syncfs failed (%s); fsyncing each partition instead", exc)
        return False
    return True


class _Flushable(Protocol):
    def flush(self) -> bool: ...


def _flush_one(store: _Flushable) -> bool | OSError:
    try:
        return store.flush()
    except OSError as exc:
        return exc
