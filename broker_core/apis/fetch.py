"""Fetch: read batches from the ledgers, long-polling on appends until ``min_bytes`` arrive.

Sessions (KIP-227) are declined by answering session id 0, so every fetch is a full one:
a request whose session epoch is neither 0 (a new full session) nor -1 (a full fetch
without one) names a session, which cannot exist, and is answered the top-level error
FETCH_SESSION_ID_NOT_FOUND with no partitions (Kafka's answer to an unknown session id,
0 included; INVALID_FETCH_SESSION_EPOCH only comes with a session that exists). A partition
named twice is answered once, where it was first named, as the later entry asks (Kafka
keys the request's partitions in a LinkedHashMap).
A ledger not read since start-up is CRC-checked in a worker thread before its first read;
a fetch at an offset whose stored records are damaged answers CORRUPT_MESSAGE, as Kafka
does for a corrupt record in its log (the client raises it; it is not retried away). A
partition offline after a failed fsync answers KAFKA_STORAGE_ERROR until restart. A Fetch
older than v10 of a topic that stores zstd answers UNSUPPORTED_COMPRESSION_TYPE (KIP-110).
A fetch reads up to the high watermark the fsync policy lets readers see
(``FlushScheduler.high_watermark``): an append whose producer waits for its fsync is
served once that fsync is done.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kafka.protocol.consumer import FetchRequest

from broker_core import metrics
from broker_core.codec.batch_header import base_offset, last_offset_delta, record_count
from broker_core.codec.fetch_writer import FetchAnswer, PartitionAnswer, TopicAnswer
from broker_core.context import Operation, RequestContext
from broker_core.engine import Engine, settled_anyhow
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.quotas.entities import CONSUMER_BYTE_RATE
from broker_core.stages import Later
from broker_core.storage import DatabaseUnavailable, FileRegion, LogOffline, PartitionStore
from broker_core.storage.errors import DamagedRecords
from broker_core.topic_configs import config_number
from common.frames import Chunk

READ_COMMITTED = 1
FULL_FETCH_EPOCHS = (0, -1)
"""Session epochs of a full fetch (KIP-227): 0 opens a session, -1 asks for none."""
SESSIONS_FROM = 7
"""The first Fetch version with session ids and epochs."""
ZSTD_FETCH_VERSION = 10
"""The first Fetch version whose clients read zstd (KIP-110): older ones get
UNSUPPORTED_COMPRESSION_TYPE for a topic whose ``compression.type`` is zstd, as from
Kafka."""
_ANSWER_OVERHEAD = 64
"""Bytes, with room to spare, that the answer adds around the records per partition and
per topic (offsets, error code, lengths) and once (header, session id)."""


@dataclass(slots=True)
class _Wanted:
    """One requested partition, resolved once per request."""

    topic: str
    internal: str | None
    index: int
    offset: int
    max_bytes: int
    error: ErrorCode
    leader_epoch: int = -1


def _resolve(engine: Engine, ctx: RequestContext, request: FetchRequest) -> list[_Wanted]:
    """The partitions requested, each once: a partition named again keeps its first place
    and takes the later entry's offset and limits."""
    wanted: dict[tuple[str, int], _Wanted] = {}
    for topic in request.topics:
        internal: str | None = None
        error = ErrorCode.NONE
        try:
            internal = engine.tenancy.internal_name(ctx, topic.topic)
            if not engine.tenancy.allowed(ctx, Operation.READ, internal):
                error = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif request.version < ZSTD_FETCH_VERSION and engine.stores_zstd(internal):
                error = ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
        except KafkaApiError as failure:
            error = failure.code
        for part in topic.partitions:
            wanted[(topic.topic, part.partition)] = _Wanted(
                topic.topic, internal, part.partition, part.fetch_offset,
                part.partition_max_bytes, error, part.current_leader_epoch)
    return list(wanted.values())


@dataclass
class _Before:
    """What a fetch waits for, off the event loop, before it reads again: ledgers to scan,
    and commits under way of partitions whose producer state is to be rebuilt (waited for
    once per fetch: a state rebuilt then waits for what is under way then, if any)."""

    unscanned: list[tuple[PartitionStore, int]] = field(default_factory=list)
    commits: list[asyncio.Future[None]] = field(default_factory=list)
    waited: bool = False

    def __bool__(self) -> bool:
        return bool(self.unscanned or self.commits)

    async def settle(self) -> None:
        """Scan, in a worker thread, each ledger noted; wait for the commits noted."""
        loop = asyncio.get_running_loop()
        for partition, offset in self.unscanned:
            await loop.run_in_executor(None, partition.verify_at, offset)
        self.unscanned.clear()
        for commits in self.commits:
            await settled_anyhow(commits)
            self.waited = True
        self.commits.clear()


