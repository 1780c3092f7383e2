"""Helpers for the consumer-group acceptance tests: brokers with group settings, exact group
requests over a raw connection, record production, and the bookkeeping of which member
processed which record and owned which partition."""

from __future__ import annotations

import bisect
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka
from kafka.protocol.consumer import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

from tests.broker_process import BrokerProcess
from tests.raw import RawConnection

# Kafka error codes used by the group tests.
NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
OFFSET_METADATA_TOO_LARGE = 12
COORDINATOR_LOAD_IN_PROGRESS = 14
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16
ILLEGAL_GENERATION = 22
INCONSISTENT_GROUP_PROTOCOL = 23
INVALID_GROUP_ID = 24
UNKNOWN_MEMBER_ID = 25
INVALID_SESSION_TIMEOUT = 26
REBALANCE_IN_PROGRESS = 27
NON_EMPTY_GROUP = 68
GROUP_ID_NOT_FOUND = 69
MEMBER_ID_REQUIRED = 79
FENCED_INSTANCE_ID = 82
GROUP_SUBSCRIBED_TO_TOPIC = 86

#: Broker settings that keep group tests fast: a short initial rebalance delay and a low
#: minimum session timeout (so tests may use short session timeouts).
FAST_GROUPS = {"groupInitialRebalanceDelayMs": "200", "groupMinSessionTimeoutMs": "1000"}


def start_broker(data_dir: Path, **settings: str) -> BrokerProcess:
    """A broker with FAST_GROUPS, overridden by ``settings``."""
    return BrokerProcess(data_dir, {**FAST_GROUPS, **settings}).start()


def group_id_for(topic: str, suffix: str = "") -> str:
    """A group id unique to the test (topic names are unique per session)."""
    return f"grp-{topic}{'-' + suffix if suffix else ''}"


