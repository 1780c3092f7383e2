"""The partition metadata file: the ordered ledger list and the partition's properties.

``partition.json`` holds, for each ledger, its id, first offset, the next offset after
it, its size, creation time, max batch timestamp (and the base offset of the earliest
batch carrying it), the span of broker timestamps and whether it is sealed and known to
be fsynced; plus the properties ``index`` (the next offset) and ``logStartOffset``. It
is always replaced atomically.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from common.json_types import JsonValue, json_field, json_int

from .fsutil import json_bytes, read_json, write_json_atomically, write_temp

METADATA_FILE = "partition.json"
FORMAT_VERSION = 1


class LedgerJson(TypedDict):
    """One ledger in ``partition.json``."""

    id: int
    firstOffset: int
    nextOffset: int
    size: int
    createdMs: int
    maxTimestamp: int
    maxTimestampOffset: int
    minBrokerTimestamp: int
    maxBrokerTimestamp: int
    sealed: bool
    synced: bool


class PropertiesJson(TypedDict):
    """The partition's properties in ``partition.json``."""

    index: int
    logStartOffset: int


class MetadataJson(TypedDict):
    """The whole ``partition.json`` document."""

    version: int
    properties: PropertiesJson
    ledgers: list[LedgerJson]


@dataclass
class LedgerFacts:
    """What the partition records about one ledger."""

    ledger_id: int
    first_offset: int
    next_offset: int
    size: int = 0
    created_ms: int = 0
    max_timestamp: int = -1
    max_timestamp_offset: int = -1
    """Base offset of the earliest batch with ``max_timestamp``; -1 while empty."""
    min_broker_timestamp: int = -1
    max_broker_timestamp: int = -1
    sealed: bool = False
    """No longer the open ledger (the last ledger is also marked sealed by a clean close)."""
    synced: bool = False
    """All ``size`` bytes were fsynced before this record was written."""

    @property
    def empty(self) -> bool:
        return self.next_offset == self.first_offset

    def note_entry(
        self, base: int, last: int, max_ts: int, broker_ts: int, entry_size: int
    ) -> None:
        """Account for an entry appended (or recovered) at the end of the ledger."""
        if self.max_timestamp_offset < 0 or max_ts > self.max_timestamp:
            self.max_timestamp = max_ts
            self.max_timestamp_offset = base
        if self.min_broker_timestamp < 0 or broker_ts < self.min_broker_timestamp:
            self.min_broker_timestamp = broker_ts
        self.max_broker_timestamp = max(self.max_broker_timestamp, broker_ts)
        self.next_offset = last + 1
        self.size += entry_size

    def to_json(self) -> LedgerJson:
        return {
            "id": self.ledger_id,
            "firstOffset": self.first_offset,
            "nextOffset": self.next_offset,
            "size": self.size,
            "createdMs": self.created_ms,
            "maxTimestamp": self.max_timestamp,
            "maxTimestampOffset": self.max_timestamp_offset,
            "minBrokerTimestamp": self.min_broker_timestamp,
            "maxBrokerTimestamp": self.max_broker_timestamp,
            "sealed": self.sealed,
            "synced": self.synced,
        }

    @classmethod
    def from_json(cls, doc: JsonValue) -> LedgerFacts:
        return cls(
            ledger_id=json_int(json_field(doc, "id")),
            first_offset=json_int(json_field(doc, "firstOffset")),
            next_offset=json_int(json_field(doc, "nextOffset")),
            size=json_int(json_field(doc, "size")),
            created_ms=json_int(json_field(doc, "createdMs")),
            max_timestamp=json_int(json_field(doc, "maxTimestamp")),
            max_timestamp_offset=json_int(json_field(doc, "maxTimestampOffset")),
            min_broker_timestamp=json_int(json_field(doc, "minBrokerTimestamp")),
            max_broker_timestamp=json_int(json_field(doc, "maxBrokerTimestamp")),
            sealed=bool(json_field(doc, "sealed")),
            synced=bool(json_field(doc, "synced")),
        )

    def copy(self) -> LedgerFacts:
        return LedgerFacts(**vars(self))


@dataclass
class PartitionMetadata:
    """The content of ``partition.json``."""

    next_offset: int
    log_start_offset: int
    ledgers: list[LedgerFacts] = field(default_factory=list)

    def to_json(self) -> MetadataJson:
        return {
            "version": FORMAT_VERSION,
            "properties": {"index": self.next_offset, "logStartOffset": self.log_start_offset},
            "ledgers": [facts.to_json() for facts in self.ledgers],
        }

    @classmethod
    def from_json(cls, doc: JsonValue) -> PartitionMetadata:
        if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION:
            raise ValueError("not a partition metadata document of a known version")
        properties = doc["properties"]
        ledgers = doc["ledgers"]
        if not isinstance(ledgers, list):
            raise TypeError("'ledgers' is not a list")
        return cls(
            next_offset=json_int(json_field(properties, "index")),
            log_start_offset=json_int(json_field(properties, "logStartOffset")),
            ledgers=[LedgerFacts.from_json(item) for item in ledgers],
        )


def load_metadata(directory: Path) -> PartitionMetadata | None:
    """Read ``partition.json``; None if absent. ValueError/KeyError if unreadable."""
    try:
        doc = read_json(directory / METADATA_FILE)
    except FileNotFoundError:
        return None
    return PartitionMetadata.from_json(doc)


def store_metadata(directory: Path, metadata: PartitionMetadata, *,
                   durable: bool = True) -> None:
    """Atomically replace ``partition.json`` (``durable``: see ``write_atomically``)."""
    write_json_atomically(directory / METADATA_FILE, metadata.to_json(), durable=durable)


def stage_metadata(directory: Path, metadata: PartitionMetadata) -> Path:
    """``partition.json``'s temp file holding ``metadata``, written but neither fsynced nor
    renamed into place (``fsutil.write_temp``); the temp file's path."""
    return write_temp(directory / METADATA_FILE, json_bytes(metadata.to_json()), durable=False)
