"""Retention: which sealed segments of a partition go, decided in two steps.

``retention_due`` reads only (the segments' sizes and newest broker timestamps; on
PostgreSQL a query), so the engine runs it for every partition in a worker thread;
``drop_retained`` then drops what it found due on the event loop, where the reads that
walk a log (fetches, producer-state replays) run, so a log never shrinks under them:
unless the store says :attr:`RetainsSegments.drops_in_thread` (PostgreSQL: the drop is
blocking statements, and a read whose offset the new log start overtakes answers
OFFSET_OUT_OF_RANGE), whose drops, and DeleteRecords, run in a worker thread.
Between the two steps the log may have moved on (appends, DeleteRecords, a cleaner
swap): a :class:`RetentionCut` names the first offset kept, not a count, so dropping
"every sealed segment wholly below it" stays right whatever happened in between.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

from .config import LogConfig


@dataclass(frozen=True)
class RetentionCut:
    """Retention's verdict on one partition: drop its sealed segments that end at or
    before ``keep_from`` (``segments`` of them when it was decided)."""

    keep_from: int
    segments: int


class Retaining(Protocol):
    """Whatever can take retention's second step."""

    @property
    def drops_in_thread(self) -> bool: ...

    def drop_retained(self, cut: RetentionCut) -> int: ...


@dataclass(frozen=True)
class RetentionDue:
    """A partition store and what retention drops of it."""

    store: Retaining
    cut: RetentionCut


def retention_drops(sealed: Sequence[tuple[int, int]], open_size: int, now: int,
                    config: LogConfig) -> int:
    """How many of the oldest sealed segments, given as (size, newest broker timestamp),
    retention drops: by time those whose newest entry is more than ``retention_ms`` old; by
    size the oldest while the partition (with ``open_size`` of the open segment) would
    still hold at least ``retention_bytes`` without them (Kafka's rule). Only a prefix."""
    count = 0
    if config.retention_ms >= 0:
        while count < len(sealed) and now - sealed[count][1] > config.retention_ms:
            count += 1
    if config.retention_bytes >= 0:
        excess = sum(size for size, _ in sealed[count:]) + open_size - config.retention_bytes
        while count < len(sealed) and excess >= sealed[count][0]:
            excess -= sealed[count][0]
            count += 1
    return count


def retention_cut(sealed: Sequence[tuple[int, int, int]], open_first: int, open_size: int,
                  now: int, config: LogConfig) -> RetentionCut | None:
    """The cut of a partition whose sealed segments are (first offset, size, newest broker
    timestamp) in offset order and whose open segment starts at ``open_first`` holding
    ``open_size`` bytes; None when retention drops nothing."""
    count = retention_drops([(size, newest) for _, size, newest in sealed], open_size, now,
                            config)
    if not count:
        return None
    keep_from = sealed[count][0] if count < len(sealed) else open_first
    return RetentionCut(keep_from, count)


class RetainsSegments(ABC):
    """A partition store whose retention runs in the two steps above."""

    drops_in_thread: ClassVar[bool] = False
    """Whether retention's drop and DeleteRecords run in a worker thread (a database's
    blocking transaction; a read overtaken by a drop answers OFFSET_OUT_OF_RANGE), not on
    the event loop (files, which the reads walk there)."""

    @abstractmethod
    def retention_due(self) -> RetentionCut | None:
        """What retention drops now, or None; reads only (any thread)."""

    @abstractmethod
    def drop_retained(self, cut: RetentionCut) -> int:
        """Drop the sealed segments wholly below ``cut.keep_from`` (never the one appends
        go to) and move the log start up to the first kept; how many went. On the event
        loop, or in a worker thread if :attr:`drops_in_thread`."""

    def enforce_retention(self) -> int:
        """Both steps at once; how many segments went."""
        cut = self.retention_due()
        return 0 if cut is None else self.drop_retained(cut)
