"""The checks at the end of a chaos run, once every fault stopped and everything is up,
with fresh read_committed and read_uncommitted consumers. Each broken promise is a
:class:`Violation` naming the partition, the offsets and when it happened on the run's
clock, so that the summary can name the fault just before it:

- the idempotent input: every acknowledged record stored exactly once, at its
  acknowledged offset; no payload stored twice; offsets 0..high watermark all records;
- the transactional output: each input record below the transform group's committed
  offset has exactly one output among the committed transactions (and it is that record's),
  none at or above it;
- the groups' committed offsets never went backwards, and each ends at or after every
  commit a member was told succeeded;
- no transaction left hanging: last stable offset == high watermark on both topics once
  the transaction timeout passed.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

from confluent_kafka import IsolationLevel, KafkaException
from confluent_kafka.admin import AdminClient, OffsetSpec

from bench.chaos_load import UNKNOWN_OFFSET, Acked, GroupCommit, Sample, committed_offsets
from pipeline.lookups import list_offsets
from tests.txn_helpers import read_all


@dataclass(frozen=True)
class Violation:
    """A broken promise: what, where, and when (run seconds; None: seen at the end)."""

    kind: str
    partition: int
    offsets: str
    detail: str
    at: float | None = None


def latest(admin: AdminClient, topic: str, partitions: int,
           isolation: IsolationLevel) -> dict[int, int]:
    """partition -> high watermark (read_uncommitted) or last stable offset (asked again
    while a partition moves)."""
    spec = OffsetSpec.latest()  # type: ignore[no-untyped-call]  # untyped in confluent-kafka
    found = list_offsets(admin, {(topic, p): spec for p in range(partitions)}, isolation,
                         timeout_s=60.0)
    return {p: offset for (_t, p), offset in found.items()}


def _spans(offsets: list[int]) -> str:
    """``3-5,9`` for [3, 4, 5, 9] (the first 10 runs)."""
    runs: list[tuple[int, int]] = []
    for offset in sorted(offsets):
        if runs and offset == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], offset)
        else:
            runs.append((offset, offset))
    text = ",".join(f"{a}-{b}" if a != b else str(a) for a, b in runs[:10])
    return text + (f",... ({len(offsets)} offsets)" if len(runs) > 10 else "")


def check_stable(admin: AdminClient, topic: str, partitions: int,
                 wait_s: float) -> list[Violation]:
    """LSO == high watermark on every partition of ``topic``, within ``wait_s`` (a
    transaction left open is aborted by its timeout)."""
    deadline = time.monotonic() + wait_s
    while True:
        stable = latest(admin, topic, partitions, IsolationLevel.READ_COMMITTED)
        high = latest(admin, topic, partitions, IsolationLevel.READ_UNCOMMITTED)
        if stable == high or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    return [Violation("hanging transaction", p, f"LSO {stable[p]} < HW {high[p]}",
                      f"{topic}: {wait_s:.0f} s after the load stopped")
            for p in range(partitions) if stable[p] != high[p]]


def check_input(bootstrap: str, topic: str, partitions: int, acked: list[Acked],
                failed: set[str]) -> tuple[list[Violation], dict[tuple[int, int], str]]:
    """The idempotent topic; also its records by (partition, offset), for the output's
    check."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    high = latest(admin, topic, partitions, IsolationLevel.READ_UNCOMMITTED)
    stored: dict[tuple[int, int], str] = {}
    for p, off, value in read_all(bootstrap, topic, partitions, "read_uncommitted", high, 120):
        stored[(p, off)] = value.decode()
    stable = latest(admin, topic, partitions, IsolationLevel.READ_COMMITTED)
    committed = {(p, off) for p, off, _ in
                 read_all(bootstrap, topic, partitions, "read_committed", stable, 120)}
    return judge_input(stored, committed, high, acked, failed), stored


