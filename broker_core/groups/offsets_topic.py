"""The records of ``__consumer_offsets``: one per committed offset and one per group, how
a partition's records are replayed into groups, and the snapshot a compaction keeps.

Keys and values are small JSON documents (version 1), read back at start-up; a record
whose value is null (a tombstone) deletes its key. Later records win over earlier ones,
so replaying a partition from its log start rebuilds the state: a transaction's offset
too, which its commit installs only where no later plain offset record of the partition
was written (Kafka's rule). So a snapshot keeps each group's offset records in their
order.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TypedDict

from broker_core.groups.model import CommittedOffset, Group, GroupState, Member
from broker_core.system_topic_index import Record

_VERSION = 1


class MemberDocument(TypedDict):
    """A member inside a group record's value."""

    memberId: str
    groupInstanceId: str | None
    clientId: str
    clientHost: str
    rebalanceTimeoutMs: int
    sessionTimeoutMs: int
    protocols: list[list[str]]
    """[name, base64 metadata] pairs, in the member's order of preference."""
    assignment: str
    """base64"""


class GroupDocument(TypedDict):
    """A group record's value: the group after its last rebalance."""

    protocolType: str | None
    generation: int
    protocol: str | None
    leader: str | None
    members: list[MemberDocument]
    stateTimestamp: int


@dataclass(frozen=True, slots=True)
class OffsetRecord:
    """A committed offset, or its deletion when ``committed`` is None."""

    group_id: str
    topic: str
    partition: int
    committed: CommittedOffset | None


@dataclass(frozen=True, slots=True)
class TxnOffsetRecord:
    """An offset committed inside a transaction, pending until the transaction ends."""

    group_id: str
    producer_id: int
    topic: str
    partition: int
    committed: CommittedOffset


@dataclass(frozen=True, slots=True)
class TxnEndRecord:
    """The end of a transaction: its pending offsets become committed, or are dropped."""

    group_id: str
    producer_id: int
    commit: bool
    producer_epoch: int = -1
    coordinator_epoch: int = -1
    """The epochs of the end (-1: a record from before they were written)."""
    ended_ms: int | None = None
    """When the end was accepted (ms), as the coordinator that wrote it knew it, kept by
    a compaction (None: a record from before it was written)."""


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """A group's membership after a rebalance, or its deletion when ``value`` is None."""

    group_id: str
    value: GroupDocument | None


def _dump(document: Mapping[str, object]) -> bytes:
    return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()


def offset_record(group_id: str, topic: str, partition: int,
                  committed: CommittedOffset | None) -> tuple[bytes, bytes | None]:
    """Key and value of an offset record (value None deletes it)."""
    key = _dump({"v": _VERSION, "type": "offset", "group": group_id, "topic": topic,
                 "partition": partition})
    if committed is None:
        return key, None
    value: dict[str, object] = {"offset": committed.offset,
                                "leaderEpoch": committed.leader_epoch,
                                "metadata": committed.metadata,
                                "commitTimestamp": committed.commit_timestamp}
    if committed.expire_timestamp is not None:
        value["expireTimestamp"] = committed.expire_timestamp
    return key, _dump(value)


def txn_offset_record(group_id: str, producer_id: int, topic: str, partition: int,
                      committed: CommittedOffset) -> tuple[bytes, bytes]:
    """Key and value of a pending transactional offset."""
    key = _dump({"v": _VERSION, "type": "txnOffset", "group": group_id,
                 "producerId": producer_id, "topic": topic, "partition": partition})
    value = offset_record(group_id, topic, partition, committed)[1]
    assert value is not None
    return key, value


def txn_end_record(group_id: str, producer_id: int, commit: bool, producer_epoch: int = -1,
                   coordinator_epoch: int = -1, *, ended_ms: int) -> tuple[bytes, bytes]:
    """Key and value of a transaction's end, for one group, at these producer and
    coordinator epochs, accepted at ``ended_ms``."""
    return (_dump({"v": _VERSION, "type": "txnEnd", "group": group_id,
                   "producerId": producer_id}),
            _dump({"commit": commit, "producerEpoch": producer_epoch,
                   "coordinatorEpoch": coordinator_epoch, "endedMs": ended_ms}))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def group_record(group: Group, deleted: bool = False) -> tuple[bytes, bytes | None]:
    """Key and value of a group record: its generation, protocol, leader and members."""
    key = _dump({"v": _VERSION, "type": "group", "group": group.group_id})
    if deleted:
        return key, None
    members: list[MemberDocument] = [
        {
            "memberId": m.member_id, "groupInstanceId": m.group_instance_id,
            "clientId": m.client_id, "clientHost": m.client_host,
            "rebalanceTimeoutMs": m.rebalance_timeout_ms,
            "sessionTimeoutMs": m.session_timeout_ms,
            "protocols": [[name, _b64(meta)] for name, meta in m.protocols],
            "assignment": _b64(m.assignment),
        }
        for m in group.members.values()
    ]
    document: GroupDocument = {
        "protocolType": group.protocol_type, "generation": group.generation,
        "protocol": group.protocol, "leader": group.leader, "members": members,
        "stateTimestamp": group.state_timestamp,
    }
    return key, _dump(document)


Decoded = OffsetRecord | GroupRecord | TxnOffsetRecord | TxnEndRecord


