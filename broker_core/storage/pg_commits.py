"""Group commit of the PostgreSQL engine: the appends of the partitions of one storage
that wait at the same time are committed together, in one statement (one transaction),
as the file engine groups the fsyncs of concurrent producers.

The partitions are spread over ``LANES`` lanes (by partition id), each a queue with a
worker thread: a partition's appends are committed in order, never two of its groups at
once, while the lanes' commits may overlap (the database inserts one lane's rows while
another's commit waits for its WAL flush, on more than one core). With one lane, a trial
of 200,000 records of 1 KiB over four partitions produced about 80,000 records/s; with
two, about 93,000 (the bench's PostgreSQL rows, two cores).

The lanes adapt to the backlog. A commit costs the broker a fixed part besides what its
appends cost, so fewer, larger commits cost less CPU per record; when a broker's load is small
(the load shared by several brokers) two lanes each committing a few appends would double
its commits. So a lane commits beside another lane's commit under way only when there is
a backlog (``OPEN_APPENDS`` appends or ``OPEN_BYTES`` waiting in all lanes) or its oldest
append has waited ``GATHER_S`` (a commit held up, say on a lock, holds up no other lane
for longer); else its appends wait for that commit to end, and the next commit, started
when none is under way, takes the appends of every lane (without a backlog; with one,
each lane takes its own, side by side). In trials on two shared cores, three brokers
sharing 400,000 records (256 KiB batches) on one server made commits of about 2-4 appends
each instead of 1.2-2.1; appends made straight into this storage, one to each of four
partitions every 10 ms (16 KiB) or 50 ms (256 KiB), were committed 4 at a time instead of
2, for about a quarter (16 KiB) and a tenth (256 KiB) less CPU each: the larger the
batches, the more their bytes cost beside their commits.

An append (``PgPartition``) takes its offsets at once, in order, from the partition's
*assigned* end, and queues a :class:`Pending` in its lane; its producer waits on a
:class:`Ticket` (an asyncio future on the event loop, an event elsewhere). A worker takes
what is queued in its lane, or in every lane (above; up to ``_GROUP_BYTES`` and
``MAX_ENTRIES``), and commits it in one statement (``_commit_statement``: one round trip,
its own transaction): it moves the row of each partition in ``edge_partitions``, only
from the offset its first append expected and by the owner at the epoch that append was
made at (the fencing token), and inserts the entry rows of the partitions that moved, all
or nothing. Then:

- a partition that moved has its *committed* end (``next_offset``, the high watermark)
  moved past its appends, and only then are they answered: a fetch never sees an offset
  before its commit;
- a partition that did not move (another broker took it: :class:`AppendFenced`, answered
  NOT_LEADER_OR_FOLLOWER; or an earlier append failed: nothing of it is stored), or every
  partition of a group whose statement failed once sent (the database went away: the
  commit's outcome is unknown, :class:`CommitUnknown`; one that never got a connection
  was not sent), fails its appends with :class:`DatabaseUnavailable` (clients retry), is
  marked stale
  and gets a new *generation*: appends queued behind them at the old generation fail
  without being sent, and the partition's row is reloaded before its next append (so
  offsets go on from what is stored, whether or not a commit whose reply was lost
  happened).

While one group is committed, the next one gathers: under load a commit carries every
append that arrived during the one before it.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from .errors import (
    AppendAbandoned,
    AppendFenced,
    CommitUnknown,
    DatabaseUnavailable,
    LogClosed,
)
from .pg_database import Database
from .pg_entries import MAX_ENTRIES, entry_params, stored_entries

log = logging.getLogger(__name__)

_GROUP_BYTES = 32 << 20
"""Most batch bytes in one commit (at least one append, whatever its size)."""
LANES = 2
"""Group commits under way at once, at most (each partition's in one of them)."""
OPEN_APPENDS = 8
"""Appends waiting (in all lanes) from which a lane commits side by side with another
lane's commit under way; fewer wait for that commit to end, and are committed together."""
OPEN_BYTES = 2 << 20
"""The same in batch bytes: large batches cost more than their commit, and the lanes'
overlap is what makes their throughput (a single broker's PostgreSQL rows)."""
GATHER_S = 0.01
"""Longest an append waits for another lane's commit to end before its lane commits all
the same (a commit held up, say on a lock, holds up no other lane for longer)."""

_MOVE = (
    "UPDATE edge_partitions p SET next_offset = w.next, size_bytes = p.size_bytes + w.added,"
    " segment_base = w.seg, segment_size = w.seg_size, segment_created_ms = w.created"
    " FROM unnest(%b::bigint[], %b::bigint[], %b::bigint[], %b::bigint[], %b::bigint[],"
    "  %b::bigint[], %b::bigint[], %b::bigint[])"
    "  AS w(id, expect, next, epoch, added, seg, seg_size, created)"
    " WHERE p.id = w.id AND p.next_offset = w.expect"
    " AND p.owner_epoch = coalesce(w.epoch, p.owner_epoch) RETURNING p.id")
"""The partitions' rows of one group commit, each moved only from the offset its first
append expected and by the owner at the epoch that append was made at; its parameters,
one array each: ids, offsets expected, next offsets, epochs, bytes added, and the segment
after the appends (base, size, created ms)."""


@functools.lru_cache(maxsize=64)
def _commit_statement(entries: int) -> str:
    """One group commit of ``entries`` appends, in one statement (its own transaction,
    one round trip): ``_MOVE``, and the entry rows of the partitions it moved, with their
    segments' summaries (the ids it returns: the sub-statements of a statement share one
    snapshot, and only ``RETURNING`` passes rows between them), all or nothing; the ids
    moved."""
    return (f"WITH moved AS ({_MOVE}), "
            f"{stored_entries(entries, ' WHERE e.partition_id IN (SELECT id FROM moved)')}"
            " SELECT id FROM moved")


_FENCED = (
    "SELECT p.id FROM edge_partitions p"
    " JOIN unnest(%b::bigint[], %b::bigint[]) AS w(id, epoch) ON p.id = w.id"
    " WHERE w.epoch IS NOT NULL AND p.owner_epoch <> w.epoch")
"""Of the partitions (ids, epochs) that did not move, those another owner took (their
epoch changed): a statement after the commit's, so that it sees the takeover that kept
them from moving."""


class Ticket:
    """What the producer of one append waits on: ``future`` on an event loop (made there),
    else ``event``; ``error`` is set before either is done when the append failed."""

    __slots__ = ("error", "event", "future", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.loop = loop
        self.future: asyncio.Future[None] | None = None if loop is None else loop.create_future()
        self.event: threading.Event | None = threading.Event() if loop is None else None
        self.error: OSError | None = None

    def wait(self) -> None:
        """Block until the append is committed (raise its error if it failed)."""
        assert self.event is not None
        self.event.wait()
        if self.error is not None:
            raise self.error


class Appender(Protocol):
    """The partition of a pending append, as the worker sees it."""

    @property
    def partition_id(self) -> int: ...

    @property
    def generation(self) -> int: ...

    @property
    def epoch(self) -> int | None:
        """The owner epoch it writes at now (None: given up, or outside a cluster)."""

    def committed(self, appends: list[Pending]) -> None:
        """Its ``appends`` (in order, all of one generation) were committed."""

    def failed(self, appends: list[Pending], error: OSError) -> None:
        """Its ``appends`` (in order) failed with ``error``."""


@dataclass(slots=True)
class Pending:
    """One queued append: the batch at its offsets, the partition's segment after it, and
    the epoch and generation of the partition it was made at."""

    owner: Appender
    generation: int
    epoch: int | None
    base: int
    last: int
    segment: tuple[int, int, int]
    now: int
    max_timestamp: int
    batch: bytearray
    ticket: Ticket


def _settle(done: list[tuple[asyncio.Future[None], OSError | None]]) -> None:
    """Answer the appends of one group that wait on this event loop."""
    for future, error in done:
        if future.done():
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)


def _as_os_error(exc: BaseException) -> OSError:
    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, LogClosed):
        return DatabaseUnavailable(errno.ESHUTDOWN, "the storage is closed")
    return DatabaseUnavailable(errno.EIO, f"PostgreSQL group commit failed: {exc!r}"[:200])


