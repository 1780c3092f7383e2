"""Fetch: read batches from the ledgers, long-polling on appends until ``min_bytes`` arrive.

Sessions (KIP-227) are declined by answering session id 0, so every fetch is a full one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from kafka.protocol.consumer import FetchResponse

from broker_core.context import Operation, RequestContext
from broker_core.engine import Engine
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.storage import PartitionLog

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


def _answer(engine: Engine, want: _Wanted, budget: int, first: bool) -> tuple[Any, int]:
    """One partition's answer and the bytes it carries."""
    if want.error != ErrorCode.NONE or want.internal is None:
        return _empty(want.index, want.error or ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), 0
    partition: PartitionLog | None = engine.logs.partition(want.internal, want.index)
    if partition is None:
        return _empty(want.index, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), 0
    start, end = partition.log_start_offset, partition.next_offset
    if want.offset < start or want.offset > end:
        return _empty(want.index, ErrorCode.OFFSET_OUT_OF_RANGE, end, start), 0
    limit = min(want.max_bytes, budget)
    readable = want.offset < end and (limit > 0 or first)
    chunks = partition.read(want.offset, max(limit, 0)) if readable else []
    size = sum(len(chunk) for chunk in chunks)
    if size > limit and not first:
        chunks, size = [], 0
    records = b"".join(chunks)
    return _Partition(
        partition_index=want.index, error_code=0, high_watermark=end, last_stable_offset=end,
        log_start_offset=start, aborted_transactions=[], preferred_read_replica=-1,
        records=records,
    ), size


def _empty(index: int, code: ErrorCode, high_watermark: int = -1,
           log_start: int = -1) -> Any:
    return _Partition(
        partition_index=index, error_code=code, high_watermark=high_watermark,
        last_stable_offset=high_watermark, log_start_offset=log_start,
        aborted_transactions=None, preferred_read_replica=-1, records=b"",
    )


def _collect(engine: Engine, wanted: list[_Wanted], max_bytes: int) -> tuple[list[Any], int, bool]:
    """Answers for all partitions, total bytes, and whether an error is among them."""
    answers = []
    total = 0
    errored = False
    for want in wanted:
        answer, size = _answer(engine, want, max_bytes - total, first=total == 0)
        total += size
        errored = errored or answer.error_code != 0
        answers.append(answer)
    return answers, total, errored


async def handle_fetch(engine: Engine, ctx: RequestContext, request: Any) -> Any:
    """Answer Fetch, waiting up to ``max_wait_ms`` for ``min_bytes`` to be available."""
    version: int = request.version
    max_bytes = request.max_bytes if version >= 3 else 2**31 - 1
    wanted = _resolve(engine, ctx, request)
    deadline = time.monotonic() + max(request.max_wait_ms, 0) / 1000
    while True:
        answers, total, errored = _collect(engine, wanted, max_bytes)
        remaining = deadline - time.monotonic()
        if (total >= request.min_bytes or errored or remaining <= 0 or not wanted
                or engine.closing):
            break
        keys = [(w.internal, w.index) for w in wanted if w.internal is not None]
        await engine.waiters.wait_any(keys, remaining)
    topics: list[Any] = []
    for want, answer in zip(wanted, answers, strict=True):
        if not topics or topics[-1].topic != want.topic:
            topics.append(_Topic(topic=want.topic, partitions=[]))
        topics[-1].partitions.append(answer)
    return FetchResponse(version=version, throttle_time_ms=0, error_code=0, session_id=0,
                         responses=topics)
