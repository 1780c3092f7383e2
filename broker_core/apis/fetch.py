"""Fetch: read batches from the ledgers, long-polling on appends until ``min_bytes`` arrive.

Sessions (KIP-227) are declined by answering session id 0, so every fetch is a full one.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import Any

from kafka.protocol.consumer import FetchResponse

from broker_core import metrics
from broker_core.context import Operation, RequestContext
from broker_core.engine import Engine
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.storage import PartitionLog

READ_COMMITTED = 1
_BASE_OFFSET = struct.Struct(">q")
_LAST_DELTA = struct.Struct(">i")
_RECORD_COUNT = struct.Struct(">i")
_Topic = FetchResponse.FetchableTopicResponse
_Partition = _Topic.PartitionData


@dataclass(slots=True)
class _Wanted:
    """One requested partition, resolved once per request."""

    topic: str
    internal: str | None
    index: int
    offset: int
    max_bytes: int
    error: ErrorCode


def _resolve(engine: Engine, ctx: RequestContext, request: Any) -> list[_Wanted]:
    wanted = []
    for topic in request.topics:
        internal: str | None = None
        error = ErrorCode.NONE
        try:
            internal = engine.internal_name(ctx, topic.topic)
            if not engine.allowed(ctx, Operation.READ, internal):
                error = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        except KafkaApiError as failure:
            error = failure.code
        for part in topic.partitions:
            wanted.append(_Wanted(topic.topic, internal, part.partition, part.fetch_offset,
                                  part.partition_max_bytes, error))
    return wanted


def _answer(engine: Engine, want: _Wanted, budget: int, first: bool,
            committed: bool) -> tuple[Any, int]:
    """One partition's answer and the bytes it carries (below the last stable offset only,
    with the aborted transactions listed, for read_committed)."""
    if want.error != ErrorCode.NONE or want.internal is None:
        return _empty(want.index, want.error or ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), 0
    partition: PartitionLog | None = engine.logs.partition(want.internal, want.index)
    if partition is None:
        return _empty(want.index, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), 0
    start, end = partition.log_start_offset, partition.next_offset
    if want.offset < start or want.offset > end:
        return _empty(want.index, ErrorCode.OFFSET_OUT_OF_RANGE, end, start), 0
    producers = engine.producers.get(want.internal, want.index, partition)
    stable = producers.last_stable_offset(end)
    upper = stable if committed else end
    limit = min(want.max_bytes, budget)
    readable = want.offset < upper and (limit > 0 or first)
    chunks = partition.read(want.offset, max(limit, 0)) if readable else []
    if committed:
        chunks = [c for c in chunks if _BASE_OFFSET.unpack_from(c)[0] < upper]
    size = sum(len(chunk) for chunk in chunks)
    if size > limit and not first:
        chunks, size = [], 0

    aborted = []
    if committed and chunks:
        last = _BASE_OFFSET.unpack_from(chunks[-1])[0] + _LAST_DELTA.unpack_from(
            chunks[-1], 23)[0]
        aborted = [_Partition.AbortedTransaction(producer_id=pid, first_offset=first_offset)
                   for pid, first_offset in producers.aborted_between(want.offset, last + 1)]
    return _Partition(
        partition_index=want.index, error_code=0, high_watermark=end,
        last_stable_offset=stable, log_start_offset=start,
        aborted_transactions=aborted if committed else None, preferred_read_replica=-1,
        records=b"".join(chunks),
    ), size


def _count_out(topic: str, records: bytes) -> None:
    """Count the records and bytes of a fetched record set (batch headers only)."""
    count, position = 0, 0
    while position + 61 <= len(records):
        count += _RECORD_COUNT.unpack_from(records, position + 57)[0]
        position += 12 + _RECORD_COUNT.unpack_from(records, position + 8)[0]
    metrics.BYTES_OUT.labels(topic).inc(len(records))
    metrics.MESSAGES_OUT.labels(topic).inc(count)


def _empty(index: int, code: ErrorCode, high_watermark: int = -1,
           log_start: int = -1) -> Any:
    return _Partition(
        partition_index=index, error_code=code, high_watermark=high_watermark,
        last_stable_offset=high_watermark, log_start_offset=log_start,
        aborted_transactions=None, preferred_read_replica=-1, records=b"",
    )


def _collect(engine: Engine, wanted: list[_Wanted], max_bytes: int,
             committed: bool) -> tuple[list[Any], int, bool]:
    """Answers for all partitions, total bytes, and whether an error is among them."""
    answers = []
    total = 0
    errored = False
    for want in wanted:
        answer, size = _answer(engine, want, max_bytes - total, total == 0, committed)
        total += size
        errored = errored or answer.error_code != 0
        answers.append(answer)
    return answers, total, errored


async def handle_fetch(engine: Engine, ctx: RequestContext, request: Any) -> Any:
    """Answer Fetch, waiting up to ``max_wait_ms`` for ``min_bytes`` to be available."""
    version: int = request.version
    max_bytes = request.max_bytes if version >= 3 else 2**31 - 1
    wanted = _resolve(engine, ctx, request)
    committed = request.isolation_level == READ_COMMITTED
    deadline = time.monotonic() + max(request.max_wait_ms, 0) / 1000
    while True:
        answers, total, errored = _collect(engine, wanted, max_bytes, committed)
        remaining = deadline - time.monotonic()
        if (total >= request.min_bytes or errored or remaining <= 0 or not wanted
                or engine.closing):
            break
        keys = [(w.internal, w.index) for w in wanted if w.internal is not None]
        await engine.waiters.wait_any(keys, remaining)
    topics: list[Any] = []
    for want, answer in zip(wanted, answers, strict=True):
        if answer.records:
            _count_out(want.internal or want.topic, answer.records)
        if not topics or topics[-1].topic != want.topic:
            topics.append(_Topic(topic=want.topic, partitions=[]))
        topics[-1].partitions.append(answer)
    return FetchResponse(version=version, throttle_time_ms=0, error_code=0, session_id=0,
                         responses=topics)
