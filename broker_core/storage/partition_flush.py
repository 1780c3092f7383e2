"""``flush_together`` and ``close_together``: flush or close many partitions at once, with
one ``syncfs`` per file system instead of an fsync per file (``PartitionLog.flush_begin``
/ ``flush_end``, ``close_begin`` / ``ClosePoint.finish``)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from typing import Protocol

from .fsutil import fsync_dir, sync_file_system_of
from .partition import PartitionLog
from .partition_files import ClosePoint, FlushPoint

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
        synced = _sync_devices(item.fd for point in started for item in point.files)
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


def close_together(logs: Sequence[PartitionLog]) -> list[OSError | None]:
    """Close several partitions at once (a clean stop of 10,000 written partitions): each
    seals its open ledger and writes its metadata to a temp file, one ``syncfs`` per file
    system makes all of that durable, each renames its metadata into place, and one more
    makes the renames durable: 2 syncs instead of 3 fsyncs per partition, and a crash at
    any point leaves each partition with its old metadata or its new one, durable with
    the ledgers it describes. A failed syncfs falls back to fsyncing each file (and each
    directory), so a failure marks only its own partition; fewer than
    ``FLUSH_TOGETHER_MIN`` close one by one. For each, its error or None."""
    if len(logs) < FLUSH_TOGETHER_MIN:
        return [_close_one(log) for log in logs]
    outcomes: list[OSError | None] = [None] * len(logs)
    begun: list[tuple[int, ClosePoint]] = []
    for position, log in enumerate(logs):
        try:
            point = log.close_begin()
        except OSError as exc:
            outcomes[position] = exc
            continue
        if point is not None:
            begun.append((position, point))
    together = len(begun) >= FLUSH_TOGETHER_MIN
    try:
        synced = together and _sync_devices(
            item.fd for _, point in begun for item in point.files)
        installed: list[tuple[int, ClosePoint]] = []
        for position, point in begun:
            try:
                point.finish(synced)
                installed.append((position, point))
            except OSError as exc:
                outcomes[position] = exc
        if together and _sync_devices(
                item.fd for _, point in installed for item in point.files):
            return outcomes
        for position, point in installed:
            try:
                fsync_dir(point.temp.parent)
            except OSError as exc:
                outcomes[position] = exc
        return outcomes
    finally:
        for _, point in begun:
            point.release()


def _close_one(log: PartitionLog) -> OSError | None:
    try:
        log.close()
    except OSError as exc:
        return exc
    return None


def _sync_devices(fds: Iterable[int]) -> bool:
    """syncfs once per file system the open files ``fds`` are on; False if one failed
    (the caller then fsyncs each file to find whose write failed)."""
    devices: dict[int, int] = {}
    for fd in fds:
        devices.setdefault(os.fstat(fd).st_dev, fd)
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