def decode(key: bytes, value: bytes | None) -> Decoded | None:
    """Read a record back; None for keys of an unknown kind (skipped at replay)."""
    head = json.loads(key)
    if head.get("v") != _VERSION:
        return None
    body = json.loads(value) if value is not None else None
    kind = head["type"]
    if kind in ("offset", "txnOffset"):
        committed = None if body is None else CommittedOffset(
            body["offset"], body["leaderEpoch"], body["metadata"], body["commitTimestamp"],
            expire_timestamp=body.get("expireTimestamp"))
        if kind == "offset":
            return OffsetRecord(head["group"], head["topic"], head["partition"], committed)
        if committed is None:
            return None
        return TxnOffsetRecord(head["group"], head["producerId"], head["topic"],
                               head["partition"], committed)
    if kind == "txnEnd" and body is not None:
        ended = body.get("endedMs")
        return TxnEndRecord(head["group"], head["producerId"], bool(body["commit"]),
                            int(body.get("producerEpoch", -1)),
                            int(body.get("coordinatorEpoch", -1)),
                            None if ended is None else int(ended))
    if head["type"] == "group":
        return GroupRecord(head["group"], body)
    return None


def restore_group(group: Group, value: GroupDocument) -> None:
    """Fill ``group`` from a group record's value (members come back with no timers)."""
    group.protocol_type = value["protocolType"]
    group.generation = value["generation"]
    group.protocol = value["protocol"]
    group.leader = value["leader"]
    group.state_timestamp = value["stateTimestamp"]
    group.clear_members()
    group.static_members = {}
    for item in value["members"]:
        member = Member(
            member_id=item["memberId"], group_instance_id=item["groupInstanceId"],
            client_id=item["clientId"], client_host=item["clientHost"],
            rebalance_timeout_ms=item["rebalanceTimeoutMs"],
            session_timeout_ms=item["sessionTimeoutMs"],
            protocol_type=value["protocolType"] or "",
            protocols=[(name, base64.b64decode(meta)) for name, meta in item["protocols"]],
            assignment=base64.b64decode(item["assignment"]),
        )
        group.add_member(member)
        if member.group_instance_id is not None:
            group.static_members[member.group_instance_id] = member.member_id
    group.state = GroupState.STABLE if group.members else GroupState.EMPTY


def replay(groups: dict[tuple[str, str], Group], topic: str, partition: int, key: bytes,
           value: bytes | None, now: int) -> None:
    """Apply one record of ``topic``'s ``partition`` to ``groups`` (keyed by topic and id),
    at ``now``.

    A transaction end's time (when its fence may be forgotten:
    :meth:`Group.forget_txn_fences`) is the one its record holds, written by the
    coordinator that accepted it and kept by every compaction, so each broker that replays
    the log decides alike. A record from before that time was written counts as ended
    ``now``: later than it was, so its fence is kept longer, never forgotten early. (Not
    the batch's timestamp: the replay reads no batch header, and the batches of a
    compaction carry the compaction's time, not the end's.)"""
    record = decode(key, value)
    if record is None:
        return
    ident = (topic, record.group_id)
    group = groups.get(ident)
    if group is None:
        group = groups[ident] = Group(record.group_id, topic, partition)
    if isinstance(record, OffsetRecord):
        tp = (record.topic, record.partition)
        if record.committed is None:
            group.offsets.pop(tp, None)
        else:
            group.install(tp, replace(record.committed, position=group.next_position()))
    elif isinstance(record, TxnOffsetRecord):
        group.pending_txn.setdefault(record.producer_id, {})[
            (record.topic, record.partition)] = replace(record.committed,
                                                        position=group.next_position())
    elif isinstance(record, TxnEndRecord):
        group.settle_txn(record.producer_id, record.commit,
                         now if record.ended_ms is None else record.ended_ms,
                         record.producer_epoch, record.coordinator_epoch)
    elif record.value is None:
        del groups[ident]
    else:
        assert value is not None
        restore_group(group, record.value)
        group.record = (key, value)


def snapshot(groups: Iterable[Group], settling: Iterable[Sequence[Record]]) -> list[Record]:
    """What a compaction of one partition keeps: the records of its ``groups`` (the last
    group record each wrote, not its live membership, which may be mid-rebalance; its
    offsets and its pending transactional offsets, in the order of their records, which
    decides what a transaction's commit installs; before them the fences still kept of
    each producer's transaction ends, as an abort that ends nothing, with the epochs and
    the time of its last end) and the batches still ``settling`` (appended, not yet
    durable)."""
    live: list[Record] = []
    for group in groups:
        if group.record is not None:
            live.append(group.record)
        live.extend(txn_end_record(group.group_id, pid, False, fence.producer_epoch,
                                   fence.coordinator_epoch, ended_ms=fence.ended_ms)
                    for pid, fence in group.txn_fences.items())
        ordered = [(committed.position, offset_record(group.group_id, t, p, committed))
                   for (t, p), committed in group.offsets.items()]
        ordered.extend((committed.position,
                        txn_offset_record(group.group_id, pid, t, p, committed))
                       for pid, pending in group.pending_txn.items()
                       for (t, p), committed in pending.items())
        ordered.sort(key=lambda item: item[0])
        live.extend(record for _, record in ordered)
    for batch in settling:
        live.extend(batch)
    return live
