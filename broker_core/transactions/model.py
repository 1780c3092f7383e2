"""Transactional ids and their state, and the records of ``__transaction_state``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import NotRequired, TypedDict


class TxnState(Enum):
    """Transaction states, named as DescribeTransactions names them."""

    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    DEAD = "Dead"


ENDING = (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)


class TxnDocument(TypedDict):
    """A transaction record's value (pairs are JSON arrays)."""

    producerId: int
    epoch: int
    timeoutMs: int
    state: str
    partitions: list[tuple[str, int]]
    groups: list[tuple[str, str]]
    startMs: int
    updateMs: int
    lastProducerId: NotRequired[int]
    """The producer id and epoch before the last InitProducerId bump (KIP-360): absent
    from records written before they were kept, read as -1."""
    lastEpoch: NotRequired[int]


@dataclass(eq=False)
class Txn:
    """One transactional id: its producer id, epoch and current transaction."""

    transactional_id: str
    topic: str
    partition: int
    producer_id: int
    epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    partitions: set[tuple[str, int]] = field(default_factory=set)
    groups: set[tuple[str, str]] = field(default_factory=set)
    start_ms: int = -1
    update_ms: int = 0
    last_producer_id: int = -1
    """The producer id and epoch that the last InitProducerId bumped (-1 when it came from
    a new producer session): its retry, whose answer was lost, gets the current ones
    (KIP-360, Kafka's ``lastProducerEpoch``)."""
    last_epoch: int = -1

    def copy(self) -> Txn:
        """A copy of this state that can be changed without touching it."""
        return replace(self, partitions=set(self.partitions), groups=set(self.groups))

    def to_record(self) -> tuple[bytes, bytes]:
        """Key and value of the transaction's record."""
        document: TxnDocument = {
            "producerId": self.producer_id, "epoch": self.epoch, "timeoutMs": self.timeout_ms,
            "state": self.state.value, "partitions": sorted(self.partitions),
            "groups": sorted(self.groups), "startMs": self.start_ms,
            "updateMs": self.update_ms, "lastProducerId": self.last_producer_id,
            "lastEpoch": self.last_epoch,
        }
        return state_key(self.transactional_id), json.dumps(
            document, separators=(",", ":")).encode()

    @classmethod
    def from_record(cls, transactional_id: str, topic: str, partition: int,
                    value: TxnDocument) -> Txn:
        """Rebuild a transaction from its record."""
        return cls(transactional_id, topic, partition, value["producerId"], value["epoch"],
                   value["timeoutMs"], TxnState(value["state"]),
                   {(t, p) for t, p in value["partitions"]},
                   {(t, g) for t, g in value["groups"]}, value["startMs"], value["updateMs"],
                   value.get("lastProducerId", -1), value.get("lastEpoch", -1))


def state_key(transactional_id: str) -> bytes:
    """The key of an id's records in ``__transaction_state``."""
    return json.dumps({"v": 1, "type": "txn", "id": transactional_id},
                      separators=(",", ":")).encode()


def tombstone(transactional_id: str) -> tuple[bytes, None]:
    """The record that forgets a transactional id."""
    return state_key(transactional_id), None


def decode_key(key: bytes) -> str | None:
    """The transactional id of a record key (None for unknown kinds)."""
    head = json.loads(key)
    return str(head["id"]) if head.get("v") == 1 and head.get("type") == "txn" else None
