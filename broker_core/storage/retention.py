"""Retention: which segments of a partition go, decided in two steps.

``retention_due`` reads only (the segments' sizes and newest broker timestamps; on
PostgreSQL a query), so the engine runs it for every partition in a worker thread;
``drop_retained`` then drops what it found due on the event loop, where the reads that
walk a log (fetches, producer-state replays) run, so a log never shrinks under them:
unless the store says :attr:`RetainsSegments.drops_in_thread` (PostgreSQL: the drop is
blocking statements, and a read whose offset the new log start overtakes answers
OFFSET_OUT_OF_RANGE), whose drops, and DeleteRecords, run in a worker thread.
Between the two steps the log may have moved on (appends, DeleteRecords, a cleaner
swap): a :class:`RetentionCut` names the first offset kept, not a count, so dropping
"every segment wholly below it" stays right whatever happened in between. As Kafka's
``deleteSegments``, a partition all of whose segments are due, the open one included (an
idle partition past ``retention.ms``), has a new segment rolled at its end and everything
before it dropped: its log start becomes its next offset. A producer's idempotence state
outlives its batches (the producer snapshot the engine keeps is taken again once it names
an offset below the log start: ``producer_states``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

from .config import LogConfig


@dataclass(frozen=True)
class RetentionCut:
    """Retention's verdict on one partition: drop its segments that end at or before
    ``keep_from`` (``segments`` of them when it was decided); the open segment too, rolled
    first, when it still ends there (no append came since: it is as old as was judged)."""

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


def retention_drops(segments: Sequence[tuple[int, int]], now: int, config: LogConfig) -> int:
    """How many of the oldest segments, given as (size, newest broker timestamp) in offset
    order with the open one (appends go to) last, retention drops: by time those whose
    newest entry is more than ``retention_ms`` old; by size the oldest while the partition
    would still hold at least ``retention_bytes`` without them. Only a prefix, and the open
    segment only when it holds something and goes with every sealed one (Kafka's
    ``deletableSegments``: an idle partition's log is emptied by time, and by size only
    with ``retention_bytes`` 0, since what is kept then never falls below a non-empty
    open segment). The open segment is rolled to drop it (:class:`RetainsSegments`)."""
    count = 0
    end = len(segments) - (1 if segments and segments[-1][0] == 0 else 0)
    if config.retention_ms >= 0:
        while count < end and now - segments[count][1] > config.retention_ms:
            count += 1
    if config.retention_bytes >= 0:
        excess = sum(size for size, _ in segments[count:]) - config.retention_bytes
        while count < end and excess >= segments[count][0]:
            excess -= segments[count][0]
            count += 1
    return count


def retention_cut(segments: Sequence[tuple[int, int, int]], next_offset: int, now: int,
                  config: LogConfig) -> RetentionCut | None:
    """The cut of a partition whose segments are (first offset, size, newest broker
    timestamp) in offset order, the open one last, and whose next offset is
    ``next_offset``; None when retention drops nothing. When the open segment goes too,
    the cut keeps from ``next_offset``: the log is emptied, its start moved to its end."""
    count = retention_drops([(size, newest) for _, size, newest in segments], now, config)
    if not count:
        return None
    keep_from = segments[count][0] if count < len(segments) else next_offset
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
        """Drop the segments wholly below ``cut.keep_from`` and move the log start up to
        the first kept; how many went. The open segment goes only if it holds something
        and ends at or before ``cut.keep_from``: a new empty one is rolled at the next
        offset first (as DeleteRecords to the end does). On the event loop, or in a worker
        thread if :attr:`drops_in_thread`."""

    def enforce_retention(self) -> int:
        """Both steps at once; how many segments went."""
        cut = self.retention_due()
        return 0 if cut is None else self.drop_retained(cut)
