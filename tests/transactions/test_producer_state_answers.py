"""The two answers every fetch asks of a partition's producer state, against a naive model.

``last_stable_offset`` (the oldest open transaction) and ``aborted_between`` (the aborted
transactions overlapping a fetched range) read indexes kept as the state changes, not a
scan of everything remembered. Random histories of idempotent and transactional
producers (commits, aborts, long transactions spanning many others, expiry, snapshot
round trips, retention and the cleaner forgetting old aborts) must give, after every step,
the answers of the plain scans the model computes.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

import pytest

from broker_core.codec.batch_header import read_header
from broker_core.partition_producers import PartitionProducers
from tests.txn_helpers import batch


@dataclass
class Model:
    """The naive model: the open transactions and every aborted one, scanned."""

    open: dict[int, int] = field(default_factory=dict)
    aborted: list[tuple[int, int, int]] = field(default_factory=list)
    cleaned_below: int = 0

    def last_stable_offset(self, high_watermark: int, log_start: int) -> int:
        first = min(self.open.values(), default=high_watermark)
        return min(max(first, log_start), high_watermark)

    def aborted_between(self, start: int, end: int,
                        cleaned_below: int | None = None) -> list[tuple[int, int]]:
        start = max(start, self.cleaned_below if cleaned_below is None else cleaned_below)
        return [(pid, first) for pid, first, marker in self.aborted
                if marker >= start and first < end]


class History:
    """One random history of a partition: its state and the model, kept side by side."""

    def __init__(self, seed: int, producers: int) -> None:
        self.rng = random.Random(seed)
        self.pids = list(range(1000, 1000 + producers))
        self.sequences = dict.fromkeys(self.pids, 0)
        self.state = PartitionProducers()
        self.model = Model()
        self.offset = 0  # the next offset
        self.log_start = 0
        self.most_listed = 0  # the most aborted transactions listed at once

    def data(self, pid: int, transactional: bool) -> None:
        header = read_header(batch(pid, 0, self.sequences[pid], 1, transactional))
        self.sequences[pid] += 1
        self.state.record(header, self.offset, self.offset)
        if transactional:
            self.model.open.setdefault(pid, self.offset)
        self.offset += 1

    def marker(self, pid: int, commit: bool) -> None:
        self.state.end_transaction(pid, 0, commit, self.offset, self.offset)
        first = self.model.open.pop(pid, None)
        if first is not None and not commit:
            self.model.aborted.append((pid, first, self.offset))
            self.most_listed = max(self.most_listed, len(self.model.aborted))
        self.offset += 1

    def step(self) -> None:
        rng = self.rng
        roll = rng.random()
        pid = rng.choice(self.pids)
        if roll < 0.55:
            self.data(pid, transactional=rng.random() < 0.8)
        elif roll < 0.85:
            # a long transaction: the first producer ends its own rarely
            if pid != self.pids[0] or rng.random() < 0.05:
                self.marker(pid, commit=rng.random() < 0.4)
        elif roll < 0.90:
            assert self.state.expire(now_ms=self.offset, expiration_ms=rng.randint(0, 50)) >= 0
        elif roll < 0.94:
            document = json.loads(json.dumps(self.state.to_json(self.offset)))
            restored = PartitionProducers.from_json(document)
            restored.cleaned_below = self.state.cleaned_below
            self.state = restored
        elif roll < 0.97:
            self.log_start += rng.randint(0, (self.offset - self.log_start) // 10)
            self.state.forget_aborted_before(self.log_start)
            below = max(self.log_start, self.model.cleaned_below)
            self.model.aborted = [a for a in self.model.aborted if a[2] >= below]
        else:
            cleaned = self.model.cleaned_below + \
                rng.randint(0, (self.offset - self.model.cleaned_below) // 10)
            self.state.cleaned_below = self.model.cleaned_below = cleaned

    def check(self) -> None:
        rng, state, model = self.rng, self.state, self.model
        for _ in range(3):
            high = rng.randint(0, self.offset + 2)
            start = rng.randint(0, self.offset + 2)
            assert state.last_stable_offset(high, start) == \
                model.last_stable_offset(high, start)
        for _ in range(4):
            start = rng.randint(0, self.offset + 1)
            end = rng.randint(start, self.offset + 2)
            assert state.aborted_between(start, end) == model.aborted_between(start, end)
            cleaned = rng.randint(0, self.offset)
            assert state.aborted_between(start, end, cleaned) == \
                model.aborted_between(start, end, cleaned)
        tail = max(self.offset - 3, 0)  # a consumer at the tail
        assert state.aborted_between(tail, self.offset + 1) == \
            model.aborted_between(tail, self.offset + 1)
        assert state.aborted == model.aborted
        assert len(state._bounds) == len(state.aborted)  # one bound each, forgotten with it
        for pid in self.pids:
            assert state.open_transaction(pid) == model.open.get(pid)


@pytest.mark.parametrize("seed", range(12))
def test_random_histories_answer_as_the_plain_scans(seed: int) -> None:
    history = History(seed, producers=2 + seed % 6)
    for _ in range(1500):
        history.step()
        history.check()
    assert history.most_listed >= 20, "the history listed few aborts: it tests little"


def test_a_long_transaction_is_listed_past_many_aborts_after_it() -> None:
    """A transaction open across many others that aborted before it is listed to a fetch
    that starts past their markers and ends past its first offset."""
    history = History(0, producers=1)
    history.pids = [1, 2]
    history.sequences = {1: 0, 2: 0}
    history.data(1, transactional=True)  # offset 0: the long one opens
    for _ in range(100):
        history.data(2, transactional=True)
        history.marker(2, commit=False)
    history.marker(1, commit=False)
    history.check()
    assert history.state.aborted_between(151, 152) == [(2, 151), (1, 0)]
    assert history.state.aborted_between(202, 203) == []


def test_markers_out_of_offset_order_still_answer_as_the_scans() -> None:
    """Markers are applied in offset order; if one ever came late, it is sorted in and
    every answer stays right."""
    state, model = PartitionProducers(), Model()
    for pid, first in ((1, 0), (2, 1), (3, 2)):
        state.record(read_header(batch(pid, 0, 0, 1, True)), first, first)
        model.open[pid] = first
    for pid, marker in ((1, 10), (3, 12), (2, 11)):
        state.end_transaction(pid, 0, False, marker, marker)
        model.aborted.append((pid, model.open.pop(pid), marker))
    model.aborted.sort(key=lambda a: a[2])
    assert state.aborted == model.aborted
    for start in range(14):
        for end in range(start, 14):
            assert state.aborted_between(start, end) == model.aborted_between(start, end)


def test_a_snapshot_from_before_the_index_reads_back() -> None:
    """A snapshot as written before (its producers of four items) gives the same answers,
    its open transaction bounding the aborted ones listed."""
    state = PartitionProducers.from_json(json.loads(
        '{"offset": 20, "aborted": [[6, 2, 4], [5, 0, 9], [7, 12, 15]],'
        ' "producers": {"8": [0, [], 3, 1]}}'))
    model = Model(open={8: 3}, aborted=[(6, 2, 4), (5, 0, 9), (7, 12, 15)])
    for start in range(22):
        for end in range(start, 22):
            assert state.aborted_between(start, end) == model.aborted_between(start, end)
    assert state.last_stable_offset(20, 0) == 3