def _answer(engine: Engine, want: _Wanted, budget: int, first: bool, committed: bool,
            before: _Before) -> tuple[PartitionAnswer, int]:
    """One partition's answer and the bytes it carries (below the last stable offset only,
    with the aborted transactions listed, for read_committed). A partition whose ledger at
    the offset is to be scanned first, or whose producer state is to be rebuilt behind
    commits under way, is noted in ``before`` and answered empty."""
    if want.error != ErrorCode.NONE or want.internal is None:
        return _empty(want.index, want.error or ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), 0
    partition: PartitionStore | None = engine.logs.partition(want.internal, want.index)
    if partition is None:
        return _empty(want.index, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), 0
    if partition.offline:  # a failed fsync: until restart
        return _empty(want.index, ErrorCode.KAFKA_STORAGE_ERROR), 0
    leadership = engine.leadership.leader_error(want.internal, want.index, want.leader_epoch)
    if leadership != ErrorCode.NONE:
        return _empty(want.index, leadership), 0
    # the high watermark: what is written, but for appends waiting for their fsync
    # (flushIntervalMessages reached); an offset between the two is answered empty, as
    # Kafka answers a fetch past its high watermark but within its log
    start, end = partition.log_start_offset, engine.flusher.high_watermark(partition)
    written = partition.next_offset
    if want.offset < start or want.offset > written:
        return _empty(want.index, ErrorCode.OFFSET_OUT_OF_RANGE, end, start), 0
    if partition.needs_verification(want.offset):
        before.unscanned.append((partition, want.offset))
        return _empty(want.index, ErrorCode.NONE, end, start), 0
    commits = None if before.waited else \
        engine.commits_before_state(want.internal, want.index, partition)
    if commits is not None:
        before.commits.append(commits)
        return _empty(want.index, ErrorCode.NONE, end, start), 0
    try:  # rebuilt from storage after a move or a failure: the database may be away
        producers = engine.producers.get(want.internal, want.index, partition)
    except (LogOffline, DatabaseUnavailable):
        return _empty(want.index, ErrorCode.KAFKA_STORAGE_ERROR), 0
    stable = producers.last_stable_offset(end, start)
    upper = stable if committed else end
    limit = min(want.max_bytes, budget)
    readable = want.offset < upper and (limit > 0 or first)
    cleaned_below = producers.cleaned_below  # before the read: the cleaner raises it after
    try:  # it swapped the segments the read may still get the old bytes of
        chunks = partition.read(want.offset, max(limit, 0)) if readable else []
    except DamagedRecords:
        return _empty(want.index, ErrorCode.CORRUPT_MESSAGE, end, start), 0
    except (LogOffline, DatabaseUnavailable):  # offline just now, or the database is away
        return _empty(want.index, ErrorCode.KAFKA_STORAGE_ERROR), 0
    if upper < written:  # read_committed, or records written and not visible yet
        visible = [base_offset(_head(c)) < upper for c in chunks]
        release_batches(c for c, keep in zip(chunks, visible, strict=True) if not keep)
        chunks = [c for c, keep in zip(chunks, visible, strict=True) if keep]
    size = sum(len(chunk) for chunk in chunks)
    if size > limit and not first:
        release_batches(chunks)
        chunks, size = [], 0

    aborted: list[tuple[int, int]] | None = [] if committed else None
    if committed and chunks:
        tail = _head(chunks[-1])
        last = base_offset(tail) + last_offset_delta(tail)
        aborted = producers.aborted_between(want.offset, last + 1, cleaned_below)
    return PartitionAnswer(want.index, 0, end, stable, start, aborted, chunks), size


def _head(batch: Chunk) -> bytes | memoryview:
    """Where a batch's header can be read: the batch itself, or a region's copy of it."""
    if isinstance(batch, bytes | memoryview):
        return batch
    if isinstance(batch, FileRegion):
        return batch.head
    raise TypeError(f"not a batch the log returns: {type(batch).__name__}")


def release_batches(batches: Iterable[Chunk]) -> None:
    """Give back the file regions among ``batches`` (an answer that will not be sent)."""
    for batch in batches:
        if isinstance(batch, FileRegion):
            batch.release()


def _count_out(topic: str, batches: Sequence[Chunk], size: int) -> None:
    """Count the records and bytes of fetched batches (from their headers only)."""
    count = sum(record_count(_head(batch)) for batch in batches)
    metrics.BYTES_OUT.labels(topic).inc(size)
    metrics.MESSAGES_OUT.labels(topic).inc(count)


def _empty(index: int, code: ErrorCode, high_watermark: int = -1,
           log_start: int = -1) -> PartitionAnswer:
    return PartitionAnswer(index, code, high_watermark, high_watermark, log_start)


