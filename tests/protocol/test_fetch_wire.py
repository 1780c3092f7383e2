"""The hand-written Fetch response matches kafka.protocol's encoding byte for byte."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kafka.protocol.consumer import FetchResponse

from broker_core.codec.fetch_writer import (
    MAX_VERSION,
    MIN_VERSION,
    PartitionAnswer,
    TopicAnswer,
    encode_fetch_response,
)
from broker_core.storage import FileRegion
from tests.storage_helpers import region_bytes

_Topic = FetchResponse.FetchableTopicResponse
_Partition = _Topic.PartitionData


def _library(version: int, topics: list[TopicAnswer], records: dict[int, bytes]) -> bytes:
    """The same response built and encoded by the schema library."""
    return bytes(FetchResponse(
        version=version, throttle_time_ms=0, error_code=0, session_id=0,
        responses=[_Topic(topic=t.name, partitions=[
            _Partition(
                partition_index=p.index, error_code=p.error, high_watermark=p.high_watermark,
                last_stable_offset=p.last_stable_offset, log_start_offset=p.log_start_offset,
                aborted_transactions=None if p.aborted is None else [
                    _Partition.AbortedTransaction(producer_id=pid, first_offset=first)
                    for pid, first in p.aborted],
                preferred_read_replica=-1, records=records[id(p)])
            for p in t.partitions]) for t in topics],
    ).encode())


def _join(parts: list[object]) -> bytes:
    out = bytearray()
    for part in parts:
        out += region_bytes(part) if isinstance(part, FileRegion) else part  # type: ignore[operator]
    return bytes(out)


def _sample(region: FileRegion) -> tuple[list[TopicAnswer], dict[int, bytes]]:
    batch = bytes(range(256)) * 3
    plain = PartitionAnswer(0, 0, 120, 118, 7, None, [memoryview(batch), memoryview(b"xy")])
    committed = PartitionAnswer(3, 0, 2**40, 2**40 - 5, 0, [(1, 2), (2**50, 9)],
                                [region, memoryview(batch)])
    none_aborted = PartitionAnswer(4, 0, 5, 5, 0, [], [])
    failed = PartitionAnswer(1, 1, 55, 55, 10)
    unknown = PartitionAnswer(0, 3)
    topics = [
        TopicAnswer("orders", [plain, failed, committed]),
        TopicAnswer("tenant/ns/ünïcode", [none_aborted]),
        TopicAnswer("missing", [unknown]),
    ]
    records = {id(plain): batch + b"xy", id(committed): region_bytes(region) + batch,
               id(none_aborted): b"", id(failed): b"", id(unknown): b""}
    return topics, records


@pytest.mark.parametrize("version", range(MIN_VERSION, MAX_VERSION + 1))
def test_every_version_matches_the_library(version: int, tmp_path: Path) -> None:
    path = tmp_path / "ledger"
    path.write_bytes(b"<" * 100 + b"region-bytes" * 1000 + b">" * 100)
    fd = os.open(path, os.O_RDONLY)
    region = FileRegion(fd, 100, 12_000, b"")
    os.close(fd)
    topics, records = _sample(region)
    parts, size = encode_fetch_response(version, topics)
    assert region in parts  # the region is passed on, not read
    assert size == sum(len(p) for p in parts)  # type: ignore[arg-type]
    assert _join(parts) == _library(version, topics, records)
    region.release()


@pytest.mark.parametrize("version", [MIN_VERSION, MAX_VERSION])
def test_empty_response(version: int) -> None:
    parts, size = encode_fetch_response(version, [])
    assert _join(parts) == _library(version, [], {}) and size == len(_join(parts))


def test_versions_outside_the_hand_written_range_are_refused() -> None:
    with pytest.raises(ValueError):
        encode_fetch_response(MAX_VERSION + 1, [])