def _unknown(exc: BaseException) -> OSError:
    """The error of a commit that failed after its statement was sent: its outcome is
    unknown (:class:`CommitUnknown`), but when the storage is closing (nobody is left to
    read it back)."""
    error = _as_os_error(exc)
    if isinstance(exc, LogClosed):
        return error
    return CommitUnknown(error.errno, error.strerror or str(error))


def _finish(appends: list[Pending], moved: set[int], error: OSError,
            fenced: frozenset[int] | set[int] = frozenset()) -> None:
    """Record each partition's outcome (``moved``: committed; ``fenced``: another owner
    took it, :class:`AppendFenced`; else ``error``), then answer the producers: one
    callback per event loop."""
    runs: dict[int, list[Pending]] = {}
    for pending in appends:
        runs.setdefault(id(pending.owner), []).append(pending)
    waiting: dict[asyncio.AbstractEventLoop, list[
        tuple[asyncio.Future[None], OSError | None]]] = {}
    for run in runs.values():
        owner = run[0].owner
        ok = owner.partition_id in moved
        outcome: OSError | None = None
        if ok:
            owner.committed(run)
        else:
            outcome = error if owner.partition_id not in fenced else AppendFenced(
                errno.ESTALE, "another broker took the partition before the append "
                              "was committed")
            owner.failed(run, outcome)
        for pending in run:
            ticket = pending.ticket
            ticket.error = outcome
            if ticket.loop is not None and ticket.future is not None:
                waiting.setdefault(ticket.loop, []).append((ticket.future, ticket.error))
            elif ticket.event is not None:
                ticket.event.set()
    for loop, done in waiting.items():
        call: Callable[[list[tuple[asyncio.Future[None], OSError | None]]], None] = _settle
        try:
            loop.call_soon_threadsafe(call, done)
        except RuntimeError:  # the loop is closed: nobody waits any more
            continue


