"""The chaos soak's judgement of its idempotent topic (``bench/chaos_check.py``), on made-up
logs: records acknowledged at an offset, records librdkafka acknowledged without one (a
batch whose request was lost with a broker, "implicitly" acknowledged once a later batch
of the partition succeeded), and the broken promises each kind can show."""

from __future__ import annotations

import time

from confluent_kafka import Message

from bench.chaos_check import judge_input
from bench.chaos_load import UNKNOWN_OFFSET, Acked, Clock, IdempotentLoad

STORED = {(0, 0): "i0", (0, 1): "i2", (1, 0): "i1", (1, 1): "i3"}
HIGH = {0: 2, 1: 2}


def kinds(stored: dict[tuple[int, int], str], acked: list[Acked]) -> list[str]:
    return [v.kind for v in judge_input(stored, set(stored), HIGH, acked, set())]


def test_records_acknowledged_without_an_offset_count_where_they_are_stored() -> None:
    acked = [Acked(0, 0, "i0", 1.0), Acked(1, 0, "i1", 1.0),
             Acked(0, UNKNOWN_OFFSET, "i2", 2.0), Acked(1, UNKNOWN_OFFSET, "i3", 2.0)]
    assert kinds(STORED, acked) == []


def test_a_record_acknowledged_without_an_offset_must_be_on_its_partition() -> None:
    acked = [Acked(0, 0, "i0", 1.0), Acked(1, 0, "i1", 1.0), Acked(0, 1, "i2", 1.0),
             Acked(0, UNKNOWN_OFFSET, "i3", 2.0)]  # stored on partition 1, not 0
    assert kinds(STORED, acked) == ["acknowledged record lost"]
    lost = {**STORED, (1, 1): "i4"}
    assert kinds(lost, [*acked[:3], Acked(1, UNKNOWN_OFFSET, "i3", 2.0)]) == \
        ["acknowledged record lost", "stored but never sent"]


def test_an_acknowledged_record_stored_twice_is_found_whatever_its_report() -> None:
    twice = {**STORED, (1, 1): "i2"}
    acked = [Acked(0, 0, "i0", 1.0), Acked(1, 0, "i1", 1.0),
             Acked(0, UNKNOWN_OFFSET, "i2", 2.0)]
    assert kinds(twice, acked) == ["stored twice"]


def test_the_load_takes_a_report_without_an_offset_as_acknowledged_there() -> None:
    load = IdempotentLoad(Clock(time.monotonic()), "127.0.0.1:9", "t", 2, 1)
    load._delivered(None, Message(topic="t", partition=1, offset=-1001, value=b"i7"))
    load._delivered(None, Message(topic="t", partition=0, offset=12, value=b"i8"))
    assert [(a.partition, a.offset, a.payload) for a in load.acked] == \
        [(1, UNKNOWN_OFFSET, "i7"), (0, 12, "i8")]