def produce_values(bootstrap: str, topic: str, partitions: Iterable[int], start: int,
                   stop: int) -> None:
    """Produce one record per partition for each index in ``range(start, stop)``; partition p
    gets the records ``{p}:{i}`` at offsets ``start..stop-1`` when it began at ``start``."""
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                         "linger.ms": 5, "enable.idempotence": False})
    errors: list[object] = []

    def report(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    parts = list(partitions)
    for i in range(start, stop):
        for p in parts:
            producer.produce(topic, value=f"{p}:{i}".encode(), partition=p, on_delivery=report)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert errors == []


def wait_until(condition: Callable[[], bool], timeout: float, what: str,
               step: Callable[[], None] | None = None, interval: float = 0.05) -> None:
    """Call ``step`` (or sleep) until ``condition()`` holds; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        if step is None:
            time.sleep(interval)
        else:
            step()


# -- bookkeeping of processing and ownership ---------------------------------------------

@dataclass
class Batch:
    """Records one member processed in one poll, and whether their commit right after
    succeeded."""

    seq: int
    member: str
    records: list[tuple[int, int]]
    committed: bool
    error: str = ""


@dataclass
class GroupLedger:
    """Thread-safe log of processed batches, successful commits and partition ownership.

    A processing of record (p, o) by member m is *covered* once m later commits an offset
    above o for p. Delivery is right when every record gets a covered processing, and a
    record is never processed again after a covered processing (re-reads only follow
    failed commits)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    batches: list[Batch] = field(default_factory=list)
    commits: list[tuple[int, str, int, int]] = field(default_factory=list)
    owned: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    events: list[tuple[int, str, str, tuple[int, ...]]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    left: set[str] = field(default_factory=set)
    seq: int = 0

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def assigned(self, member: str, partitions: Iterable[int]) -> None:
        """``member`` now also owns ``partitions``; no one else may own them."""
        parts = tuple(sorted(partitions))
        with self.lock:
            if member in self.left:
                # a rebalance that completed while the member was closing: it processes
                # nothing more, so it owns nothing
                self.events.append((self._next(), member, "assign after leaving", parts))
                return
            self.events.append((self._next(), member, "assign", parts))
            for p in parts:
                others = [m for m, ps in self.owned.items() if m != member and p in ps]
                if others:
                    self.violations.append(
                        f"partition {p} assigned to {member} while owned by {others}")
            self.owned[member].update(parts)

    def revoked(self, member: str, partitions: Iterable[int]) -> None:
        """``member`` gave up ``partitions``."""
        parts = tuple(sorted(partitions))
        with self.lock:
            self.events.append((self._next(), member, "revoke", parts))
            self.owned[member].difference_update(parts)

    def leaving(self, member: str) -> None:
        """``member`` stops processing and is about to leave: it owns nothing any more
        (called before the client's close, which not every client reports as a revoke)."""
        with self.lock:
            parts = tuple(sorted(self.owned[member]))
            self.events.append((self._next(), member, "leave", parts))
            self.owned[member].clear()
            self.left.add(member)

    def read(self, member: str, partition: int, offset: int, value: bytes | None
             ) -> tuple[int, int]:
        """A record ``member`` consumed, as (partition, offset): its value must be the one
        ``produce_values`` wrote there (``{p}:{i}`` at offset i; the ledger's topics begin
        at 0), else the client read a record from the wrong place."""
        if value != f"{partition}:{offset}".encode():
            with self.lock:
                self.violations.append(
                    f"{member} read {value!r} at offset {offset} of partition {partition}")
        return partition, offset

    def processed(self, member: str, records: list[tuple[int, int]], committed: bool,
                  error: str = "") -> Batch:
        """Log a processed batch and the result of committing right after it; its
        partitions must be owned by ``member``."""
        with self.lock:
            foreign = sorted({p for p, _ in records} - self.owned[member])
            if foreign:
                self.violations.append(f"{member} processed partitions {foreign} it does "
                                       f"not own (owns {sorted(self.owned[member])})")
            batch = Batch(self._next(), member, list(records), committed, error)
            self.batches.append(batch)
            if committed:
                for p, offset in positions(records).items():
                    self.commits.append((batch.seq, member, p, offset))
            return batch

    def recommitted(self, member: str, offsets: dict[int, int]) -> None:
        """A retried commit of ``offsets`` by ``member`` succeeded."""
        with self.lock:
            seq = self._next()
            for p, offset in offsets.items():
                self.commits.append((seq, member, p, offset))

    def mark(self) -> int:
        """A sequence number separating what happened before from what happens after."""
        with self.lock:
            return self._next()

    def ownership(self) -> dict[str, set[int]]:
        with self.lock:
            return {m: set(ps) for m, ps in self.owned.items() if ps}

    def count_by(self, member: str | None = None) -> int:
        with self.lock:
            return sum(len(b.records) for b in self.batches
                       if member is None or b.member == member)

    def seen(self) -> set[tuple[int, int]]:
        with self.lock:
            return {r for b in self.batches for r in b.records}

    def committed_end(self, partition: int, before: int | None = None) -> int:
        """The group's committed offset of ``partition`` after the successful commits
        before sequence number ``before`` (all when None; 0 when none)."""
        with self.lock:
            ends = [(seq, offset) for seq, _m, p, offset in self.commits
                    if p == partition and (before is None or seq < before)]
        return max(ends)[1] if ends else 0

    def all_committed(self, partitions: int, end: int) -> Callable[[], bool]:
        """A condition: every partition's committed offset is ``end``."""
        return lambda: all(self.committed_end(p) == end for p in range(partitions))

    def first_after(self, partition: int, after: int) -> tuple[str, int] | None:
        """The first (member, offset) processed for ``partition`` after sequence ``after``."""
        with self.lock:
            for b in self.batches:
                if b.seq > after:
                    offsets = [o for p, o in b.records if p == partition]
                    if offsets:
                        return b.member, min(offsets)
        return None

    def failed_commits(self) -> list[str]:
        with self.lock:
            return [f"{b.member}@{b.seq}: {b.error}" for b in self.batches if not b.committed]

    def check_delivery(self, expected: set[tuple[int, int]]) -> None:
        """At least once, and again only after a failed commit (see the class doc)."""
        with self.lock:
            batches = list(self.batches)
            commits = sorted(self.commits)
            violations = list(self.violations)
        # For each (member, partition): commit seqs and the highest offset committed at or
        # after each of them.
        by_key: dict[tuple[str, int], tuple[list[int], list[int]]] = {}
        for seq, member, p, offset in commits:
            seqs, offs = by_key.setdefault((member, p), ([], []))
            seqs.append(seq)
            offs.append(offset)
        for _seqs, offs in by_key.values():
            for i in range(len(offs) - 2, -1, -1):
                offs[i] = max(offs[i], offs[i + 1])

        def covered(member: str, p: int, o: int, seq: int) -> bool:
            seqs, offs = by_key.get((member, p), ([], []))
            i = bisect.bisect_left(seqs, seq)
            return i < len(seqs) and offs[i] > o

        occurrences: dict[tuple[int, int], list[tuple[int, str, bool]]] = defaultdict(list)
        for b in batches:
            for p, o in b.records:
                occurrences[(p, o)].append((b.seq, b.member, covered(b.member, p, o, b.seq)))
        missing = expected - set(occurrences)
        assert not missing, f"{len(missing)} records never processed, e.g. {sorted(missing)[:5]}"
        extra = set(occurrences) - expected
        assert not extra, f"unexpected records {sorted(extra)[:5]}"
        reread = sorted(r for r, occ in occurrences.items()
                        if any(c for _s, _m, c in occ[:-1]))
        assert not reread, (f"{len(reread)} records processed again after a successful "
                            f"commit, e.g. {[(r, occurrences[r]) for r in reread[:3]]}")
        uncovered = sorted(r for r, occ in occurrences.items() if not occ[-1][2])
        assert not uncovered, f"{len(uncovered)} records never committed, e.g. {uncovered[:5]}"
        assert not violations, f"{len(violations)} violations, e.g. {violations[:10]}"


def positions(records: Iterable[tuple[int, int]]) -> dict[int, int]:
    """The next offset to commit per partition after processing ``records``."""
    result: dict[int, int] = {}
    for p, o in records:
        result[p] = max(result.get(p, 0), o + 1)
    return result


# -- exact group requests ------------------------------------------------------------------

def subscription(topics: Iterable[str]) -> bytes:
    """Consumer-protocol subscription metadata (version 0)."""
    return bytes(ConsumerProtocolSubscription(topics=list(topics), user_data=b"")
                 .encode(version=0))


def assignment(topic: str, partitions: Iterable[int]) -> bytes:
    """Consumer-protocol assignment (version 0)."""
    tp = ConsumerProtocolAssignment.TopicPartition(topic=topic, partitions=list(partitions))
    return bytes(ConsumerProtocolAssignment(assigned_partitions=[tp], user_data=b"")
                 .encode(version=0))


class GroupConnection(RawConnection):
    """A raw connection with one method per group request, returning decoded responses."""

    def find_coordinator(self, keys: list[str], version: int) -> Any:
        if version >= 4:
            request = FindCoordinatorRequest[version](key_type=0, coordinator_keys=keys)
        elif version >= 1:
            request = FindCoordinatorRequest[version](key=keys[0], key_type=0)
        else:
            request = FindCoordinatorRequest[version](key=keys[0])
        return self.call(request, version, FindCoordinatorResponse)

    def join(self, group: str, member_id: str = "", *, version: int = 5,
             instance_id: str | None = None, session_ms: int = 10_000,
             rebalance_ms: int = 10_000, topics: tuple[str, ...] = ("t",),
             protocols: tuple[str, ...] = ("range",), metadata: bytes | None = None) -> Any:
        """JoinGroup of the consumer protocol; ``metadata``: each protocol's (by default a
        subscription to ``topics``)."""
        kwargs: dict[str, Any] = {
            "group_id": group, "session_timeout_ms": session_ms, "member_id": member_id,
            "protocol_type": "consumer",
            "protocols": [JoinGroupRequest.JoinGroupRequestProtocol(
                name=name, metadata=subscription(topics) if metadata is None else metadata)
                for name in protocols],
        }
        if version >= 1:
            kwargs["rebalance_timeout_ms"] = rebalance_ms
        if version >= 5:
            kwargs["group_instance_id"] = instance_id
        if version >= 8:
            kwargs["reason"] = None
        return self.call(JoinGroupRequest[version](**kwargs), version, JoinGroupResponse)

    def join_new(self, group: str, *, version: int = 5, **kwargs: Any) -> Any:
        """Join as a new dynamic member, doing the MEMBER_ID_REQUIRED step when it comes."""
        first = self.join(group, "", version=version, **kwargs)
        if first.error_code != MEMBER_ID_REQUIRED:
            return first
        assert first.member_id, "MEMBER_ID_REQUIRED without a member id"
        return self.join(group, first.member_id, version=version, **kwargs)

    def sync(self, group: str, generation: int, member_id: str,
             assignments: dict[str, bytes] | None = None, *, version: int = 3,
             instance_id: str | None = None) -> Any:
        kwargs: dict[str, Any] = {
            "group_id": group, "generation_id": generation, "member_id": member_id,
            "assignments": [SyncGroupRequest.SyncGroupRequestAssignment(
                member_id=m, assignment=a) for m, a in (assignments or {}).items()],
        }
        if version >= 3:
            kwargs["group_instance_id"] = instance_id
        if version >= 5:
            kwargs["protocol_type"] = "consumer"
            kwargs["protocol_name"] = "range"
        return self.call(SyncGroupRequest[version](**kwargs), version, SyncGroupResponse)

    def heartbeat(self, group: str, generation: int, member_id: str, *, version: int = 3,
                  instance_id: str | None = None) -> int:
        kwargs: dict[str, Any] = {"group_id": group, "generation_id": generation,
                                  "member_id": member_id}
        if version >= 3:
            kwargs["group_instance_id"] = instance_id
        answer = self.call(HeartbeatRequest[version](**kwargs), version, HeartbeatResponse)
        return int(answer.error_code)

    def leave(self, group: str, members: list[tuple[str, str | None]], *,
              version: int = 3) -> Any:
        if version < 3:
            assert len(members) == 1
            request = LeaveGroupRequest[version](group_id=group, member_id=members[0][0])
        else:
            request = LeaveGroupRequest[version](group_id=group, members=[
                LeaveGroupRequest.MemberIdentity(member_id=m, group_instance_id=i,
                                                 **({"reason": None} if version >= 5 else {}))
                for m, i in members])
        return self.call(request, version, LeaveGroupResponse)

    def commit(self, group: str, generation: int, member_id: str, topic: str,
               offsets: dict[int, tuple[int, str | None]], *, version: int = 8,
               instance_id: str | None = None, retention_ms: int = -1) -> dict[int, int]:
        """Commit ``{partition: (offset, metadata)}`` (v2-v4: with ``retention_ms`` of the
        request's own, -1 for the broker's); return ``{partition: error}``."""
        part = OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition
        partitions = []
        for p, (offset, metadata) in offsets.items():
            fields: dict[str, Any] = {"partition_index": p, "committed_offset": offset,
                                      "committed_metadata": metadata}
            if version >= 6:
                fields["committed_leader_epoch"] = -1
            partitions.append(part(**fields))
        kwargs: dict[str, Any] = {
            "group_id": group, "generation_id_or_member_epoch": generation,
            "member_id": member_id,
            "topics": [OffsetCommitRequest.OffsetCommitRequestTopic(
                name=topic, partitions=partitions)],
        }
        if 2 <= version <= 4:
            kwargs["retention_time_ms"] = retention_ms
        if version >= 7:
            kwargs["group_instance_id"] = instance_id
        answer = self.call(OffsetCommitRequest[version](**kwargs), version, OffsetCommitResponse)
        assert [t.name for t in answer.topics] == [topic]
        return {p.partition_index: int(p.error_code) for p in answer.topics[0].partitions}

    def fetch_offsets(self, group: str, topic: str, partitions: list[int], *,
                      version: int = 7) -> tuple[int, dict[int, tuple[int, str | None, int]]]:
        """OffsetFetch; return (group error, {partition: (offset, metadata, error)})."""
        if version >= 8:
            group_cls = OffsetFetchRequest.OffsetFetchRequestGroup
            kwargs: dict[str, Any] = {"group_id": group, "topics": [
                group_cls.OffsetFetchRequestTopics(name=topic, partition_indexes=partitions)]}
            request = OffsetFetchRequest[version](groups=[group_cls(**kwargs)],
                                                  require_stable=False)
            answer = self.call(request, version, OffsetFetchResponse)
            assert len(answer.groups) == 1
            grp = answer.groups[0]
            assert grp.group_id == group
            error, topics = int(grp.error_code), grp.topics
        else:
            fields: dict[str, Any] = {"group_id": group, "topics": [
                OffsetFetchRequest.OffsetFetchRequestTopic(name=topic,
                                                           partition_indexes=partitions)]}
            if version >= 7:
                fields["require_stable"] = False
            answer = self.call(OffsetFetchRequest[version](**fields), version,
                               OffsetFetchResponse)
            error = int(answer.error_code) if version >= 2 else 0
            topics = answer.topics
        result: dict[int, tuple[int, str | None, int]] = {}
        for t in topics:
            assert t.name == topic
            for p in t.partitions:
                result[p.partition_index] = (int(p.committed_offset), p.metadata,
                                             int(p.error_code))
        return error, result


def join_in_thread(port: int, group: str, member_id: str = "", **kwargs: Any
                   ) -> tuple[threading.Thread, list[Any]]:
    """Send a JoinGroup on its own connection from a thread (it blocks until the rebalance
    completes); the response lands in the returned list."""
    out: list[Any] = []

    def run() -> None:
        conn = GroupConnection(port, timeout=30)
        try:
            out.append(conn.join(group, member_id, **kwargs))
        except Exception as exc:  # surfaced by the test through ``out``
            out.append(exc)
        finally:
            conn.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


# -- confluent-kafka members driven by interleaved polling --------------------------------

class ConfluentMember:
    """A confluent-kafka consumer in a group that records what it owns and processes, and
    commits synchronously after each processed batch."""

    def __init__(self, name: str, bootstrap: str, group: str, topic: str, ledger: GroupLedger,
                 **conf: object) -> None:
        self.name = name
        self.topic = topic
        self.ledger = ledger
        self.lost: list[tuple[int, ...]] = []
        self.consumer = confluent_kafka.Consumer({
            "bootstrap.servers": bootstrap, "group.id": group, "client.id": name,
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000, "heartbeat.interval.ms": 250,
            "max.poll.interval.ms": 30000, **conf,
        })
        self.retry: dict[int, int] = {}  # failed commit positions, retried when idle
        self.consumer.subscribe([topic], on_assign=self._on_assign,
                                on_revoke=self._on_revoke, on_lost=self._on_lost)

    def _on_assign(self, _consumer: object, partitions: list[confluent_kafka.TopicPartition]
                   ) -> None:
        self.ledger.assigned(self.name, [tp.partition for tp in partitions])

    def _on_revoke(self, _consumer: object, partitions: list[confluent_kafka.TopicPartition]
                   ) -> None:
        for tp in partitions:
            self.retry.pop(tp.partition, None)
        self.ledger.revoked(self.name, [tp.partition for tp in partitions])

    def _on_lost(self, _consumer: object, partitions: list[confluent_kafka.TopicPartition]
                 ) -> None:
        self.lost.append(tuple(tp.partition for tp in partitions))
        for tp in partitions:
            self.retry.pop(tp.partition, None)
        self.ledger.revoked(self.name, [tp.partition for tp in partitions])

    def step(self, max_records: int = 100, timeout: float = 0.02) -> int:
        """Poll once; process and commit what came; return how many records."""
        records: list[tuple[int, int]] = []
        for msg in self.consumer.consume(max_records, timeout):
            error = msg.error()
            assert error is None, f"{self.name}: {error}"
            partition, offset = msg.partition(), msg.offset()
            assert partition is not None and offset is not None, msg
            records.append(self.ledger.read(self.name, partition, offset, msg.value()))
        if not records:
            if self.retry and self._commit(self.retry) == "":
                self.ledger.recommitted(self.name, self.retry)
                self.retry = {}
            return 0
        done = positions(records)
        error_text = self._commit(done)
        if error_text:
            self.retry.update(done)
        else:
            for p in done:
                self.retry.pop(p, None)
        self.ledger.processed(self.name, records, error_text == "", error_text)
        return len(records)

    def _commit(self, offsets: dict[int, int]) -> str:
        """Commit synchronously; return the error ("" when it succeeded)."""
        try:
            result = self.consumer.commit(offsets=[
                confluent_kafka.TopicPartition(self.topic, p, o) for p, o in offsets.items()],
                asynchronous=False)
        except confluent_kafka.KafkaException as exc:
            return str(exc)
        failed = [tp for tp in result or [] if tp.error is not None]
        return str(failed) if failed else ""

    def close(self) -> None:
        self.ledger.leaving(self.name)
        self.consumer.close()


def pump(members: list[ConfluentMember], condition: Callable[[], bool], timeout: float,
         what: str) -> None:
    """Poll every member, each in a thread of its own, until ``condition()`` holds; a
    member checks it after each of its polls, so none runs more than a poll past it.

    One thread stepping the members in turn can stall a rebalance: a member's synchronous
    commit waits behind its JoinGroup on the coordinator's connection (a broker answers a
    connection's requests in order, and a JoinGroup once every member rejoined), while the
    other members, not polled, never rejoin; the join then ends at the rebalance timeout,
    with them expelled."""
    if condition():
        return
    done = threading.Event()
    failures: list[BaseException] = []

    def run(member: ConfluentMember) -> None:
        try:
            while not done.is_set():
                member.step()
                if condition():
                    done.set()
        except BaseException as exc:  # raised in the test's thread below
            failures.append(exc)
            done.set()

    threads = [threading.Thread(target=run, args=(member,), daemon=True,
                                name=f"pump-{member.name}") for member in members]
    for thread in threads:
        thread.start()
    held = done.wait(timeout)
    done.set()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    if not held:
        raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def balanced(ledger: GroupLedger, names: list[str], partitions: int) -> Callable[[], bool]:
    """True once exactly ``names`` own all partitions, evenly and disjointly."""

    def check() -> bool:
        owned = ledger.ownership()
        if sorted(owned) != sorted(names):
            return False
        sizes = [len(owned[n]) for n in names]
        union = set().union(*owned.values())
        return (union == set(range(partitions)) and sum(sizes) == partitions
                and max(sizes) - min(sizes) <= 1)

    return check
