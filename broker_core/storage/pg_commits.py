"""Group commit of the PostgreSQL engine: the appends of the partitions of one storage
that wait at the same time are committed together, in one statement (one transaction),
as the file engine groups the fsyncs of concurrent producers.

The partitions are spread over ``LANES`` lanes (by partition id), each a queue with a
worker thread and a transaction of its own: a partition's appends are always committed in
order by one worker, while the lanes' commits overlap (the database inserts one lane's
rows while another's commit waits for its WAL flush, on more than one core). With one
lane, a trial of 200,000 records of 1 KiB over four partitions produced about 80,000
records/s; with two, about 93,000 (the bench's PostgreSQL rows, two cores).

An append (``PgPartition``) takes its offsets at once, in order, from the partition's
*assigned* end, and queues a :class:`Pending` in its lane; its producer waits on a
:class:`Ticket` (an asyncio future on the event loop, an event elsewhere). A worker
takes everything queued in its lane (up to ``_GROUP_BYTES`` and ``MAX_ENTRIES``) and
commits it in one statement (``_commit_statement``: one round trip, its own transaction):
it moves the row of each partition in ``edge_partitions``, only from the offset its first
append expected and by the owner at the epoch that append was made at (the fencing
token), and inserts the entry rows of the partitions that moved, all or nothing. Then:

- a partition that moved has its *committed* end (``next_offset``, the high watermark)
  moved past its appends, and only then are they answered: a fetch never sees an offset
  before its commit;
- a partition that did not move (another broker took it: :class:`AppendFenced`, answered
  NOT_LEADER_OR_FOLLOWER; or an earlier append failed), or every partition of a group
  whose statement failed (the database went away: the commit's outcome is unknown),
  fails its appends with :class:`DatabaseUnavailable` (clients retry), is marked stale
  and gets a new *generation*: appends queued behind them at the old generation fail
  without being sent, and the partition's row is reloaded before its next append (so
  offsets go on from what is stored, whether or not a commit whose reply was lost
  happened).

While a lane's worker commits one group, the next one gathers: under load a commit
carries every append of the lane that arrived during the one before it.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from .errors import AppendAbandoned, AppendFenced, DatabaseUnavailable, LogClosed
from .pg_database import Database
from .pg_entries import MAX_ENTRIES, entry_params, insert_entries

log = logging.getLogger(__name__)

_GROUP_BYTES = 32 << 20
"""Most batch bytes in one commit (at least one append, whatever its size)."""
LANES = 2
"""Group commits under way at once (each partition's in one of them)."""

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
    one round trip): ``_MOVE``, and the entry rows of the partitions it moved (the ids it
    returns: the sub-statements of a statement share one snapshot, and only ``RETURNING``
    passes rows between them), all or nothing; the ids moved."""
    return (f"WITH moved AS ({_MOVE}), stored AS ({insert_entries(entries)}"
            " WHERE e.partition_id IN (SELECT id FROM moved)) SELECT id FROM moved")


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


class _Lane:
    """One queue of appends and the worker thread that commits it, a group at a time."""

    def __init__(self, commit: Callable[[list[Pending]], None], name: str) -> None:
        self._commit = commit
        self._name = name
        self._wake = threading.Condition()
        self._queue: list[Pending] = []
        self._closed = False
        self._thread: threading.Thread | None = None

    def submit(self, pending: Pending) -> None:
        with self._wake:
            if self._closed:
                raise LogClosed("the storage is closed")
            self._queue.append(pending)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name,
                                                daemon=True)
                self._thread.start()
            self._wake.notify()

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _take(self) -> list[Pending] | None:
        with self._wake:
            while not self._queue and not self._closed:
                self._wake.wait()
            if not self._queue:
                return None
            taken = size = 0
            for pending in self._queue:
                if taken and (size + len(pending.batch) > _GROUP_BYTES
                              or taken == MAX_ENTRIES):
                    break
                taken += 1
                size += len(pending.batch)
            group, self._queue = self._queue[:taken], self._queue[taken:]
            return group

    def _run(self) -> None:
        while (group := self._take()) is not None:
            try:
                self._commit(group)
            except BaseException as exc:  # never leave a producer waiting
                log.exception("PostgreSQL group commit failed")
                _finish(group, set(), _as_os_error(exc))


class GroupCommitter:
    """The appends waiting for a commit, in ``lanes`` queues each with the worker thread
    that commits it (started on its first append; :meth:`close` commits what is queued,
    then stops them). A partition's appends always go to the same lane (by its id), so
    they are committed in order; the lanes commit side by side, on connections of their
    own, so that the database inserts one lane's rows while another's commit waits for
    its WAL flush, on as many cores as it has."""

    def __init__(self, db: Database, lanes: int = LANES) -> None:
        self._db = db
        self._lanes = [_Lane(self._commit, f"edge-pg-commit-{n}") for n in range(max(lanes, 1))]

    def submit(self, pending: Pending) -> None:
        """Queue ``pending`` (callers queue a partition's appends in offset order)."""
        self._lanes[pending.owner.partition_id % len(self._lanes)].submit(pending)

    def close(self) -> None:
        """Commit whatever is queued, then stop the workers."""
        for lane in self._lanes:
            lane.close()

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
        try:
            with self._db.autocommit() as conn:
                moved = {int(str(row[0])) for row in conn.execute(
                    _commit_statement(len(entries)), params).fetchall()}
        except (OSError, LogClosed) as exc:
            _finish(entries, set(), _as_os_error(exc))
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