class _Lanes:
    """The lanes' queues and their worker threads (one a lane, started on the first
    append), under one lock: which lane commits when (see :class:`GroupCommitter`)."""

    def __init__(self, commit: Callable[[list[Pending]], None], lanes: int) -> None:
        self._commit = commit
        self._lock = threading.Lock()
        self._wake = [threading.Condition(self._lock) for _ in range(lanes)]
        self._queues: list[list[Pending]] = [[] for _ in range(lanes)]
        self._since = [0.0] * lanes  # when the oldest append of each queue was queued
        self._busy = [False] * lanes  # a commit under way holds appends of the lane
        self._bytes = 0  # batch bytes queued in all lanes
        self._closed = False
        self._threads: list[threading.Thread] = []

    def submit(self, lane: int, pending: Pending) -> None:
        with self._lock:
            if self._closed:
                raise LogClosed("the storage is closed")
            queue = self._queues[lane]
            if not queue:
                self._since[lane] = time.monotonic()
            queue.append(pending)
            self._bytes += len(pending.batch)
            if not self._threads:
                self._threads = [
                    threading.Thread(target=self._run, args=(n,), daemon=True,
                                     name=f"edge-pg-commit-{n}")
                    for n in range(len(self._queues))]
                for thread in self._threads:
                    thread.start()
            self._wake[lane].notify()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for wake in self._wake:
                wake.notify()
            threads = self._threads
        for thread in threads:
            thread.join()

    def _take(self, lane: int) -> tuple[list[int], list[Pending]] | None:
        """Wait until ``lane`` may commit, then take its group: the lanes it takes appends
        of (each marked busy) and those appends; None once closed with nothing left."""
        with self._lock:
            while True:
                queue, timeout = self._queues[lane], None
                if queue and not self._busy[lane]:
                    if self._closed or not any(self._busy):
                        return self._cut(self._gather(lane))
                    timeout = self._since[lane] + GATHER_S - time.monotonic()
                    if timeout <= 0 or self._backlog():
                        return self._cut([lane])  # open side by side with the commit under way
                elif self._closed and not queue:
                    return None
                self._wake[lane].wait(timeout)

    def _backlog(self) -> bool:
        """Enough waiting (in all lanes) for lanes to commit side by side."""
        return (self._bytes >= OPEN_BYTES
                or sum(len(queue) for queue in self._queues) >= OPEN_APPENDS)

    def _gather(self, lane: int) -> list[int]:
        """The lanes a commit starting in ``lane`` (no other commit under way) takes: its
        own; and, without a backlog, every other lane with appends waiting (one commit
        carries them instead of one a lane)."""
        if self._backlog():
            return [lane]
        return [lane, *(n for n, queue in enumerate(self._queues) if queue and n != lane)]

    def _cut(self, lanes: list[int]) -> tuple[list[int], list[Pending]]:
        """Take a group: the appends queued in ``lanes`` (from the first; up to
        ``_GROUP_BYTES`` and ``MAX_ENTRIES``); the lanes taken from, marked busy."""
        taken_from: list[int] = []
        group: list[Pending] = []
        size = 0
        for lane in lanes:
            queue = self._queues[lane]
            taken = 0
            for pending in queue:
                if group and (size + len(pending.batch) > _GROUP_BYTES
                              or len(group) == MAX_ENTRIES):
                    break
                group.append(pending)
                taken += 1
                size += len(pending.batch)
            if taken:
                taken_from.append(lane)
                self._busy[lane] = True
                self._queues[lane] = queue[taken:]
                self._bytes -= sum(len(pending.batch) for pending in queue[:taken])
                if self._queues[lane]:
                    self._since[lane] = time.monotonic()
        return taken_from, group

    def _run(self, lane: int) -> None:
        while (taken := self._take(lane)) is not None:
            lanes, group = taken
            try:
                self._commit(group)
            except BaseException as exc:  # never leave a producer waiting
                log.exception("PostgreSQL group commit failed")
                _finish(group, set(), _unknown(exc))  # it may have been sent
            finally:
                with self._lock:
                    for n in lanes:
                        self._busy[n] = False
                    for n, queue in enumerate(self._queues):
                        if queue:
                            self._wake[n].notify()