def _collect(engine: Engine, wanted: list[_Wanted], max_bytes: int, committed: bool,
             before: _Before) -> tuple[list[tuple[PartitionAnswer, int]], int, bool]:
    """Answers for all partitions, total bytes, and whether an error is among them."""
    answers = []
    total = 0
    errored = False
    for want in wanted:
        answer, size = _answer(engine, want, max_bytes - total, total == 0, committed,
                               before)
        total += size
        errored = errored or answer.error != 0
        answers.append((answer, size))
    return answers, total, errored


def _max_bytes(engine: Engine, request: FetchRequest, ctx: RequestContext | None = None
               ) -> int:
    """The records an answer may carry: the request's ``max_bytes``, capped by the broker's
    ``fetchMaxBytes`` (as Kafka's ``fetch.max.bytes``) and, for a caller under a
    ``consumer_byte_rate`` (``ctx``), by what its quota lets through in one answer (as
    Kafka caps it: else an answer larger than that is answered empty, throttled, and
    asked again the same size, forever)."""
    asked = request.max_bytes if request.version >= 3 else 2**31 - 1
    most = min(asked, engine.config.fetch_max_bytes)
    if ctx is not None and engine.limits is not None:
        window = engine.limits.manager.max_in_window(ctx, CONSUMER_BYTE_RATE)
        if window is not None:
            most = min(most, max(int(window), 1))
    return most


def fetch_response_bound(engine: Engine, request: FetchRequest) -> int:
    """The most bytes the answer to ``request`` may hold, known before it runs (a long poll
    holds nothing while it waits, but may read this much when it wakes): the records
    within ``max_bytes`` and the partitions' own limits, or one whole first batch (KIP-74)
    as large as the default ``max.message.bytes`` lets a producer write, and the rest."""
    topics = request.topics or []  # null arrays and names decode as None
    partitions = [part for topic in topics for part in topic.partitions or ()]
    limits = [max(part.partition_max_bytes, 0) for part in partitions]
    records = min(_max_bytes(engine, request), sum(limits))
    first_batch = config_number(engine.topic_configs({}), "max.message.bytes")
    names = sum(len((topic.topic or "").encode()) for topic in topics)
    return (max(records, first_batch) + names
            + _ANSWER_OVERHEAD * (1 + len(topics) + len(partitions)))


async def handle_fetch(engine: Engine, ctx: RequestContext,
                       request: FetchRequest) -> FetchAnswer | Later[FetchAnswer]:
    """Answer Fetch, waiting up to ``max_wait_ms`` for ``min_bytes`` to be available. The
    dispatch stage resolves names and permissions; the reads and the long poll are the
    waiting stage (a fetch changes nothing, and reads as of when it answers), so a parked
    fetch never holds up the requests behind it, such as a consumer's heartbeat. A request
    naming a fetch session is answered at once (see the module docstring)."""
    if request.version >= SESSIONS_FROM and request.session_epoch not in FULL_FETCH_EPOCHS:
        return FetchAnswer(request.version, [],
                           error_code=ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
    wanted = _resolve(engine, ctx, request)
    deadline = time.monotonic() + max(request.max_wait_ms, 0) / 1000
    return Later(_poll(engine, request, wanted, deadline, _max_bytes(engine, request, ctx)))


async def _poll(engine: Engine, request: FetchRequest, wanted: list[_Wanted],
                deadline: float, max_bytes: int) -> FetchAnswer:
    """Read the wanted partitions until ``min_bytes`` (at most ``max_bytes``, as Kafka
    bounds them) are there or ``deadline`` passes."""
    version = request.version
    min_bytes = min(request.min_bytes, max_bytes)
    await engine.leadership.ready((w.internal, w.index) for w in wanted if w.internal is not None)
    committed = request.isolation_level == READ_COMMITTED
    before = _Before()
    while True:
        answers, total, errored = _collect(engine, wanted, max_bytes, committed, before)
        if before:  # off the event loop, then answer again
            for answer, _size in answers:
                release_batches(answer.batches)
            await before.settle()
            continue
        remaining = deadline - time.monotonic()
        if (total >= min_bytes or errored or remaining <= 0 or not wanted
                or engine.closing):
            break
        for answer, _size in answers:
            release_batches(answer.batches)
        keys = [(w.internal, w.index) for w in wanted if w.internal is not None]
        await engine.waiters.wait_any(keys, remaining)
    topics: list[TopicAnswer] = []
    for want, (answer, size) in zip(wanted, answers, strict=True):
        if size:
            _count_out(want.internal or want.topic, answer.batches, size)
        if not topics or topics[-1].name != want.topic:
            topics.append(TopicAnswer(want.topic, []))
        topics[-1].partitions.append(answer)
    return FetchAnswer(version, topics)