def judge_input(stored: dict[tuple[int, int], str], committed: set[tuple[int, int]],
                high: dict[int, int], acked: list[Acked], failed: set[str]
                ) -> list[Violation]:
    """The violations of the idempotent topic whose records are ``stored`` by (partition,
    offset), ``committed`` of them read_committed, below the partitions' ``high``
    watermarks, against what the producer was told (``acked``) or failed."""
    found: list[Violation] = []
    on_partition = {(p, value) for (p, _), value in stored.items()}
    for record in acked:
        at = (record.partition, record.offset)
        # acknowledged without an offset: stored anywhere on its partition
        if record.offset == UNKNOWN_OFFSET:
            if (record.partition, record.payload) not in on_partition:
                found.append(Violation("acknowledged record lost", record.partition, "?",
                                       f"{record.payload} acknowledged with no offset; "
                                       "not stored", record.at))
            continue
        if stored.get(at) != record.payload:
            found.append(Violation("acknowledged record lost", record.partition,
                                   str(record.offset), f"{record.payload} acknowledged there; "
                                   f"stored: {stored.get(at)}", record.at))
        elif at not in committed:
            found.append(Violation("acknowledged record not read_committed", record.partition,
                                   str(record.offset), record.payload, record.at))
    counts = Counter(stored.values())
    acked_at = {r.payload: r for r in acked}
    for payload, count in counts.items():
        if count > 1:
            where = sorted(at for at, value in stored.items() if value == payload)
            first = acked_at.get(payload)
            found.append(Violation("stored twice", where[0][0],
                                   ",".join(f"{p}:{o}" for p, o in where), payload,
                                   first.at if first else None))
    known = set(acked_at) | failed
    for (p, off), payload in stored.items():
        if payload not in known:
            found.append(Violation("stored but never sent", p, str(off), payload))
    for p in sorted(high):
        missing = sorted(set(range(high[p])) - {off for q, off in stored if q == p})
        if missing:
            found.append(Violation("offset gap", p, _spans(missing),
                                   f"no record at these offsets below HW {high[p]}"))
    return found


def check_output(bootstrap: str, source: str, topic: str, partitions: int,
                 inputs: dict[tuple[int, int], str], group: str) -> tuple[list[Violation], int]:
    """The transactional output ``topic`` against its input (``source``'s records) and
    the transform group's committed offsets; also how many outputs were committed."""
    found: list[Violation] = []
    try:
        ends = committed_offsets(bootstrap, group, source, partitions)
    except KafkaException as exc:  # pending for ever: no read_committed member gets on
        found.append(Violation("committed offsets never stable", -1, "-",
                               f"group {group}: a read_committed OffsetFetch: {exc}"))
        ends = committed_offsets(bootstrap, group, source, partitions, stable=False)
    stable = latest(AdminClient({"bootstrap.servers": bootstrap}), topic, partitions,
                    IsolationLevel.READ_COMMITTED)
    outputs: Counter[tuple[int, int]] = Counter()
    wrong: list[Violation] = []
    for p, off, value in read_all(bootstrap, topic, partitions, "read_committed", stable, 120):
        source_p, source_off, payload = value.decode().split(":", 2)
        key = (int(source_p), int(source_off))
        outputs[key] += 1
        if inputs.get(key) != payload:
            wrong.append(Violation("output of another record", p, str(off),
                                   f"says {value.decode()}, input there: {inputs.get(key)}"))
    found += wrong
    for p in range(partitions):
        end = ends.get(p, 0)
        lost = [off for off in range(end) if outputs[(p, off)] == 0]
        twice = [off for off in range(end) if outputs[(p, off)] > 1]
        beyond = sorted(off for (q, off) in outputs if q == p and off >= end)
        if lost:
            found.append(Violation("input consumed without output", p, _spans(lost),
                                   f"below the committed offset {end}"))
        if twice:
            found.append(Violation("output committed twice", p, _spans(twice),
                                   f"{sum(outputs[(p, o)] for o in twice)} outputs"))
        if beyond:
            found.append(Violation("output without its input offset committed", p,
                                   _spans(beyond), f"committed offset {end}"))
    return found, sum(outputs.values())


def check_offsets(samples: list[Sample], commits: list[GroupCommit],
                  final: dict[int, int], group: str) -> list[Violation]:
    """Committed offsets never back; ``group``'s final ones at or after every acknowledged
    commit of its members."""
    found: list[Violation] = []
    seen: dict[tuple[str, int], tuple[int, float]] = {}
    for sample in samples:
        for p, offset in sample.offsets.items():
            before = seen.get((sample.group, p))
            if before is not None and offset < before[0]:
                found.append(Violation("committed offset went back", p,
                                       f"{before[0]} -> {offset}",
                                       f"group {sample.group}, sampled at {before[1]:.1f} s "
                                       f"and {sample.at:.1f} s", sample.at))
            seen[(sample.group, p)] = (offset, sample.at)
    highest: dict[int, GroupCommit] = {}
    for commit in commits:
        for p, offset in commit.offsets.items():
            if p not in highest or offset > highest[p].offsets[p]:
                highest[p] = commit
    for p, commit in highest.items():
        if final.get(p, -1) < commit.offsets[p]:
            found.append(Violation("acknowledged commit lost", p,
                                   f"{commit.offsets[p]} -> {final.get(p)}",
                                   f"group {group}, member {commit.member} was told "
                                   f"{commit.offsets[p]} was committed", commit.at))
    return found