class GroupCommitter:
    """The appends waiting for a commit, in ``lanes`` queues each with a worker thread
    (started on the first append; :meth:`close` commits what is queued, then stops them).
    A partition's appends always go to the same lane (by its id), and a lane's appends are
    in one commit under way at most, so they are committed in order. Under a backlog the
    lanes commit side by side, on connections of their own, so that the database inserts
    one lane's rows while another's commit waits for its WAL flush, on as many cores as it
    has; with few appends waiting, one commit takes every lane's (the module's docstring)."""

    def __init__(self, db: Database, lanes: int = LANES) -> None:
        self._db = db
        self._count = max(lanes, 1)
        self._lanes = _Lanes(self._commit, self._count)

    def submit(self, pending: Pending) -> None:
        """Queue ``pending`` (callers queue a partition's appends in offset order)."""
        self._lanes.submit(pending.owner.partition_id % self._count, pending)

    def close(self) -> None:
        """Commit whatever is queued, then stop the workers."""
        self._lanes.close()

    def _commit(self, group: list[Pending]) -> None:
        by_partition: dict[int, list[Pending]] = {}
        stale: list[Pending] = []
        for pending in group:
            if pending.generation != pending.owner.generation:
                stale.append(pending)  # an earlier append of its partition failed
            else:
                by_partition.setdefault(pending.owner.partition_id, []).append(pending)
        if stale:
            # given up since (another broker takes it): the producer goes to the new owner;
            # else an earlier append failed, and that failure is the cause
            given_up = {id(p.owner) for p in stale
                     if p.epoch is not None and p.owner.epoch != p.epoch}
            _finish(stale, set(), AppendAbandoned(
                errno.ESTALE, "an earlier append to the partition failed"),
                {p.owner.partition_id for p in stale if id(p.owner) in given_up})
        if not by_partition:
            return
        runs = list(by_partition.values())
        entries = [p for run in runs for p in run]
        ids = [run[0].owner.partition_id for run in runs]
        epochs = [run[0].epoch for run in runs]
        params = [
            ids, [run[0].base for run in runs], [run[-1].last + 1 for run in runs], epochs,
            [sum(len(p.batch) for p in run) for run in runs],
            [run[-1].segment[0] for run in runs], [run[-1].segment[1] for run in runs],
            [run[-1].segment[2] for run in runs],
            *entry_params([(p.owner.partition_id, p.base, p.last, p.segment[0], p.now,
                            p.max_timestamp, p.batch) for p in entries])]
        sent = False
        try:
            with self._db.autocommit() as conn:
                sent = True  # from here on, the database may have committed it
                moved = {int(str(row[0])) for row in conn.execute(
                    _commit_statement(len(entries)), params).fetchall()}
        except (OSError, LogClosed) as exc:
            _finish(entries, set(), _unknown(exc) if sent else _as_os_error(exc))
            return
        _finish(entries, moved, DatabaseUnavailable(
            errno.ESTALE, "an earlier append to the partition failed"),
            self._fenced(ids, epochs) if len(moved) < len(runs) else frozenset())

    def _fenced(self, ids: list[int], epochs: list[int | None]) -> set[int]:
        """Of the partitions of a commit that did not move, those another owner took
        (none if that cannot be told now: their appends fail as DatabaseUnavailable,
        retriable, all the same)."""
        try:
            with self._db.autocommit() as conn:
                return {int(str(row[0])) for row in conn.execute(_FENCED, (ids, epochs))}
        except (OSError, LogClosed):
            return set()
