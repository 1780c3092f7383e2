"""Sealed segments as the log cleaner sees them, and the rule every engine checks before
it swaps a run of segments' batches for cleaned ones.

A *segment* is a sealed ledger (file engine) or a sealed run of rows or batches (the
other engines): never the one appends go to. The cleaner reads the batches of one segment,
or of several adjacent ones that it merges into one (as Kafka groups small cleaned
segments), rewrites them and hands back a list that covers exactly their offsets, one
batch after another (what it removed is covered by empty filler batches), so every engine
keeps its offsets continuous and every kept record keeps its offset.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from broker_core.codec.batch_header import base_offset, last_offset_delta, shape_problem

from .model import BatchInfo


@dataclass(frozen=True, slots=True)
class SealedSegment:
    """One sealed segment of a partition: ``[first_offset, next_offset)``."""

    ident: int
    """Which segment of the engine (a ledger id, or the segment's base offset)."""
    first_offset: int
    next_offset: int
    size_bytes: int
    min_broker_timestamp: int
    """When the broker appended its oldest batch (ms; -1 if unknown)."""
    max_broker_timestamp: int
    """When the broker appended its newest batch (ms)."""
    max_timestamp: int
    """The largest batch max timestamp in it (the records' time: CreateTime or
    LogAppendTime as the topic says; -1 if none), what ``min.compaction.lag.ms`` is
    judged by, as Kafka judges it by a segment's largest timestamp."""


def check_cover(segments: Sequence[SealedSegment], batches: Sequence[BatchInfo]) -> None:
    """ValueError unless ``segments`` are adjacent (each starting where the one before
    ends) and ``batches`` are well formed and cover exactly their offsets, each starting
    where the one before ends."""
    if not segments:
        raise ValueError("no segment to replace")
    for before, after in pairwise(segments):
        if after.first_offset != before.next_offset:
            raise ValueError(f"segments at {before.first_offset} and {after.first_offset} "
                             "are not adjacent")
    segment = segments[-1]
    expected = segments[0].first_offset
    for info in batches:
        problem = shape_problem(info.batch)
        if problem is not None:
            raise ValueError(problem)
        if info.base_offset != expected or base_offset(info.batch) != expected:
            raise ValueError(f"a batch at {info.base_offset} where {expected} was expected")
        if info.last_offset != expected + last_offset_delta(info.batch):
            raise ValueError(f"the batch at {expected} ends at {info.last_offset}, not where "
                             "its header says")
        expected = info.last_offset + 1
    if expected != segment.next_offset:
        raise ValueError(f"the batches end at {expected}, the segment at "
                         f"{segment.next_offset}")
